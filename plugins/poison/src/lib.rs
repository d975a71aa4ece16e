//! A handler that always fails, to show that poison is bounded.
//!
//! Payload `{"mode": "permanent"}` fails permanently (dead-lettered at once),
//! `{"mode": "transient"}` fails transiently (retried until the attempt
//! limit), `{"mode": "trap"}` panics, which traps the instance. A `"why"`
//! is added to a permanent error's text.

use idem_sdk::{permanent, transient, Message, Result};
use serde::Deserialize;

#[derive(Deserialize)]
struct Poison {
    mode: String,
    #[serde(default)]
    why: Option<String>,
}

fn handle(msg: Message) -> Result<()> {
    let poison: Poison = msg.json()?;
    match poison.mode.as_str() {
        "transient" => Err(transient("poison: this message never succeeds")),
        "trap" => panic!("poison: this message always panics"),
        _ => Err(permanent(match poison.why {
            Some(why) => format!("poison: this message is refused: {why}"),
            None => "poison: this message is refused".to_string(),
        })),
    }
}

idem_sdk::handler!(handle);
