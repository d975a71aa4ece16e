"""Idem handlers in Python.

A handler is a function of one :class:`Message`, registered with
:func:`handler`. It sees only what is safe to repeat: :func:`collection` for
unique inserts, upserts, reads and deletes of JSON values, :func:`call` for
keyed external calls whose answers Idem journals, and :mod:`log`-style
functions. Returning means done; a value returned (anything
``json.dumps`` takes) is the message's result, stored with its claim and
answered to producers that wait for one (Celery's ``AsyncResult.get()``).
Raise :class:`Permanent` to dead-letter the message at once,
:class:`Transient` (or any other exception) to have it retried with
backoff.

The component is built with componentize-py against Idem's WIT world::

    idem plugin build DIR        # or, by hand:
    componentize-py -d wit -w handler componentize --stub-wasi -p guest-sdk/python app -o app.wasm

and its module must export the world, which importing this package's
:data:`WitWorld` does::

    from idem import WitWorld, Message, handler, collection

    @handler
    def handle(msg: Message) -> None:
        collection("credits").upsert(msg.json()["user"], msg.json()["balance"])
"""

from __future__ import annotations

import json
from typing import Any, Callable, List, Optional, Tuple

import wit_world
from componentize_py_types import Err
from wit_world.imports import effects as _effects
from wit_world.imports import log as _log
from wit_world.imports import store as _store
from wit_world.imports import types as _types

__all__ = [
    "Message",
    "Collection",
    "Transient",
    "Permanent",
    "handler",
    "collection",
    "call",
    "trace",
    "debug",
    "info",
    "warn",
    "error",
    "WitWorld",
]


class Transient(Exception):
    """A failure worth retrying (an API down, a store unreachable)."""


class Permanent(Exception):
    """A failure no retry will fix (invalid input): dead-lettered at once."""


class Message:
    """One message, as delivered and admitted by its claim."""

    def __init__(self, raw: _types.Message) -> None:
        self.id: str = raw.id
        """The producer's message id."""
        self.key: str = raw.key
        """The idempotency key (the message id, or the configured key pointer's value)."""
        self.attempt: int = raw.attempt
        """1 for the first execution."""
        self.headers: List[Tuple[str, str]] = list(raw.headers)
        """Headers as delivered."""
        self.payload: bytes = bytes(raw.payload)
        """The payload as delivered."""

    def json(self) -> Any:
        """The payload parsed as JSON; invalid JSON is a :class:`Permanent` error."""
        try:
            return json.loads(self.payload)
        except ValueError as e:
            raise Permanent(f"payload is not valid JSON: {e}") from None

    def header(self, name: str) -> Optional[str]:
        """The first header called `name` (case-insensitive), if any."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)


def _store_error(e: Err) -> Exception:
    v = e.value
    if isinstance(v, _store.StoreError_Unavailable):
        return Transient(f"store unavailable: {v.value}")
    return Permanent(v.value)


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class Collection:
    """A named collection the plugin was granted; values are JSON."""

    def __init__(self, name: str) -> None:
        self.name = name

    def insert_unique(self, key: str, value: Any) -> Optional[Any]:
        """Insert unless `key` exists: `None` if inserted, else the value it holds."""
        try:
            r = _store.insert_unique(self.name, key, _encode(value))
        except Err as e:
            raise _store_error(e) from None
        if isinstance(r, _store.Inserted_Existed):
            return json.loads(r.value)
        return None

    def upsert(self, key: str, value: Any) -> None:
        """Set `key` to `value`, whatever it held: an absolute assignment."""
        try:
            _store.upsert(self.name, key, _encode(value))
        except Err as e:
            raise _store_error(e) from None

    def get(self, key: str) -> Optional[Any]:
        """The value of `key`, if any."""
        try:
            raw = _store.get(self.name, key)
        except Err as e:
            raise _store_error(e) from None
        return None if raw is None else json.loads(raw)

    def delete(self, key: str) -> bool:
        """Delete `key`; `True` if it existed."""
        try:
            return _store.delete(self.name, key)
        except Err as e:
            raise _store_error(e) from None


def collection(name: str) -> Collection:
    """The collection `name` (granted in `plugins.NAME.collections`)."""
    return Collection(name)


def call(endpoint: str, step: str, request: Any) -> Any:
    """Call a granted endpoint with a JSON request; return its JSON answer.

    `step` names the call within the handler: Idem sends it with an
    Idempotency-Key derived from the message key and the step, journals the
    answer, and replays it on a later attempt instead of calling again.
    """
    try:
        raw = _effects.call(endpoint, step, _encode(request))
    except Err as e:
        v = e.value
        if isinstance(v, _effects.CallError_Transient):
            raise Transient(f"{endpoint}/{step}: {v.value}") from None
        raise Permanent(f"{endpoint}/{step}: {v.value}") from None
    return json.loads(raw)


def _logger(level: _log.Level) -> Callable[[str], None]:
    def log(message: str) -> None:
        _log.log(level, str(message))

    return log


trace = _logger(_log.Level.TRACE)
debug = _logger(_log.Level.DEBUG)
info = _logger(_log.Level.INFO)
warn = _logger(_log.Level.WARN)
error = _logger(_log.Level.ERROR)

_registered: Optional[Callable[[Message], Any]] = None


def handler(fn: Callable[[Message], Any]) -> Callable[[Message], Any]:
    """Register `fn` as the plugin's handler (one per plugin). What it
    returns, unless None, is the message's result, as JSON."""
    global _registered
    _registered = fn
    return fn


class WitWorld(wit_world.WitWorld):
    """The export componentize-py looks for; calls the registered handler."""

    def handle(self, msg: _types.Message) -> Optional[bytes]:
        if _registered is None:
            raise Err(_types.HandlerError_Permanent("no handler registered: decorate a function with @idem.handler"))
        try:
            value = _registered(Message(msg))
            if value is None:
                return None
            try:
                return json.dumps(value).encode()
            except (TypeError, ValueError) as e:
                raise Permanent(f"the handler returned a value JSON cannot hold: {e}") from e
        except Permanent as e:
            raise Err(_types.HandlerError_Permanent(str(e)))
        except Transient as e:
            raise Err(_types.HandlerError_Transient(str(e)))
        except Exception as e:  # noqa: BLE001 - any other failure is retried, as a Rust panic is
            raise Err(_types.HandlerError_Transient(f"{type(e).__name__}: {e}"))
