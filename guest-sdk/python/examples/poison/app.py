"""A handler that always fails, to show that poison is bounded (Python).

{"mode": "permanent"} is dead-lettered at once; "transient" is retried until
the attempt limit; "trap" raises an unexpected exception, which Idem retries
like a transient failure.
"""

from idem import Message, Permanent, Transient, WitWorld, handler  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    mode = msg.json()["mode"]
    if mode == "transient":
        raise Transient("poison: this message never succeeds")
    if mode == "trap":
        raise RuntimeError("poison: this message always raises")
    raise Permanent("poison: this message is refused")
