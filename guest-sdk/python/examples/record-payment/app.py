"""Record a payment and charge the customer, exactly once (Python).

The payment id is the natural key: `insert_unique` on it makes the record
idempotent, and the charge is a keyed external call, so a redelivery
neither writes a second row nor charges twice. The same plugin as
plugins/record-payment in Rust.
"""

from idem import Message, Permanent, WitWorld, call, collection, handler  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    payment = msg.json()
    previous = collection("payments").insert_unique(payment["payment_id"], payment)
    if previous is not None and previous != payment:
        raise Permanent(f"payment {payment['payment_id']} already recorded with different content")
    receipt = call(
        "payments-api",
        "charge",
        {
            "reference": payment["payment_id"],
            "customer": payment["customer"],
            "amount_cents": payment["amount_cents"],
        },
    )
    collection("receipts").upsert(payment["payment_id"], receipt)
