//! Idem's wire formats, apart from the host so that what reads untrusted
//! bytes can be built and fuzzed on its own: the [`envelope`] every broker
//! carries, and the [`celery`] message protocol (version 2) Celery
//! producers send. The host re-exports both (`idem_host::envelope`,
//! `idem_host::broker::celery::wire`).

pub mod celery;
pub mod envelope;
