//! Fulfil an order in three keyed steps: charge, reserve stock, send email.
//!
//! Each step is an external call keyed by (message key, step name), so when
//! an attempt dies after the charge, the next attempt gets the charge's
//! journaled response back and carries on with the reservation: it resumes
//! instead of restarting, and the customer is charged once.

use idem_sdk::{effects, log, store, Message, Result};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    order_id: String,
    customer: String,
    email: String,
    sku: String,
    quantity: u32,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize)]
struct Fulfilment {
    status: String,
    charge: serde_json::Value,
    reservation: serde_json::Value,
    email: serde_json::Value,
}

fn handle(msg: Message) -> Result<()> {
    let order: Order = msg.json()?;
    let charge: serde_json::Value = effects::call(
        "payments-api",
        "charge",
        &serde_json::json!({ "reference": order.order_id, "customer": order.customer, "amount_cents": order.amount_cents }),
    )?;
    log::info(format!("order {} charged", order.order_id));
    let reservation: serde_json::Value = effects::call(
        "inventory-api",
        "reserve",
        &serde_json::json!({ "reference": order.order_id, "sku": order.sku, "quantity": order.quantity }),
    )?;
    let email: serde_json::Value = effects::call(
        "email-api",
        "send-email",
        &serde_json::json!({ "reference": order.order_id, "to": order.email, "template": "order-confirmed" }),
    )?;
    store::collection("orders").upsert(
        &order.order_id,
        &Fulfilment {
            status: "fulfilled".into(),
            charge,
            reservation,
            email,
        },
    )?;
    Ok(())
}

idem_sdk::handler!(handle);
