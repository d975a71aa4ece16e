//! What `idem plugin new` writes, and the SDKs and WIT world this binary
//! carries (so a plugin builds against the interface the host implements).

/// Idem's WIT world, file by file.
pub const WIT: &[(&str, &str)] = &[
    ("effects.wit", include_str!("../../../../wit/effects.wit")),
    ("log.wit", include_str!("../../../../wit/log.wit")),
    ("store.wit", include_str!("../../../../wit/store.wit")),
    ("types.wit", include_str!("../../../../wit/types.wit")),
    ("world.wit", include_str!("../../../../wit/world.wit")),
];

/// The Python SDK: the `idem` package.
pub const PYTHON_SDK: &str = include_str!("../../../../guest-sdk/python/idem/__init__.py");
/// The JavaScript SDK and its TypeScript types.
pub const JS_SDK: &str = include_str!("../../../../guest-sdk/js/idem.js");
pub const JS_TYPES: &str = include_str!("../../../../guest-sdk/js/idem.d.ts");
/// The Rust SDK's source; vendored into a new Rust plugin as `idem-sdk/`.
pub const RUST_SDK: &str = include_str!("../../../../guest-sdk/src/lib.rs");

/// The vendored Rust SDK's manifest (the repository's inherits from its
/// workspace).
pub const RUST_SDK_MANIFEST: &str = r#"[package]
name = "idem-sdk"
description = "Write Idem message handlers as WebAssembly components"
version = "0.1.0"
edition = "2021"
license = "Apache-2.0"
publish = false

[dependencies]
wit-bindgen = "0.63"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
anyhow = "1"
"#;

pub const RUST_MANIFEST: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
idem-sdk = { path = "idem-sdk" }
serde = { version = "1", features = ["derive"] }
serde_json = "1"

# Small components: size-optimised, one codegen unit, stripped.
[profile.release]
opt-level = "s"
lto = true
strip = true
codegen-units = 1

# A project of its own, even when created inside another workspace.
[workspace]
"#;

/// The stack size `idem plugin build` links Rust components with.
pub const RUST_CARGO_CONFIG: &str = r#"# A 128 KiB stack instead of Rust's default 1 MiB: the host keeps the first
# pages of each instance's memory resident, so a small stack means a start
# without page faults. Raise it for handlers that recurse deeply.
[target.wasm32-wasip2]
rustflags = ["-C", "link-arg=-zstack-size=131072"]
"#;

pub const RUST_HANDLER: &str = r#"//! {name}: an Idem handler.
//!
//! Idem may run it more than once for the same message, even twice at the
//! same moment. It stays correct because everything it does is safe to
//! repeat: the greeting is stored under the message's natural key with
//! `insert_unique`, so a second run finds it there and changes nothing.

use idem_sdk::{log, store, Message, Result};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Request {
    id: String,
    name: String,
}

#[derive(Serialize, Deserialize)]
struct Greeting {
    id: String,
    text: String,
}

fn handle(msg: Message) -> Result<()> {
    let request: Request = msg.json()?;
    let greeting = Greeting { text: format!("Hello, {}!", request.name), id: request.id };
    store::collection("greetings").insert_unique(&greeting.id, &greeting)?;
    log::info(format!("greeted {}", greeting.id));
    Ok(())
}

idem_sdk::handler!(handle);
"#;

pub const PYTHON_HANDLER: &str = r#""""{name}: an Idem handler.

Idem may run it more than once for the same message, even twice at the same
moment. It stays correct because everything it does is safe to repeat: the
greeting is stored under the message's natural key with `insert_unique`, so
a second run finds it there and changes nothing.
"""

from idem import Message, WitWorld, collection, handler, info  # noqa: F401 (WitWorld is the export)


@handler
def handle(msg: Message) -> None:
    request = msg.json()
    greeting = {"id": request["id"], "text": f"Hello, {request['name']}!"}
    collection("greetings").insert_unique(greeting["id"], greeting)
    info(f"greeted {greeting['id']}")
"#;

pub const JS_HANDLER: &str = r#"// {name}: an Idem handler.
//
// Idem may run it more than once for the same message, even twice at the
// same moment. It stays correct because everything it does is safe to
// repeat: the greeting is stored under the message's natural key with
// insertUnique, so a second run finds it there and changes nothing.

import { collection, handler, info } from "./idem.js";

export const handle = handler((msg) => {
  const request = msg.json();
  const greeting = { id: request.id, text: `Hello, ${request.name}!` };
  collection("greetings").insertUnique(greeting.id, greeting);
  info(`greeted ${greeting.id}`);
});
"#;

/// A configuration that runs the plugin on the embedded SQLite backend.
pub const CONFIG: &str = r#"# {name} on Idem's embedded SQLite backend (no servers needed). Every
# setting is described in Idem's docs/configuration.md. Relative paths are
# resolved against this file's directory.

[database]
path = "idem.db"

[plugins.{name}]
path = "build/{file}.wasm"
collections = ["greetings"]
# The idempotency key: the payload's "id", so two messages asking for the
# same greeting are one message.
key_pointer = "/id"
"#;

/// Messages for `idem verify` and `idem publish --file`.
pub const MESSAGES: &str = r#"{"payload": {"id": "g-1", "name": "Ada"}}
{"payload": {"id": "g-2", "name": "Grace"}}
"#;

pub const README: &str = r#"# {name}

An Idem handler ({lang}). `{entry}` is the handler; edit it, then:

```console
$ idem plugin build                                   # → build/{file}.wasm, checked
$ idem verify {name} --config idem.toml --input messages.jsonl
$ idem run --config idem.toml                         # in one shell
$ idem publish --config idem.toml --handler {name} --payload '{"id": "g-3", "name": "Alan"}'
$ idem stats --config idem.toml
```

`idem verify` runs each message twice in a row and twice at once and
reports any effect that doubled. The handler may use only what its
`[plugins.{name}]` section in `idem.toml` grants: the `greetings`
collection here; add collections and endpoints there as it grows.
"#;

pub const GITIGNORE: &str = "/build/\n/target/\n/idem.db*\n/__pycache__/\n";
