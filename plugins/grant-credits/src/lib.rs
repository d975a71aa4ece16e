//! Set a user's credit balance: an absolute assignment, naturally idempotent.
//!
//! The message carries the balance to set, not an amount to add, so running
//! it twice leaves the same balance as running it once.

use idem_sdk::{store, Message, Result};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Grant {
    user: String,
    balance: u64,
}

fn handle(msg: Message) -> Result<()> {
    let grant: Grant = msg.json()?;
    store::collection("credits").upsert(&grant.user, &grant.balance)?;
    Ok(())
}

idem_sdk::handler!(handle);
