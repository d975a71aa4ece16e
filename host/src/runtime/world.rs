//! The world a component may import: Idem's `store`, `effects` and `log`,
//! plus the part of WASI a Rust standard library links against, wired to
//! nothing useful (no environment, no arguments, no preopened directories,
//! no sockets, a frozen clock, a random source seeded from the message key).
//! A component that imports anything else is refused at load, naming the
//! import and what to do instead.

use anyhow::Result;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::Engine;

use super::instance::HostState;

/// The WASI interfaces a Rust `wasm32-wasip2` standard library may import,
/// each wired to nothing useful (see the module docs).
const ALLOWED_WASI: &[&str] = &[
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
];

/// Idem's own interfaces.
const ALLOWED_IDEM: &[&str] = &[
    "idem:handler/types",
    "idem:handler/store",
    "idem:handler/effects",
    "idem:handler/log",
];

/// Is this import (e.g. `wasi:sockets/tcp@0.2.6`) one Idem provides?
pub fn import_allowed(name: &str) -> bool {
    let base = name.split('@').next().unwrap_or(name);
    ALLOWED_WASI.contains(&base) || ALLOWED_IDEM.contains(&base)
}

/// Why an import is refused, with what to do instead.
pub(super) fn refusal(name: &str) -> String {
    let base = name.split('@').next().unwrap_or(name);
    let hint = if base.starts_with("wasi:sockets") || base.starts_with("wasi:http") {
        "handlers reach the network only through idem:handler/effects (effects::call), which journals each response; remove the code that opens connections (std::net, an HTTP client)"
    } else {
        "handlers may import only idem:handler/{store,effects,log} and the WASI interfaces the Rust standard library needs; remove the dependency that imports it"
    };
    format!("imports `{name}`, which Idem does not provide: {hint}")
}

/// Every import of a component, as `package/interface@version` names.
pub fn component_imports(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `wasi:io` resources live in the store's resource table.
struct HasIo;

impl wasmtime::component::HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}

/// `wasi:clocks/monotonic-clock` stopped at zero, whose timers are all
/// already due: a guest cannot sleep (`std::thread::sleep`, a poll with a
/// timeout) and hold its slot without spending CPU time; waiting returns at
/// once, and a loop that waits for the clock to move spins into the CPU
/// deadline.
struct StoppedClock<'a>(&'a mut ResourceTable);

impl wasmtime::component::HasData for StoppedClock<'static> {
    type Data<'a> = StoppedClock<'a>;
}

/// A timer that is always due.
struct Due;

#[async_trait::async_trait]
impl wasmtime_wasi_io::poll::Pollable for Due {
    async fn ready(&mut self) {}
}

impl StoppedClock<'_> {
    fn due(&mut self) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi_io::poll::DynPollable>> {
        let timer = self.0.push(Due)?;
        wasmtime_wasi_io::poll::subscribe(self.0, timer)
    }
}

impl wasmtime_wasi::p2::bindings::clocks::monotonic_clock::Host for StoppedClock<'_> {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(0)
    }
    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1_000_000_000)
    }
    fn subscribe_instant(&mut self, _when: u64) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi_io::poll::DynPollable>> {
        self.due()
    }
    fn subscribe_duration(
        &mut self,
        _duration: u64,
    ) -> wasmtime::Result<wasmtime::component::Resource<wasmtime_wasi_io::poll::DynPollable>> {
        self.due()
    }
}

/// Add the allowed WASI subset (see [`ALLOWED_WASI`]) and nothing else.
pub(super) fn add_wasi_subset(linker: &mut Linker<HostState>) -> Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
    use wasmtime_wasi::random::WasiRandom;

    let l = linker;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<HostState, HasIo>(l, HostState::table)?;
    wasmtime_wasi_io::bindings::wasi::io::poll::add_to_linker::<HostState, HasIo>(l, HostState::table)?;
    wasmtime_wasi_io::bindings::wasi::io::streams::add_to_linker::<HostState, HasIo>(l, HostState::table)?;
    clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<HostState, StoppedClock>(l, |s| StoppedClock(s.table()))?;
    filesystem::types::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)?;
    filesystem::preopens::add_to_linker::<HostState, WasiFilesystem>(l, HostState::filesystem)?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi().random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi().random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |t| t.wasi().random())?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    Ok(())
}
