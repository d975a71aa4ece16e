//! Host bindings of the `idem:handler` world (`wit/`), generated once here.
//!
//! Every import is async (store and journal calls do I/O) and trappable (a
//! fenced-out execution is stopped by a trap, never allowed to continue).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "handler",
    imports: { default: async | trappable },
    exports: { default: async },
});

/// The first version of the world, `idem:handler@0.1.0` (`host/wit-0.1.0/`),
/// whose `handle` returns no result. Components built against it still
/// run: their imports are served by the current implementation
/// (`capabilities::legacy`), and their outcome has no result.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        path: "wit-0.1.0",
        world: "handler",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}
