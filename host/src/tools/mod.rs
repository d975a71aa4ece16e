//! Tools that drive the pipeline from outside: the demo, chaos runs,
//! benchmarks and `idem verify`, and the kit they share with the tests.
//! Nothing in the pipeline imports them; what they hook into a pool goes
//! through [`crate::hooks::Hooks`].

pub mod bench;
pub mod chaos;
pub mod demo;
pub mod kit;
pub mod sdk;
pub mod verify;
