//! Celery's message protocol, version 2, as kombu's Redis transport lays it
//! out: a JSON envelope `{"body", "content-encoding", "content-type",
//! "headers", "properties"}` whose body (base64) is the JSON array
//! `[args, kwargs, embed]`. What a handler sees of a task is the payload
//! `{"args": [...], "kwargs": {...}}` and the headers `celery.task`,
//! `celery.id`, `celery.retries` and, when set, `celery.root_id`,
//! `celery.parent_id`, `celery.group`, `celery.eta`, `celery.expires`,
//! `celery.origin`.

use base64::Engine as _;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{json, Map, Value};

/// A task read off the queue, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// The task id (`headers.id`): the message id, and the default key.
    pub id: String,
    /// The task name (`headers.task`), which a plugin's `celery_task` names.
    pub name: String,
    /// `{"args": [...], "kwargs": {...}}`, the handler's payload.
    pub payload: Vec<u8>,
    /// The headers a handler sees (see the module documentation).
    pub headers: Vec<(String, String)>,
    /// Do not run before this time (`eta`, also set by `countdown`), ms.
    pub eta_ms: Option<i64>,
    /// Do not run at or after this time (`expires`), ms.
    pub expires_ms: Option<i64>,
}

/// A message Idem cannot run, and why: it is dead-lettered with the reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Unreadable {
    /// The task id when the message had one.
    pub id: String,
    /// The task name when the message had one.
    pub name: String,
    /// Why, and what to do about it.
    pub reason: String,
}

/// Headers copied to the handler when they hold a value.
const PASSED_HEADERS: &[&str] = &["root_id", "parent_id", "group", "eta", "expires", "origin"];

/// A Celery message's parts, whatever the transport carried them in.
pub struct Parts<'a> {
    /// The message headers (protocol 2 keeps the task's metadata there).
    pub headers: &'a Map<String, Value>,
    /// The `correlation_id` property (the task id, again).
    pub correlation_id: &'a str,
    /// The `content_type` property.
    pub content_type: &'a str,
    /// The body, decoded from the transport's encoding.
    pub body: &'a [u8],
}

/// Read a kombu Redis envelope: JSON whose body is (usually) base64.
pub fn decode(raw: &[u8]) -> Result<Task, Unreadable> {
    let envelope: Map<String, Value> = serde_json::from_slice(raw).map_err(|e| Unreadable {
        id: String::new(),
        name: String::new(),
        reason: format!("not a Celery message: the queue entry is not a kombu JSON envelope ({e})"),
    })?;
    let empty = Map::new();
    let headers = envelope.get("headers").and_then(Value::as_object).unwrap_or(&empty);
    let properties = envelope.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let text = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (correlation_id, content_type) = (text(properties, "correlation_id"), text(&envelope, "content-type"));
    let names = Parts {
        headers,
        correlation_id: &correlation_id,
        content_type: &content_type,
        body: b"",
    };
    names.check_type()?;
    let unreadable = |reason: String| {
        let (id, name) = names.names();
        Unreadable { id, name, reason }
    };
    let decoded;
    let body = match envelope.get("body") {
        Some(Value::String(body)) if text(properties, "body_encoding") == "base64" => {
            decoded = base64::engine::general_purpose::STANDARD
                .decode(body)
                .map_err(|e| unreadable(format!("the task body is not valid base64 ({e})")))?;
            decoded.as_slice()
        }
        Some(Value::String(body)) => body.as_bytes(),
        _ => return Err(unreadable("the envelope has no body".into())),
    };
    read(Parts { body, ..names })
}

impl Parts<'_> {
    /// The task id and name the headers give (empty when missing).
    fn names(&self) -> (String, String) {
        let text = |k: &str| self.headers.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let id = match text("id") {
            id if !id.is_empty() => id,
            _ => self.correlation_id.to_string(),
        };
        (id, text("task"))
    }

    /// Only JSON bodies are read.
    fn check_type(&self) -> Result<(), Unreadable> {
        if self.content_type == "application/json" {
            return Ok(());
        }
        let (id, name) = self.names();
        Err(Unreadable {
            id,
            name,
            reason: format!(
                "the task body is {:?}; Idem reads only JSON: set task_serializer = 'json' (Celery's default) in the producer",
                self.content_type
            ),
        })
    }
}

/// Read a Celery message from its parts.
pub fn read(parts: Parts<'_>) -> Result<Task, Unreadable> {
    let (id, name) = parts.names();
    let headers = parts.headers;
    let unreadable = |id: &str, name: &str, reason: String| Unreadable {
        id: id.to_string(),
        name: name.to_string(),
        reason,
    };
    parts.check_type()?;
    let body: Value = serde_json::from_slice(parts.body).map_err(|e| unreadable(&id, &name, format!("the task body is not JSON ({e})")))?;
    if name.is_empty() {
        let reason = if body.get("task").is_some() {
            "Celery message protocol 1 is not supported: send with task_protocol = 2 (Celery's default since 4.0)".to_string()
        } else {
            "not a Celery task: the message has no task header".to_string()
        };
        let id = body.get("id").and_then(Value::as_str).map_or(id, str::to_string);
        let name = body.get("task").and_then(Value::as_str).unwrap_or("").to_string();
        return Err(unreadable(&id, &name, reason));
    }
    if id.is_empty() {
        return Err(unreadable(&id, &name, "the task has no id (headers.id)".into()));
    }
    let Some([args, kwargs, embed]) = body.as_array().map(Vec::as_slice) else {
        return Err(unreadable(
            &id,
            &name,
            "the task body is not [args, kwargs, embed] (Celery message protocol 2)".into(),
        ));
    };
    if !args.is_array() || !kwargs.is_object() {
        return Err(unreadable(
            &id,
            &name,
            "the task's args are not a list or its kwargs not a mapping".into(),
        ));
    }
    if let Some(used) = ["callbacks", "errbacks", "chain", "chord"]
        .into_iter()
        .find(|k| embed.get(k).is_some_and(|v| !v.is_null() && v != &json!([])))
    {
        return Err(unreadable(
            &id,
            &name,
            format!("the task is part of a canvas ({used}), which Idem does not run: keep canvas workflows on Celery workers, or send the task on its own"),
        ));
    }
    let time = |k: &str| -> Result<Option<i64>, Unreadable> {
        match headers.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => parse_time(s)
                .map(Some)
                .ok_or_else(|| unreadable(&id, &name, format!("headers.{k} = {s:?} is not an ISO 8601 time"))),
            Some(other) => Err(unreadable(&id, &name, format!("headers.{k} = {other} is not an ISO 8601 time"))),
        }
    };
    let (eta_ms, expires_ms) = (time("eta")?, time("expires")?);
    let retries = headers.get("retries").and_then(Value::as_u64).unwrap_or(0);
    let mut passed = vec![
        ("celery.task".to_string(), name.clone()),
        ("celery.id".to_string(), id.clone()),
        ("celery.retries".to_string(), retries.to_string()),
    ];
    for k in PASSED_HEADERS {
        match headers.get(*k) {
            Some(Value::String(s)) => passed.push((format!("celery.{k}"), s.clone())),
            Some(Value::Number(n)) => passed.push((format!("celery.{k}"), n.to_string())),
            _ => {}
        }
    }
    Ok(Task {
        payload: serde_json::to_vec(&json!({"args": args, "kwargs": kwargs})).expect("JSON values serialise"),
        id,
        name,
        headers: passed,
        eta_ms,
        expires_ms,
    })
}

/// Milliseconds since the epoch of an ISO 8601 time as Celery writes it
/// (`2026-12-01T12:36:45.371745+00:00`); one without an offset is UTC.
fn parse_time(s: &str) -> Option<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// A time as Celery writes it.
pub fn format_time(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.6f+00:00")
        .to_string()
}

/// The same envelope with `headers.retries` one higher: a retry as Celery
/// tooling (Flower, `celery inspect`) expects to see it. An envelope that
/// is not a JSON object is returned unchanged.
pub fn with_retry(raw: &[u8]) -> Vec<u8> {
    let Ok(mut envelope) = serde_json::from_slice::<Map<String, Value>>(raw) else {
        return raw.to_vec();
    };
    if let Some(Value::Object(headers)) = envelope.get_mut("headers") {
        let retries = headers.get("retries").and_then(Value::as_u64).unwrap_or(0);
        headers.insert("retries".into(), json!(retries + 1));
    }
    serde_json::to_vec(&envelope).unwrap_or_else(|_| raw.to_vec())
}

/// A task as a Celery producer sends it: headers and a JSON body.
pub struct Message {
    /// The task id (also the `correlation_id` property).
    pub id: String,
    /// The protocol 2 headers, a JSON object.
    pub headers: Value,
    /// `[args, kwargs, embed]`.
    pub body: Vec<u8>,
}

/// A protocol 2 task, as `send_task` would send it: used by `idem publish`
/// and dead-letter replay. A payload of the form `{"args": [...],
/// "kwargs": {...}}` gives the arguments; any other payload is passed as
/// the only positional argument.
pub fn message(id: &str, task: &str, headers: &[(String, String)], payload: &[u8], origin: &str) -> Message {
    let value: Value = serde_json::from_slice(payload).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into()));
    let (args, kwargs) = match &value {
        Value::Object(m) if !m.is_empty() && m.keys().all(|k| k == "args" || k == "kwargs") => (
            m.get("args").cloned().filter(Value::is_array).unwrap_or(json!([])),
            m.get("kwargs").cloned().filter(Value::is_object).unwrap_or(json!({})),
        ),
        _ => (json!([value]), json!({})),
    };
    let header = |k: &str| headers.iter().find(|(name, _)| name == k).map(|(_, v)| v.as_str());
    let retries: u64 = header("celery.retries").and_then(|r| r.parse().ok()).unwrap_or(0);
    let body = json!([args, kwargs, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]);
    Message {
        id: id.to_string(),
        headers: json!({
            "lang": "py", "task": task, "id": id, "shadow": null, "eta": null, "expires": null,
            "group": null, "group_index": null, "retries": retries, "timelimit": [null, null],
            "root_id": header("celery.root_id").unwrap_or(id), "parent_id": header("celery.parent_id"),
            "argsrepr": args.to_string(), "kwargsrepr": kwargs.to_string(), "origin": origin,
            "ignore_result": false, "replaced_task_nesting": 0, "stamped_headers": null, "stamps": {},
        }),
        body: serde_json::to_vec(&body).expect("JSON values serialise"),
    }
}

/// A task as kombu's Redis transport writes it to `queue`.
pub fn encode(message: &Message, queue: &str) -> Vec<u8> {
    let envelope = json!({
        "body": base64::engine::general_purpose::STANDARD.encode(&message.body),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": message.headers,
        "properties": {
            "correlation_id": message.id, "reply_to": "", "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0, "body_encoding": "base64", "delivery_tag": uuid::Uuid::new_v4().to_string(),
        },
    });
    serde_json::to_vec(&envelope).expect("JSON values serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(headers: Value, body: &Value) -> Vec<u8> {
        let body = base64::engine::general_purpose::STANDARD.encode(body.to_string());
        json!({"body": body, "content-encoding": "utf-8", "content-type": "application/json",
               "headers": headers, "properties": {"correlation_id": "c", "body_encoding": "base64"}})
        .to_string()
        .into_bytes()
    }

    fn plain() -> Value {
        json!([[1, "x"], {"a": 1}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}])
    }

    #[test]
    fn a_protocol_2_task_becomes_args_kwargs_and_headers() {
        let raw = envelope(
            json!({"task": "billing.pay", "id": "t-1", "retries": 2, "eta": "2026-12-01T12:36:45.371745+00:00", "expires": null, "root_id": "t-0"}),
            &plain(),
        );
        let t = decode(&raw).unwrap();
        assert_eq!((t.id.as_str(), t.name.as_str()), ("t-1", "billing.pay"));
        assert_eq!(t.payload, br#"{"args":[1,"x"],"kwargs":{"a":1}}"#);
        assert_eq!(t.eta_ms, Some(1_796_128_605_371));
        assert_eq!(t.expires_ms, None);
        assert!(t.headers.contains(&("celery.retries".into(), "2".into())));
        assert!(t.headers.contains(&("celery.root_id".into(), "t-0".into())));
    }

    #[test]
    fn unreadable_messages_say_why() {
        let reason = |raw: &[u8]| decode(raw).unwrap_err().reason;
        assert!(reason(b"{nope").contains("not a kombu JSON envelope"));
        let v1 = envelope(json!({}), &json!({"task": "t", "id": "x", "args": [], "kwargs": {}}));
        assert!(reason(&v1).contains("protocol 1"));
        assert_eq!(decode(&v1).unwrap_err().id, "x");
        let chain = envelope(json!({"task": "t", "id": "x"}), &json!([[], {}, {"chain": [{"task": "u"}]}]));
        assert!(reason(&chain).contains("canvas (chain)"));
        let mut bad = serde_json::from_slice::<Value>(&envelope(json!({"task": "t", "id": "x"}), &plain())).unwrap();
        bad["body"] = json!("***");
        assert!(reason(bad.to_string().as_bytes()).contains("not valid base64"));
        bad["content-type"] = json!("application/x-python-serialize");
        assert!(reason(bad.to_string().as_bytes()).contains("task_serializer"));
        let eta = envelope(json!({"task": "t", "id": "x", "eta": "soon"}), &plain());
        assert!(reason(&eta).contains("headers.eta"));
    }

    #[test]
    fn encode_and_retry_round_trip_through_decode() {
        let headers = vec![("celery.retries".to_string(), "1".to_string())];
        let raw = encode(
            &message("t-9", "billing.pay", &headers, br#"{"args":[7],"kwargs":{"k":"v"}}"#, "idem@h"),
            "celery",
        );
        let t = decode(&raw).unwrap();
        assert_eq!(t.payload, br#"{"args":[7],"kwargs":{"k":"v"}}"#);
        assert!(t.headers.contains(&("celery.retries".into(), "1".into())));
        let again = decode(&with_retry(&raw)).unwrap();
        assert!(again.headers.contains(&("celery.retries".into(), "2".into())));
        let other = decode(&encode(&message("t-8", "n", &[], br#"{"amount":3}"#, "o"), "celery")).unwrap();
        assert_eq!(other.payload, br#"{"args":[{"amount":3}],"kwargs":{}}"#);
    }

    #[test]
    fn times_are_written_as_celery_writes_them() {
        assert_eq!(format_time(1_796_128_605_371), "2026-12-01T12:36:45.371000+00:00");
        assert_eq!(parse_time("2026-12-01T12:36:45.371"), Some(1_796_128_605_371));
    }
}
