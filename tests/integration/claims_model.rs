//! The claims fuzz target's model check, run on seeded random sequences in
//! every test run: the libFuzzer target (`cargo xtask fuzz -- SECONDS
//! claims`) explores further, but builds the whole host under its own
//! flags, which CI does not spend its time on.

#[path = "../../fuzz/fuzz_targets/claims_model.rs"]
mod model;

use arbitrary::{Arbitrary, Unstructured};
use rand::{Rng, SeedableRng};

#[test]
fn the_sqlite_claim_store_holds_its_invariants_for_random_sequences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x1de5);
    let mut ops_run = 0;
    for _ in 0..300 {
        let n = rng.random_range(8..=64);
        let mut bytes = vec![0u8; n * 8];
        rng.fill(bytes.as_mut_slice());
        let mut u = Unstructured::new(&bytes);
        let ops: Vec<model::Op> = (0..n).map(|_| model::Op::arbitrary(&mut u).unwrap()).collect();
        ops_run += ops.len();
        model::check(ops);
    }
    // The sequences are long enough to reach past first claims.
    assert!(ops_run > 9_000, "only {ops_run} operations were generated");
}
