//! The log: `tracing` to standard error, human or JSON lines, filtered by
//! `IDEM_LOG`. A worker process started by `idem run`'s supervisor tags its
//! lines with its index, as several write to the same standard error.

use std::io::IsTerminal;

use clap::ValueEnum;
use idem_host::prefork;
use tracing_subscriber::fmt::format::{self, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// `--log-format`.
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The value of `--log-format` that selects this format.
    pub fn arg(self) -> &'static str {
        match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        }
    }
}

/// Install the subscriber: `IDEM_LOG`, else `default_level` with the noisy
/// crates at `warn`.
pub fn init_tracing(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("IDEM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default_level},sqlx=warn,wasmtime=warn,cranelift=warn")));
    // Colours only for a person at a terminal: a log file or a collector
    // gets plain text (and `NO_COLOR` turns them off anywhere).
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| OneLine(std::io::stderr()))
        .with_ansi(ansi);
    match (format, prefork::supervised()) {
        (LogFormat::Human, None) => builder.init(),
        (LogFormat::Json, None) => builder.json().init(),
        (LogFormat::Human, Some(index)) => builder
            .event_format(Tagged {
                index,
                json: false,
                inner: format::Format::default(),
            })
            .init(),
        (LogFormat::Json, Some(index)) => builder
            .json()
            .event_format(Tagged {
                index,
                json: true,
                inner: format::Format::default().json(),
            })
            .init(),
    }
}

/// Standard error, one event at a time, where an event is always one line:
/// a line break or carriage return inside it (a handler's log text or
/// error, a message id from a producer) is written escaped, so no one can
/// forge a line of the log. The formatter hands over each event whole, its
/// own line end last. JSON lines have none inside to escape.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, event: &[u8]) -> std::io::Result<usize> {
        let body = event.strip_suffix(b"\n").unwrap_or(event);
        if !body.iter().any(|b| matches!(b, b'\n' | b'\r')) {
            self.0.write_all(event)?;
            return Ok(event.len());
        }
        let mut line = Vec::with_capacity(event.len() + 16);
        for &b in body {
            match b {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                b => line.push(b),
            }
        }
        line.push(b'\n');
        self.0.write_all(&line)?;
        Ok(event.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Lines of worker process `index`: `[process K] ` before a human line,
/// `"process":K` first in a JSON object.
struct Tagged<F> {
    index: usize,
    json: bool,
    inner: F,
}

impl<S, N, F> FormatEvent<S, N> for Tagged<F>
where
    F: FormatEvent<S, N>,
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &tracing::Event<'_>) -> std::fmt::Result {
        if !self.json {
            write!(writer, "[process {}] ", self.index)?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"process\":{},{rest}", self.index),
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_line_break_inside_an_event_cannot_forge_a_line() {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let make = move || OneLine(SinkWriter(sink.clone()));
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(make).finish();
        let forged = "ok\n2026-01-01T00:00:00Z ERROR idem::worker: claim store lost\rpurging";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(msg_id = %forged, "{forged}");
            tracing::info!("a plain line");
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 2, "{text:?}");
        assert!(!text.contains('\r'), "{text:?}");
        assert!(
            text.contains("ok\\n2026-01-01T00:00:00Z ERROR") && text.contains("lost\\rpurging"),
            "{text:?}"
        );
        assert!(text.ends_with("a plain line\n"), "{text:?}");
    }

    /// One event through a subscriber with `Tagged` in front of `inner`.
    fn line(json: bool) -> String {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let make = move || SinkWriter(sink.clone());
        let builder = tracing_subscriber::fmt().with_ansi(false).with_writer(make);
        let dispatch = if json {
            let inner = format::Format::default().json();
            tracing::Dispatch::new(builder.json().event_format(Tagged { index: 3, json, inner }).finish())
        } else {
            let inner = format::Format::default();
            tracing::Dispatch::new(builder.event_format(Tagged { index: 3, json, inner }).finish())
        };
        tracing::dispatcher::with_default(&dispatch, || tracing::info!(plugin = "noop", "worker running"));
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct SinkWriter(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SinkWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_worker_process_tags_its_human_lines() {
        let text = line(false);
        assert!(text.starts_with("[process 3] "), "{text}");
        assert!(text.contains("worker running"), "{text}");
    }

    #[test]
    fn a_worker_process_tags_its_json_lines_with_a_field() {
        let text = line(true);
        let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(value["process"], 3, "{text}");
        assert_eq!(value["fields"]["message"], "worker running", "{text}");
        assert_eq!(value["fields"]["plugin"], "noop", "{text}");
    }
}
