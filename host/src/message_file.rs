//! Message files: one message per line, JSON, read by `idem publish --file`
//! and `idem verify --input` alike.
//!
//! ```json
//! {"id": "grant-1", "handler": "grant-credits", "headers": [["trace", "t-1"]], "payload": {"user": "alice", "balance": 100}}
//! ```
//!
//! Only `payload` is required. `payload` is any JSON value (sent as its JSON
//! text) or a string (sent as the string's bytes). `id` defaults to
//! `FILE-line-N`, where N counts from 1 and FILE is the first 12 hex digits
//! of the file's SHA-256: the same file published again unchanged repeats
//! its ids (its messages are duplicates); a changed or another file's do
//! not; `handler` defaults to the command's
//! `--handler` (or, for `verify`, the plugin under test); `headers` is a
//! list of `[name, value]` pairs and defaults to none. Blank lines are
//! skipped.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::envelope::Envelope;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    handler: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(with = "crate::envelope::payload_json")]
    payload: Vec<u8>,
}

/// Read a message file. Lines without a `handler` get `default_handler`;
/// without one either, the line is refused with its number.
pub fn read(file: &Path, default_handler: Option<&str>) -> Result<Vec<Envelope>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    parse(&text, default_handler).with_context(|| format!("in {}", file.display()))
}

/// [`read`] on text already in memory.
pub fn parse(text: &str, default_handler: Option<&str>) -> Result<Vec<Envelope>> {
    let file = hex::encode(&Sha256::digest(text.as_bytes())[..6]);
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let n = i + 1;
        let m: Line = serde_json::from_str(line).with_context(|| {
            format!(
                "line {n}: not a message: expected {{\"payload\": …}} with optional \"id\", \"handler\" and \"headers\" ([[\"name\", \"value\"], …])"
            )
        })?;
        let Some(handler) = m.handler.or_else(|| default_handler.map(str::to_string)) else {
            bail!("line {n}: no handler: add \"handler\": \"PLUGIN\" to the line or pass --handler PLUGIN");
        };
        out.push(Envelope {
            id: m.id.unwrap_or_else(|| format!("{file}-line-{n}")),
            handler,
            headers: m.headers,
            payload: m.payload,
        });
    }
    if out.is_empty() {
        bail!("the file holds no messages");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_payload_is_required() {
        let text =
            "{\"payload\": {\"a\": 1}}\n\n{\"id\": \"m2\", \"handler\": \"h2\", \"headers\": [[\"k\", \"v\"]], \"payload\": \"text\"}\n";
        let got = parse(text, Some("h1")).unwrap();
        assert_eq!(got.len(), 2);
        assert!(
            got[0].id.ends_with("-line-1") && got[0].id.len() == 12 + "-line-1".len(),
            "{}",
            got[0].id
        );
        assert_eq!(got[0].handler, "h1");
        assert_eq!(got[0].payload, br#"{"a":1}"#);
        assert_eq!((got[1].id.as_str(), got[1].handler.as_str()), ("m2", "h2"));
        assert_eq!(got[1].headers, vec![("k".to_string(), "v".to_string())]);
        assert_eq!(got[1].payload, b"text");
    }

    /// Lines without an id in two different files are different messages;
    /// the same file again repeats its ids.
    #[test]
    fn default_ids_name_the_file() {
        let ids = |text: &str| parse(text, Some("h")).unwrap().into_iter().map(|e| e.id).collect::<Vec<_>>();
        let a = ids("{\"payload\": 1}\n{\"payload\": 2}");
        assert_eq!(a, ids("{\"payload\": 1}\n{\"payload\": 2}"));
        let b = ids("{\"payload\": 3}\n{\"payload\": 4}");
        assert!(a.iter().all(|id| !b.contains(id)), "{a:?} {b:?}");
        assert!(a[1].ends_with("-line-2"), "{a:?}");
    }

    #[test]
    fn a_line_without_a_handler_needs_a_default() {
        let err = parse("{\"payload\": 1}", None).unwrap_err().to_string();
        assert!(err.contains("line 1: no handler") && err.contains("--handler"), "{err}");
    }

    #[test]
    fn bad_lines_are_named() {
        let err = parse("{\"payload\": 1}\n{\"paylod\": 1}", Some("h")).unwrap_err();
        assert!(format!("{err:#}").contains("line 2: not a message"), "{err:#}");
        assert!(parse("\n\n", Some("h")).unwrap_err().to_string().contains("no messages"));
    }

    #[test]
    fn the_shipped_verify_inputs_are_publishable() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/verify");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let messages = read(&path, Some("plugin")).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            assert!(!messages.is_empty());
        }
    }
}
