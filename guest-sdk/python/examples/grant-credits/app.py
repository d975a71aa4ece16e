"""Set a user's credit balance: an absolute assignment, naturally idempotent.

The same plugin as plugins/grant-credits in Rust.
"""

from idem import Message, WitWorld, collection, handler  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    grant = msg.json()
    collection("credits").upsert(grant["user"], grant["balance"])
