//! `grant-credits` built against the first version of the handler world,
//! `idem:handler@0.1.0` (kept in `host/wit-0.1.0/`), straight on the
//! generated bindings, as a plugin built before 0.2.0 was: the host must
//! keep running it, with no result.

#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../host/wit-0.1.0",
        world: "handler",
    });
}

use bindings::idem::handler::store;
use bindings::idem::handler::types::{HandlerError, Message};
use bindings::Guest;

struct Legacy;

impl Guest for Legacy {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let grant: serde_json::Value =
            serde_json::from_slice(&msg.payload).map_err(|e| HandlerError::Permanent(format!("payload is not JSON: {e}")))?;
        let (Some(user), Some(balance)) = (grant["user"].as_str(), grant["balance"].as_u64()) else {
            return Err(HandlerError::Permanent("want {\"user\", \"balance\"}".into()));
        };
        store::upsert("credits", user, balance.to_string().as_bytes()).map_err(|e| HandlerError::Transient(format!("{e:?}")))
    }
}

bindings::export!(Legacy with_types_in bindings);
