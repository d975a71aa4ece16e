"""Does nothing: the cost of the sandbox and the pipeline alone (Python)."""

from idem import Message, WitWorld, handler  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    pass
