//! Record a payment and charge the customer, exactly once.
//!
//! The payment id is the natural key: `insert-unique` on it makes the record
//! idempotent, and the charge is a keyed external call, so a redelivery
//! neither writes a second row nor charges twice.

use idem_sdk::{effects, permanent, store, store::Inserted, Message, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    payment_id: String,
    customer: String,
    amount_cents: u64,
}

fn handle(msg: Message) -> Result<()> {
    let payment: Payment = msg.json()?;
    if let Inserted::Existed(previous) = store::collection("payments").insert_unique(&payment.payment_id, &payment)? {
        if previous != payment {
            return Err(permanent(format!(
                "payment {} already recorded with different content",
                payment.payment_id
            )));
        }
    }
    let receipt: serde_json::Value = effects::call(
        "payments-api",
        "charge",
        &serde_json::json!({
            "reference": payment.payment_id,
            "customer": payment.customer,
            "amount_cents": payment.amount_cents,
        }),
    )?;
    store::collection("receipts").upsert(&payment.payment_id, &receipt)?;
    Ok(())
}

idem_sdk::handler!(handle);
