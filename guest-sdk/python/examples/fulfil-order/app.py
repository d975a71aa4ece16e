"""Fulfil an order in three keyed steps: charge, reserve stock, send email (Python).

Each step is an external call keyed by (message key, step), so an attempt
that dies after the charge resumes with the reservation on the next attempt,
and the customer is charged once. The same plugin as plugins/fulfil-order
in Rust.
"""

from idem import Message, WitWorld, call, collection, handler, info  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    order = msg.json()
    charge = call(
        "payments-api",
        "charge",
        {"reference": order["order_id"], "customer": order["customer"], "amount_cents": order["amount_cents"]},
    )
    info(f"order {order['order_id']} charged")
    reservation = call(
        "inventory-api",
        "reserve",
        {"reference": order["order_id"], "sku": order["sku"], "quantity": order["quantity"]},
    )
    email = call(
        "email-api",
        "send-email",
        {"reference": order["order_id"], "to": order["email"], "template": "order-confirmed"},
    )
    collection("orders").upsert(
        order["order_id"],
        {"status": "fulfilled", "charge": charge, "reservation": reservation, "email": email},
    )
