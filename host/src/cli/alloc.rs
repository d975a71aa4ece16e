//! The process's allocator.
//!
//! mimalloc rather than the system allocator: every message allocates and
//! frees many small objects on the runtime's worker threads (the store and
//! its instance, the envelope, the clients' buffers), and glibc's allocator
//! spent about a fifth of a worker's CPU on them (docs/BENCHMARKS.md, item
//! 18).

use libmimalloc_sys::{mi_option_set, mi_option_t};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit`, the fifth entry of `mi_option_e` in
/// mimalloc 3.3 (libmimalloc-sys 0.1.49, pinned exactly in Cargo.toml): the
/// crate does not name this option.
const ARENA_EAGER_COMMIT: mi_option_t = 4;

/// Commit arena memory as it is used rather than all at once when an arena
/// is reserved: with mimalloc's default on Linux a worker's peak resident
/// memory on scenario b went from 50 to about 115 MiB; with this, about 60.
/// It runs as a constructor, before `main` and before Rust's first
/// allocation reserves mimalloc's first arena: set first thing in `main`, it
/// came too late for that arena, and the resident memory stayed at 115 MiB.
#[ctor::ctor(unsafe)]
fn configure() {
    // SAFETY: sets one integer option, before `main`, on the only thread.
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
}
