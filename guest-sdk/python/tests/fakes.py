"""Stand-ins for the bindings componentize-py generates from Idem's WIT world."""

from __future__ import annotations

import enum
import sys
import types as pytypes
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple


class Err(Exception):
    """componentize_py_types.Err: a WIT `result` error."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


def _variant(name: str) -> type:
    return dataclass(type(name, (), {"__annotations__": {"value": Any}}))


# idem:handler/types
types = pytypes.ModuleType("wit_world.imports.types")


@dataclass
class Message:
    id: str
    key: str
    attempt: int
    headers: List[Tuple[str, str]]
    payload: bytes


types.Message = Message
types.HandlerError_Transient = _variant("HandlerError_Transient")
types.HandlerError_Permanent = _variant("HandlerError_Permanent")

# idem:handler/store, backed by a dict; `fail_next` makes the next call fail.
store = pytypes.ModuleType("wit_world.imports.store")
store.StoreError_AccessDenied = _variant("StoreError_AccessDenied")
store.StoreError_TooLarge = _variant("StoreError_TooLarge")
store.StoreError_Unavailable = _variant("StoreError_Unavailable")
store.Inserted_Inserted = dataclass(type("Inserted_Inserted", (), {}))
store.Inserted_Existed = _variant("Inserted_Existed")
store.data: Dict[Tuple[str, str], bytes] = {}
store.fail_next: Optional[Any] = None


def _maybe_fail() -> None:
    if store.fail_next is not None:
        e, store.fail_next = store.fail_next, None
        raise Err(e)


def _insert_unique(collection: str, key: str, value: bytes) -> Any:
    _maybe_fail()
    if (collection, key) in store.data:
        return store.Inserted_Existed(store.data[(collection, key)])
    store.data[(collection, key)] = bytes(value)
    return store.Inserted_Inserted()


def _upsert(collection: str, key: str, value: bytes) -> None:
    _maybe_fail()
    store.data[(collection, key)] = bytes(value)


def _get(collection: str, key: str) -> Optional[bytes]:
    _maybe_fail()
    return store.data.get((collection, key))


def _delete(collection: str, key: str) -> bool:
    _maybe_fail()
    return store.data.pop((collection, key), None) is not None


store.insert_unique = _insert_unique
store.upsert = _upsert
store.get = _get
store.delete = _delete

# idem:handler/effects: answers with `answer`, or raises `fail_next`.
effects = pytypes.ModuleType("wit_world.imports.effects")
effects.CallError_AccessDenied = _variant("CallError_AccessDenied")
effects.CallError_Transient = _variant("CallError_Transient")
effects.CallError_Permanent = _variant("CallError_Permanent")
effects.calls: List[Tuple[str, str, bytes]] = []
effects.answer = b"{}"
effects.fail_next = None


def _call(endpoint: str, step: str, request: bytes) -> bytes:
    effects.calls.append((endpoint, step, bytes(request)))
    if effects.fail_next is not None:
        e, effects.fail_next = effects.fail_next, None
        raise Err(e)
    return effects.answer


effects.call = _call

# idem:handler/log: records lines.
log = pytypes.ModuleType("wit_world.imports.log")


class Level(enum.Enum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4


log.Level = Level
log.lines: List[Tuple[Level, str]] = []
log.log = lambda level, message: log.lines.append((level, message))

wit_world = pytypes.ModuleType("wit_world")


class WitWorld:
    """The protocol class componentize-py generates for the world's exports."""


wit_world.WitWorld = WitWorld
imports = pytypes.ModuleType("wit_world.imports")
imports.types, imports.store, imports.effects, imports.log = types, store, effects, log
wit_world.imports = imports
cpt = pytypes.ModuleType("componentize_py_types")
cpt.Err = Err

sys.modules.update(
    {
        "wit_world": wit_world,
        "wit_world.imports": imports,
        "wit_world.imports.types": types,
        "wit_world.imports.store": store,
        "wit_world.imports.effects": effects,
        "wit_world.imports.log": log,
        "componentize_py_types": cpt,
    }
)


def reset() -> None:
    """Forget every stored value, call, log line and scheduled failure."""
    store.data.clear()
    store.fail_next = None
    effects.calls.clear()
    effects.answer = b"{}"
    effects.fail_next = None
    log.lines.clear()
