"""Set a user's credit balance: an absolute assignment, naturally idempotent.

The same plugin as plugins/grant-credits in Rust, and it returns the grant
it applied: the message's result, stored with its claim.
"""

from idem import Message, WitWorld, collection, handler  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> dict:
    grant = msg.json()
    collection("credits").upsert(grant["user"], grant["balance"])
    return {"user": grant["user"], "balance": grant["balance"]}
