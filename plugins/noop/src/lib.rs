//! Accept every message and do nothing: the benchmarks' measure of what the
//! pipeline and the sandbox cost on their own.
//!
//! With the header `op: get` it reads one key of the `bench` collection,
//! which measures one host call through the store interface.

use idem_sdk::{store, Message, Result};

fn handle(msg: Message) -> Result<()> {
    if msg.headers.iter().any(|(k, v)| k == "op" && v == "get") {
        store::collection("bench").get_bytes("k")?;
    }
    Ok(())
}

idem_sdk::handler!(handle);
