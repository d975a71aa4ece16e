//! Celery's Redis result backend: how a task ended, where
//! `AsyncResult(id).get()` reads it. Each result is the JSON document
//! Celery's own workers write, stored with `SET celery-task-meta-<id> … EX`
//! and announced with `PUBLISH` on the same name (a waiting `get()`
//! subscribes there).

use std::time::Duration;

use anyhow::Context;
use redis::aio::ConnectionManager;
use redis::Script;
use serde_json::{json, Value};

use super::wire::format_time;
use crate::broker::BrokerError;

/// How a task ended, as Celery names it.
#[derive(Debug, Clone, PartialEq)]
pub enum Status<'a> {
    /// `SUCCESS`, with the handler's value (JSON; `None` is Python's None).
    Success(Option<&'a [u8]>),
    /// `FAILURE`: dead-lettered, with the reason.
    Failure(&'a str),
    /// `REVOKED`: dropped unrun (expired), with the reason.
    Revoked(&'a str),
    /// `RETRY`: failed, will run again; with the error.
    Retry(&'a str),
}

/// What a result may replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Whatever is stored: the result of the execution holding the
    /// task's claim.
    Always,
    /// Nothing: written only where no result is stored (a duplicate
    /// delivery must not overwrite what its first execution reported).
    Never,
    /// Nothing final (`SUCCESS`, `FAILURE`, `REVOKED`): a failure or a
    /// retry. A message that reuses a finished task's id (a different
    /// payload, an `expires` in the past, an unknown task name, or a key
    /// that no longer finds the task's claim) leaves that task's result as
    /// it was.
    UnlessFinal,
}

impl Overwrite {
    fn arg(self) -> &'static str {
        match self {
            Overwrite::Always => "always",
            Overwrite::Never => "never",
            Overwrite::UnlessFinal => "unless-final",
        }
    }
}

/// One result to write.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The task id.
    pub task_id: &'a str,
    pub status: Status<'a>,
    /// What it may replace.
    pub overwrite: Overwrite,
}

/// Writes results into a Redis result backend.
pub struct RedisResults {
    conn: ConnectionManager,
    expires: Duration,
    write: Script,
}

impl RedisResults {
    /// Connect to the result backend at `url` (`broker.result_backend`).
    pub async fn connect(url: &str, expires: Duration) -> anyhow::Result<Self> {
        let shown = crate::text::redact_url(url);
        let client = redis::Client::open(url)
            .with_context(|| format!("broker.result_backend {shown:?} is not a valid Redis URL (redis://[:password@]host:port[/db])"))?;
        let conn = ConnectionManager::new(client).await.with_context(|| {
            format!("cannot connect to the Celery result backend at broker.result_backend = {shown:?}: is the server running?")
        })?;
        Ok(RedisResults {
            conn,
            expires,
            write: Script::new(include_str!("../../../lua/celery_result.lua")),
        })
    }

    /// Write results (one round trip).
    pub async fn write(&self, reports: &[Report<'_>], now_ms: i64) -> Result<(), BrokerError> {
        if reports.is_empty() {
            return Ok(());
        }
        let mut call = self.write.prepare_invoke();
        call.arg(self.expires.as_secs().max(1));
        for r in reports {
            call.key(format!("celery-task-meta-{}", r.task_id))
                .arg(r.overwrite.arg())
                .arg(meta(r, now_ms));
        }
        call.invoke_async::<()>(&mut self.conn.clone())
            .await
            .map_err(|e| BrokerError::Unavailable(format!("Celery result backend: {e}")))
    }
}

/// The result document Celery's workers write.
fn meta(r: &Report<'_>, now_ms: i64) -> String {
    let failure = |exc_type: &str, exc_module: Value, message: &str| json!({"exc_type": exc_type, "exc_message": [message], "exc_module": exc_module});
    let (status, result, traceback) = match &r.status {
        Status::Success(value) => {
            let value = value.map_or(Value::Null, |v| {
                serde_json::from_slice(v).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(v).into()))
            });
            ("SUCCESS", value, Value::Null)
        }
        Status::Failure(reason) => (
            "FAILURE",
            // No module: Celery makes an exception class of this name.
            failure("IdemDeadLettered", Value::Null, reason),
            Value::String(format!("dead-lettered by Idem: {reason}\n")),
        ),
        Status::Revoked(reason) => (
            "REVOKED",
            failure("TaskRevokedError", json!("celery.exceptions"), reason),
            Value::Null,
        ),
        Status::Retry(reason) => (
            "RETRY",
            failure("IdemTransientError", Value::Null, reason),
            Value::String(format!("retried by Idem: {reason}\n")),
        ),
    };
    json!({
        "status": status, "result": result, "traceback": traceback, "children": [],
        "date_done": format_time(now_ms), "task_id": r.task_id,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_match_celerys() {
        let ok = Report {
            task_id: "t",
            status: Status::Success(Some(b"{\"n\":1}")),
            overwrite: Overwrite::Always,
        };
        let v: Value = serde_json::from_str(&meta(&ok, 0)).unwrap();
        assert_eq!(v["status"], "SUCCESS");
        assert_eq!(v["result"], json!({"n": 1}));
        assert_eq!(v["date_done"], "1970-01-01T00:00:00.000000+00:00");
        let failed = Report {
            status: Status::Failure("permanent error: bad card"),
            ..ok
        };
        let v: Value = serde_json::from_str(&meta(&failed, 0)).unwrap();
        assert_eq!(v["result"]["exc_message"], json!(["permanent error: bad card"]));
        assert_eq!(v["result"]["exc_module"], Value::Null);
    }
}
