//! Validating a delivery before it is claimed: what the broker refused, a
//! missing or unknown handler, an oversized payload, a bad message id or
//! key. The error is the dead letter's reason, saying what to do.

use crate::envelope::{check_key, derive_key, header_cost, printable, Delivery, HEADER_OVERHEAD, MAX_HEADER_BYTES};
use crate::plugin::PluginInfo;

/// The headers a dead letter keeps: the first ones that fit in
/// [`MAX_HEADER_BYTES`] (all of them, unless the message was refused for
/// its headers' size).
pub fn bounded_headers(headers: &[(String, String)]) -> &[(String, String)] {
    let mut total = 0;
    let fit = headers
        .iter()
        .take_while(|h| {
            total += header_cost(h);
            total <= MAX_HEADER_BYTES
        })
        .count();
    &headers[..fit]
}

/// Check a delivery against the plugin its envelope names (`None` if no
/// such plugin is loaded; `loaded` lists those that are) and derive its
/// key. The error is the dead letter's reason.
pub(super) fn check(d: &Delivery, plugin: Option<&PluginInfo>, loaded: impl FnOnce() -> Vec<String>) -> Result<String, String> {
    if let Some(reason) = &d.refused {
        return Err(reason.clone());
    }
    let e = &d.envelope;
    if e.handler.is_empty() {
        return Err(format!(
            "malformed envelope: the delivery names no handler (message id {:?}); publish with `idem publish` or set the idem handler header/field",
            printable(&e.id, 80)
        ));
    }
    let Some(plugin) = plugin else {
        return Err(format!(
            "unknown handler {:?}: no plugin of that name is loaded (loaded: {}); publish to one of them or add it under [plugins]",
            printable(&e.handler, 80),
            loaded().join(", ")
        ));
    };
    if e.payload.len() > plugin.limits.max_payload_bytes {
        return Err(format!(
            "payload of {} bytes exceeds limits.max_payload_bytes = {} of plugin {}",
            e.payload.len(),
            plugin.limits.max_payload_bytes,
            plugin.name
        ));
    }
    let header_bytes: usize = e.headers.iter().map(header_cost).sum();
    if header_bytes > MAX_HEADER_BYTES {
        return Err(format!(
            "headers of {header_bytes} bytes ({} headers, each counted {HEADER_OVERHEAD} bytes more than its name and value) exceed the limit of {MAX_HEADER_BYTES} bytes; carry large data in the payload",
            e.headers.len()
        ));
    }
    check_key("message id", &e.id)?;
    let key = derive_key(e, plugin.key_pointer.as_deref())?;
    check_key("idempotency key", &key)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Envelope, MAX_KEY_BYTES};
    use crate::worker::admit::tests::plugin;

    fn envelope(id: &str, handler: &str, payload: &str) -> Delivery {
        Delivery {
            envelope: Envelope {
                id: id.into(),
                handler: handler.into(),
                headers: Vec::new(),
                payload: payload.as_bytes().to_vec(),
            },
            receipt: "r".into(),
            delivery_count: 1,
            refused: None,
        }
    }

    #[test]
    fn a_delivery_the_broker_refused_is_dead_lettered_with_its_reason() {
        let mut d = envelope("m1", "p", "{}");
        d.refused = Some("Celery message protocol 1 is not supported".into());
        assert_eq!(check(&d, None, loaded), Err("Celery message protocol 1 is not supported".into()));
    }

    #[test]
    fn headers_are_bounded_and_a_long_handler_name_is_cut_in_the_reason() {
        let mut d = envelope("m1", "p", "{}");
        d.envelope.headers = vec![("a".into(), "x".repeat(MAX_HEADER_BYTES - 1 - HEADER_OVERHEAD))];
        assert_eq!(check(&d, Some(&plugin(None, &[])), loaded), Ok("m1".into()));
        d.envelope.headers.push(("b".into(), "y".into()));
        let err = check(&d, Some(&plugin(None, &[])), loaded).unwrap_err();
        assert!(
            err.contains(&format!("{} bytes (2 headers", MAX_HEADER_BYTES + 2 + HEADER_OVERHEAD)),
            "{err}"
        );

        assert_eq!(bounded_headers(&d.envelope.headers).len(), 1, "a dead letter keeps what fits");

        // Empty headers are not free: ten thousand of them are refused.
        let mut d = envelope("m1", "p", "{}");
        d.envelope.headers = vec![(String::new(), String::new()); 10_000];
        let err = check(&d, Some(&plugin(None, &[])), loaded).unwrap_err();
        assert!(err.contains("10000 headers"), "{err}");

        let d = envelope("m1", &"h".repeat(10_000), "{}");
        let err = check(&d, None, loaded).unwrap_err();
        assert!(err.len() < 400 && err.starts_with("unknown handler"), "{err}");
    }

    fn loaded() -> Vec<String> {
        vec!["p".into(), "q".into()]
    }

    #[test]
    fn a_valid_delivery_gets_its_key() {
        assert_eq!(check(&envelope("m1", "p", "{}"), Some(&plugin(None, &[])), loaded), Ok("m1".into()));
        let natural = plugin(Some("/order"), &[]);
        assert_eq!(
            check(&envelope("m1", "p", r#"{"order":"o-7"}"#), Some(&natural), loaded),
            Ok("o-7".into())
        );
    }

    #[test]
    fn bad_input_is_refused_with_a_reason_that_says_what_to_do() {
        let p = plugin(None, &[]);
        let no_handler = check(&envelope("m1", "", "{}"), None, loaded).unwrap_err();
        assert!(no_handler.contains("names no handler"), "{no_handler}");
        let unknown = check(&envelope("m1", "x", "{}"), None, loaded).unwrap_err();
        assert!(
            unknown.contains("unknown handler \"x\"") && unknown.contains("loaded: p, q"),
            "{unknown}"
        );
        let big = check(&envelope("m1", "p", &"x".repeat(33)), Some(&p), loaded).unwrap_err();
        assert!(big.contains("33 bytes exceeds limits.max_payload_bytes = 32"), "{big}");
        assert_eq!(check(&envelope("", "p", "{}"), Some(&p), loaded), Err("message id is empty".into()));
        let nul_key = check(
            &envelope("m1", "p", r#"{"order":"a\u0000b"}"#),
            Some(&plugin(Some("/order"), &[])),
            loaded,
        );
        let nul_key = nul_key.unwrap_err();
        assert!(
            nul_key.starts_with(r#"idempotency key "a\\u{0}b" contains the control character U+0000"#),
            "{nul_key}"
        );
        let long_id = check(&envelope(&"m".repeat(MAX_KEY_BYTES + 1), "p", "{}"), Some(&p), loaded).unwrap_err();
        assert!(long_id.starts_with("message id is 513 bytes long"), "{long_id}");
        let natural = plugin(Some("/order"), &[]);
        let keyless = check(&envelope("m1", "p", "{}"), Some(&natural), loaded).unwrap_err();
        assert!(keyless.contains("no value at /order"), "{keyless}");
    }
}
