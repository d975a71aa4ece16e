//! `idem:handler/log`: the handler's lines in the host's log, tagged with
//! plugin, key and attempt, bounded in size and count.

use tracing::Level;

use super::ExecutionCaps;
use crate::bindings::idem::handler::log as wit_log;
use crate::text::truncate_utf8;

impl wit_log::Host for ExecutionCaps {
    async fn log(&mut self, level: wit_log::Level, message: String) -> wasmtime::Result<()> {
        self.enter_host()?;
        self.write_log(level, message);
        self.leave_host();
        Ok(())
    }
}

impl ExecutionCaps {
    fn write_log(&mut self, level: wit_log::Level, message: String) {
        let limits = &self.plugin.limits;
        if self.log_lines >= limits.max_log_lines {
            self.log_dropped += 1;
            return;
        }
        self.log_lines += 1;
        let message = truncate_utf8(message, limits.max_log_line_bytes);
        let (plugin, key, attempt) = (&self.plugin.name, &self.exec.key, self.exec.attempt);
        macro_rules! emit {
            ($lvl:expr) => {
                tracing::event!(target: "idem::plugin", $lvl, plugin = %plugin, key = %key, attempt, "{message}")
            };
        }
        match level {
            wit_log::Level::Trace => emit!(Level::TRACE),
            wit_log::Level::Debug => emit!(Level::DEBUG),
            wit_log::Level::Info => emit!(Level::INFO),
            wit_log::Level::Warn => emit!(Level::WARN),
            wit_log::Level::Error => emit!(Level::ERROR),
        }
    }
}
