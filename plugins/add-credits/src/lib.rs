//! Add credits to a user's balance: **deliberately not idempotent**.
//!
//! It reads the balance and writes it back plus the amount, so a second
//! delivery of the same message adds the amount again, and it stamps the
//! attempt number into the record, so every run writes something new.
//! `idem verify` catches both; `grant-credits` shows the idempotent way
//! (the message carries the balance to set, not an amount to add).

use idem_sdk::{store, Message, Result};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Grant {
    user: String,
    amount: u64,
}

#[derive(Serialize, Deserialize, Default)]
struct Account {
    balance: u64,
    last_attempt: u32,
}

fn handle(msg: Message) -> Result<()> {
    let grant: Grant = msg.json()?;
    let accounts = store::collection("accounts");
    let mut account: Account = accounts.get(&grant.user)?.unwrap_or_default();
    account.balance += grant.amount;
    account.last_attempt = msg.attempt;
    accounts.upsert(&grant.user, &account)?;
    Ok(())
}

idem_sdk::handler!(handle);
