//! The claim state machine against a model: see `claims_model.rs`. Builds
//! the whole host: `cargo xtask fuzz -- SECONDS claims`.
#![no_main]

#[path = "claims_model.rs"]
mod claims_model;

libfuzzer_sys::fuzz_target!(|ops: Vec<claims_model::Op>| claims_model::check(ops));
