//! The Celery task `grant_credits(key, user, balance)` of bench/celery,
//! ported: set a user's credit balance. Served to Celery producers through
//! the `celery` broker, whose payload is the task's call,
//! `{"args": [...], "kwargs": {...}}`; arguments may come either way, as
//! with a Python function.
//!
//! The Celery version guards itself with a claim in Redis; here the host's
//! claim does that, and the upsert is an absolute assignment anyway. It
//! returns the balance it set, which `AsyncResult(id).get()` reads.

use idem_sdk::{permanent, store, Json, Message, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Deserialize)]
struct Call {
    #[serde(default)]
    args: Vec<Value>,
    #[serde(default)]
    kwargs: Map<String, Value>,
}

impl Call {
    /// Argument `index` of the signature, by position or by name.
    fn arg(&self, index: usize, name: &str) -> Result<&Value> {
        self.args
            .get(index)
            .or_else(|| self.kwargs.get(name))
            .ok_or_else(|| permanent(format!("grant_credits() missing argument {name:?}")))
    }
}

/// The task's return value.
#[derive(serde::Serialize)]
struct Granted {
    user: String,
    balance: u64,
}

fn handle(msg: Message) -> Result<Json<Granted>> {
    let call: Call = msg.json()?;
    let user = call
        .arg(1, "user")?
        .as_str()
        .ok_or_else(|| permanent("grant_credits(): user must be a string"))?;
    let balance = call
        .arg(2, "balance")?
        .as_u64()
        .ok_or_else(|| permanent("grant_credits(): balance must be a non-negative integer"))?;
    call.arg(0, "key")?;
    store::collection("credits").upsert(user, &balance)?;
    Ok(Json(Granted {
        user: user.to_string(),
        balance,
    }))
}

idem_sdk::handler!(handle);
