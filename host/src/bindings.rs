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
