//! The console's read-only pages: overview, messages by key, in flight,
//! retrying, plugins.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::view::{self, or_dash, span, time};
use super::{backend_error, Console};
use crate::claim::{ClaimInfo, ClaimState};
use crate::text::redact_url;

/// How long a page waits for one backend's answer.
const PATIENCE: Duration = Duration::from_secs(3);

/// Rows a list shows.
const ROWS: i64 = 200;

/// `?plugin=…&key=…` (both optional).
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    plugin: String,
    #[serde(default)]
    key: String,
}

impl Filter {
    fn plugin(&self) -> Option<&str> {
        Some(self.plugin.trim()).filter(|p| !p.is_empty())
    }
}

async fn within<T, E: std::fmt::Display>(f: impl std::future::Future<Output = Result<T, E>>) -> Result<T, String> {
    match tokio::time::timeout(PATIENCE, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", PATIENCE.as_secs())),
    }
}

pub async fn overview(State(c): State<Arc<Console>>) -> Response {
    let now = c.backends.clock.now_ms();
    let (stats, hour) = tokio::join!(
        within(crate::app::stats(&c.backends)),
        within(crate::activity::last_hour(c.backends.admin.as_ref(), now))
    );
    let (stats, hour) = match (stats, hour) {
        (Ok(s), Ok(h)) => (s, h),
        (Err(e), _) | (_, Err(e)) => return backend_error(&c, "the counts", e),
    };
    let (broker, claims, data) = tokio::join!(
        within(c.backends.broker.pending()),
        within(c.backends.admin.ping()),
        within(c.backends.data.get("idem-console", "idem-console")),
    );
    let cfg = &c.config;
    let where_ = |url: Option<&str>| match url {
        Some(u) => redact_url(u),
        None => format!("embedded ({})", cfg.database.path.display()),
    };
    let health = [
        (
            "broker",
            format!("{:?}", cfg.broker.kind).to_lowercase(),
            where_(cfg.broker.url.as_deref()),
            broker.err(),
        ),
        (
            "claims",
            format!("{:?}", cfg.claims.kind).to_lowercase(),
            where_(cfg.claims.url.as_deref()),
            claims.err(),
        ),
        (
            "data",
            format!("{:?}", cfg.data.kind).to_lowercase(),
            where_(cfg.data.url.as_deref()),
            data.err(),
        ),
    ];
    let t = &hour.total;
    let body = html! {
        section.cards {
            @for (id, label, n) in [
                ("pending", "pending", stats.pending),
                ("in-flight", "in flight", stats.in_flight),
                ("retrying", "retrying", stats.retry),
                ("done", "done", stats.done),
                ("dead", "dead letters", stats.dead_lettered),
            ] {
                div.card { span.n id=(format!("count-{id}")) { (n) } span.label { (label) } }
            }
        }
        h2 { "Last hour" }
        section.cards {
            @for (id, label, n) in [
                ("done", "done", t.done),
                ("duplicates", "duplicates suppressed", t.duplicates),
                ("busy", "busy redeliveries", t.busy),
                ("retries", "retries", t.retries),
                ("dead", "dead-lettered", t.dead_lettered),
            ] {
                div.card { span.n id=(format!("hour-{id}")) { (n) } span.label { (label) } }
            }
        }
        (view::chart(&hour.minutes))
        h2 { "Health" }
        table {
            tr { th { "" } th { "kind" } th { "where" } th { "answers" } }
            @for (part, kind, at, err) in &health {
                tr {
                    td { (part) } td { (kind) } td { code { (at) } }
                    td { @match err { None => span.ok { "ok" }, Some(e) => span.error { (e) } } }
                }
            }
        }
        h2 { "Handler p99 against the lease" }
        (lease_risk(&c))
    };
    view::page(&c, "/console", "Overview", true, body).into_response()
}

fn lease_risk(c: &Console) -> Markup {
    let Some(live) = &c.live else {
        return html! { p.note { "Durations are kept by each worker: open the console of a running " code { "idem run" } " to see them." } };
    };
    let o = live.worker.options();
    let bound = o.lease.min(o.visibility);
    let mut rows = live.worker.durations().p99s();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    html! {
        p.note { "This worker (" code { (o.owner) } "): lease " (span(o.lease.as_millis() as i64)) ", visibility " (span(o.visibility.as_millis() as i64)) ". A p99 within 80% of the shorter is a warning: slow runs get redelivered while they still run." }
        @if rows.is_empty() { p { "No handler has run here yet." } } @else {
            table {
                tr { th { "plugin" } th { "p99" } th { "of the bound" } }
                @for (plugin, p99) in &rows {
                    @let risk = crate::observe::lease_at_risk(Duration::from_secs_f64(*p99), o.lease, o.visibility);
                    tr class=[risk.then_some("risk")] {
                        td { (plugin) } td { (span((p99 * 1000.0) as i64)) }
                        td { (format!("{:.0}%", p99 / bound.as_secs_f64() * 100.0)) @if risk { " " span.error { "at risk" } } }
                    }
                }
            }
        }
    }
}

fn plugin_select(c: &Console, chosen: Option<&str>, any: bool) -> Markup {
    html! {
        select name="plugin" {
            @if any { option value="" { "every plugin" } }
            @for name in c.config.plugins.keys() {
                option value=(name) selected[chosen == Some(name.as_str())] { (name) }
            }
        }
    }
}

pub async fn messages(State(c): State<Arc<Console>>, Query(f): Query<Filter>) -> Response {
    let search = html! {
        form.search method="get" action="/console/messages" {
            (plugin_select(&c, f.plugin(), false))
            input type="text" name="key" value=(f.key) placeholder="idempotency key" autofocus;
            button type="submit" { "Find" }
        }
    };
    let (Some(plugin), key) = (f.plugin(), f.key.trim()) else {
        return view::page(&c, "/console/messages", "Messages by key", false, search).into_response();
    };
    if key.is_empty() {
        return view::page(&c, "/console/messages", "Messages by key", false, search).into_response();
    }
    let admin = c.backends.admin.as_ref();
    let (claim, journal, dead) = tokio::join!(
        within(admin.claim(plugin, key)),
        within(admin.journal(plugin, key)),
        within(admin.dead_letter_summaries(500)),
    );
    let (claim, journal, dead) = match (claim, journal, dead) {
        (Ok(a), Ok(b), Ok(d)) => (a, b, d),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return backend_error(&c, "the claim store", e),
    };
    let dead: Vec<_> = dead.into_iter().filter(|d| d.plugin == plugin && d.key == key).collect();
    let collections = c.config.plugins.get(plugin).map(|p| p.collections.clone()).unwrap_or_default();
    let mut rows = Vec::new();
    for col in &collections {
        rows.push((col.clone(), within(c.backends.data.get(col, key)).await));
    }
    let now = c.backends.clock.now_ms();
    let body = html! {
        (search)
        h2 { "Claim" }
        @match &claim {
            None => p #no-claim { "No claim for " code { (key) } " of " (plugin) ": never delivered, or removed by retention." },
            Some(cl) => (claim_table(cl, now)),
        }
        h2 { "Journal" }
        @if journal.is_empty() { p { "No external calls journaled." } } @else {
            table {
                tr { th { "step" } th { "request hash" } th { "response" } th { "when" } th { "plugin version" } }
                @for s in &journal {
                    tr {
                        td { (s.step) } td { code { (s.request_hash.get(..16).unwrap_or(&s.request_hash)) } }
                        td { pre { (view::payload(&s.response)) } }
                        td { (or_dash(s.created_at.map(time).as_deref())) }
                        td { (or_dash(s.plugin_version.as_deref())) }
                    }
                }
            }
        }
        h2 { "Data under this key" }
        @if collections.is_empty() { p { (plugin) " has no collections." } } @else {
            table {
                tr { th { "collection" } th { "value" } }
                @for (col, value) in &rows {
                    tr {
                        td { (col) }
                        td { @match value {
                            Ok(Some(v)) => pre { (view::payload(v)) },
                            Ok(None) => span.note { "nothing stored under this key" },
                            Err(e) => span.error { (e) },
                        } }
                    }
                }
            }
        }
        h2 { "Dead letters" }
        @if dead.is_empty() { p { "None (among the newest 500)." } } @else {
            ul #dead-letters {
                @for d in &dead {
                    li { a href=(format!("/console/dead/{}", d.id)) { "#" (d.id) } " " (time(d.dead_at)) ": " (d.reason) }
                }
            }
        }
    };
    view::page(&c, "/console/messages", &format!("{plugin} / {key}"), false, body).into_response()
}

fn claim_table(cl: &ClaimInfo, now: i64) -> Markup {
    html! {
        table.claim {
            tr { th { "state" } td #claim-state { (cl.state.as_str()) } }
            tr { th { "message id" } td { code { (cl.msg_id) } } }
            tr { th { "attempts" } td { (cl.attempts) @if cl.traps > 0 { " (" (cl.traps) " trapped)" } } }
            tr { th { "fence" } td { (cl.fence) } }
            tr { th { "owner" } td { (or_dash(cl.owner.as_deref())) } }
            @if cl.state == ClaimState::Running { tr { th { "lease left" } td { (span(cl.lease_until - now)) } } }
            @if cl.state == ClaimState::Retry { tr { th { "next attempt in" } td { (span(cl.not_before - now)) } } }
            tr { th { "plugin version" } td { (or_dash(cl.plugin_version.as_deref())) } }
            tr { th { "last error" } td { (or_dash(cl.last_error.as_deref())) } }
            tr { th { "first taken" } td { (time(cl.created_at)) } }
            tr { th { "last changed" } td { (time(cl.updated_at)) } }
        }
    }
}

fn key_link(cl: &ClaimInfo) -> Markup {
    let q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("plugin", &cl.plugin)
        .append_pair("key", &cl.key)
        .finish();
    html! { a href=(format!("/console/messages?{q}")) { (cl.key) } }
}

fn filter_form(c: &Console, action: &str, f: &Filter) -> Markup {
    html! {
        form.search method="get" action=(action) {
            (plugin_select(c, f.plugin(), true))
            button type="submit" { "Filter" }
        }
    }
}

pub async fn in_flight(State(c): State<Arc<Console>>, Query(f): Query<Filter>) -> Response {
    let running = match within(c.backends.admin.claims_in(ClaimState::Running, f.plugin(), ROWS)).await {
        Ok(r) => r,
        Err(e) => return backend_error(&c, "the claim store", e),
    };
    let now = c.backends.clock.now_ms();
    let body = html! {
        @if let Some(live) = &c.live {
            p.note { "This worker (" code { (live.worker.options().owner) } ") runs " (live.worker.in_flight()) " now; every worker's running claims:" }
        }
        (filter_form(&c, "/console/in-flight", &f))
        @if running.is_empty() { p { "Nothing is running." } } @else {
            table {
                tr { th { "plugin" } th { "key" } th { "worker" } th { "running for" } th { "lease left" } th { "attempt" } th { "fence" } th { "version" } }
                @for cl in &running {
                    tr class=[(cl.lease_until < now).then_some("risk")] {
                        td { (cl.plugin) } td { (key_link(cl)) } td { (or_dash(cl.owner.as_deref())) }
                        td { (span(now - cl.updated_at)) } td { (span(cl.lease_until - now)) }
                        td { (cl.attempts) } td { (cl.fence) } td { (or_dash(cl.plugin_version.as_deref())) }
                    }
                }
            }
            p.note { "A lease left below zero: its worker stopped extending it; the next delivery takes the claim over." }
        }
    };
    view::page(&c, "/console/in-flight", "In flight", true, body).into_response()
}

pub async fn retrying(State(c): State<Arc<Console>>, Query(f): Query<Filter>) -> Response {
    let waiting = match within(c.backends.admin.claims_in(ClaimState::Retry, f.plugin(), ROWS)).await {
        Ok(r) => r,
        Err(e) => return backend_error(&c, "the claim store", e),
    };
    let now = c.backends.clock.now_ms();
    let body = html! {
        (filter_form(&c, "/console/retrying", &f))
        @if waiting.is_empty() { p { "Nothing is waiting for a retry." } } @else {
            table {
                tr { th { "plugin" } th { "key" } th { "next attempt" } th { "attempts" } th { "last error" } }
                @for cl in &waiting {
                    tr {
                        td { (cl.plugin) } td { (key_link(cl)) }
                        td { @if cl.not_before <= now { "due" } @else { "in " (span(cl.not_before - now)) } }
                        td { (cl.attempts) } td { (or_dash(cl.last_error.as_deref())) }
                    }
                }
            }
        }
    };
    view::page(&c, "/console/retrying", "Retrying", true, body).into_response()
}

pub async fn plugins(State(c): State<Arc<Console>>) -> Response {
    let history = c.live.as_ref().map(|l| l.reloader.history()).unwrap_or_default();
    let body = html! {
        @if c.live.is_none() { p.note { "As configured; a running worker's console shows the versions it loaded." } }
        table {
            tr { th { "plugin" } th { "version" } th { "loaded" } th { "collections" } th { "endpoints" } th { "key" } th { "limits" } }
            @for (name, p) in &c.config.plugins {
                @let loaded = c.live.as_ref().and_then(|l| l.runtime.plugin(name));
                @let limits = c.config.limits_for(name);
                tr {
                    td { (name) br; small { code { (p.path.display()) } } }
                    td { @match &loaded { Some(l) => { code { (l.version) } br; small { (l.world()) } }, None => "—" } }
                    td { (or_dash(loaded.as_ref().map(|l| time(l.loaded_at)).as_deref())) }
                    td { (p.collections.join(", ")) }
                    td { (p.endpoints.join(", ")) }
                    td { (or_dash(p.key_pointer.as_deref().or(Some("message id")))) }
                    td { small {
                        "cpu " (limits.cpu_ms) " ms, wall " (limits.timeout_ms) " ms, memory " (limits.memory_bytes / (1 << 20)) " MiB, payload " (limits.max_payload_bytes / 1024) " KiB"
                    } }
                }
            }
        }
        h2 { "Reloads" }
        @if history.is_empty() { p { "No plugin was reloaded or refused, and no setting waits for a restart, since this worker started." } } @else {
            table {
                tr { th { "when" } th { "what" } }
                @for (at, r) in history.iter().rev() {
                    tr {
                        td { (time(*at)) }
                        td {
                            @for (name, old, new) in &r.swapped { div { (name) ": " (old.as_deref().unwrap_or("none")) " → " (new) } }
                            @for (name, why) in &r.refused { div.error { (name) " refused: " (why) } }
                            @if let Some(why) = &r.config_refused { div.error { "configuration refused: " (why) } }
                            @for setting in &r.needs_restart { div.error { (setting) " changed in the file: not applied until a restart" } }
                        }
                    }
                }
            }
        }
    };
    view::page(&c, "/console/plugins", "Plugins", false, body).into_response()
}
