//! Envelope decoding never panics, and what decodes round-trips; a Celery
//! queue entry is read or refused with a reason, never a panic.
#![no_main]

use idem_wire::envelope::{derive_key, idempotency_key, payload_hash, Envelope};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(envelope) = serde_json::from_slice::<Envelope>(data) {
        let text = serde_json::to_string(&envelope).expect("an envelope serialises");
        let again: Envelope = serde_json::from_str(&text).expect("a serialised envelope decodes");
        assert_eq!(again.id, envelope.id);
        assert_eq!(again.handler, envelope.handler);
        for pointer in ["/id", "/a/b", "/0", ""] {
            let _ = derive_key(&envelope, Some(pointer).filter(|p| !p.is_empty()));
        }
        let _ = payload_hash(&envelope.payload);
        assert_eq!(idempotency_key("ns", "api", "p", &envelope.id, "s").len(), 32);
    }
    // Raw bytes as a payload under a JSON-pointer key: an error, never a panic.
    let raw = Envelope { id: "m".into(), handler: "h".into(), headers: vec![], payload: data.to_vec() };
    let _ = derive_key(&raw, Some("/payment_id"));
    // The same bytes as an entry of a Celery queue, and as its retry.
    use idem_wire::celery as wire;
    if let Ok(task) = wire::decode(data) {
        assert!(!task.id.is_empty() && !task.name.is_empty());
        let _ = wire::decode(&wire::with_retry(data));
    }
});
