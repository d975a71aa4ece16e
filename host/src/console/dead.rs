//! Dead letters in the console: the filtered list, one in full, and replay
//! and purge, which run [`crate::dlq`]'s code, as `idem dlq` does.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;

use super::view::{self, or_dash, time};
use super::{backend_error, csrf_refused, Console, Form};
use crate::claim::DeadLetterSummary;
use crate::dlq::Selection;

/// The dead letters a list reads (newest first).
const NEWEST: i64 = 500;

/// `?plugin=…&reason=…&within=…` (each optional).
#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    plugin: String,
    #[serde(default)]
    reason: String,
    /// `1h`, `24h`, `7d` or empty (any time).
    #[serde(default)]
    within: String,
}

const WITHIN: &[(&str, &str, i64)] = &[
    ("", "any time", 0),
    ("1h", "last hour", 3_600_000),
    ("24h", "last day", 86_400_000),
    ("7d", "last week", 7 * 86_400_000),
];

impl Filter {
    /// The filter as a dead-letter selection, to match the list with.
    fn selection(&self, now: i64) -> Selection {
        let nonempty = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
        Selection {
            all: true,
            ids: Vec::new(),
            plugin: nonempty(&self.plugin),
            reason: nonempty(&self.reason),
            dead_since: WITHIN
                .iter()
                .find(|(k, _, ms)| *k == self.within && *ms > 0)
                .map(|(_, _, ms)| now - ms),
            skip_missing: false,
        }
    }
}

pub async fn list(State(c): State<Arc<Console>>, Query(f): Query<Filter>) -> Response {
    let letters = match c.backends.admin.dead_letter_summaries(NEWEST).await {
        Ok(l) => l,
        Err(e) => return backend_error(&c, "the dead letters", e),
    };
    let selection = f.selection(c.backends.clock.now_ms());
    let shown: Vec<&DeadLetterSummary> = letters.iter().filter(|d| selection.matches(d)).collect();
    let body = html! {
        form.search method="get" action="/console/dead" {
            select name="plugin" {
                option value="" { "every plugin" }
                @for name in c.config.plugins.keys() { option value=(name) selected[f.plugin == *name] { (name) } }
            }
            input type="text" name="reason" value=(f.reason) placeholder="reason contains";
            select name="within" {
                @for (k, label, _) in WITHIN { option value=(k) selected[f.within == *k] { (label) } }
            }
            button type="submit" { "Filter" }
        }
        p #dead-count { (shown.len()) " dead letter(s) match" @if letters.len() as i64 == NEWEST { " (among the newest " (NEWEST) ")" } "." }
        @if c.read_only() {
            (table(&shown, false))
        } @else {
            form #dead-actions method="post" action="/console/dead/replay" {
                (view::csrf(&c))
                // "All matching" means the records this page shows, not
                // whatever matches when the form comes back.
                @for d in &shown { input type="hidden" name="shown" value=(d.id); }
                (table(&shown, true))
                @if !shown.is_empty() {
                div.actions {
                    button type="submit" name="scope" value="selected" { "Replay selected" }
                    button type="submit" name="scope" value="matching" { "Replay all " (shown.len()) " matching" }
                    label.confirm { input type="checkbox" name="confirm" value="yes"; " I mean it (purge)" }
                    button.danger type="submit" formaction="/console/dead/purge" name="scope" value="selected" { "Purge selected" }
                    button.danger type="submit" formaction="/console/dead/purge" name="scope" value="matching" { "Purge all " (shown.len()) " matching" }
                }
                }
            }
        }
    };
    view::page(&c, "/console/dead", "Dead letters", false, body).into_response()
}

pub async fn show(State(c): State<Arc<Console>>, Path(id): Path<i64>) -> Response {
    let d = match c.backends.admin.dead_letter_get(id).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                view::page(&c, "/console/dead", "Not found", false, html! {
                    p { "No dead letter #" (id) ": replayed or purged since, or removed by retention. " a href="/console/dead" { "All dead letters" } }
                }),
            )
                .into_response();
        }
        Err(e) => return backend_error(&c, "the dead letter", e),
    };
    let body = html! {
        table.claim {
            tr { th { "plugin" } td #dead-plugin { (d.plugin) } }
            tr { th { "key" } td #dead-key { (d.key) } }
            tr { th { "message id" } td { code { (d.msg_id) } } }
            tr { th { "reason" } td #dead-reason { (d.reason) } }
            tr { th { "attempts" } td { (d.attempts) } }
            tr { th { "plugin version" } td { (or_dash(d.plugin_version.as_deref())) } }
            tr { th { "first seen" } td { (time(d.first_seen_at)) } }
            tr { th { "died" } td { (time(d.dead_at)) } }
        }
        h2 { "Payload" }
        pre #dead-payload { (view::payload(&d.payload)) }
        h2 { "Headers" }
        @if d.headers.is_empty() { p { "None." } } @else {
            table #dead-headers { @for (k, v) in &d.headers { tr { th { (k) } td { (v) } } } }
        }
        @if !c.read_only() {
            form #dead-actions method="post" action="/console/dead/replay" {
                (view::csrf(&c))
                input type="hidden" name="id" value=(d.id);
                input type="hidden" name="scope" value="selected";
                div.actions {
                    button #replay type="submit" { "Replay" }
                    label.confirm { input type="checkbox" name="confirm" value="yes"; " I mean it (purge)" }
                    button.danger #purge type="submit" formaction="/console/dead/purge" { "Purge" }
                }
            }
        }
    };
    view::page(&c, "/console/dead", &format!("Dead letter #{}", d.id), false, body).into_response()
}

fn table(shown: &[&DeadLetterSummary], boxes: bool) -> Markup {
    html! {
        table #dead-list {
            tr { @if boxes { th { "" } } th { "id" } th { "plugin" } th { "key" } th { "reason" } th { "attempts" } th { "died" } }
            @for d in shown {
                tr {
                    @if boxes { td { input type="checkbox" name="id" value=(d.id); } }
                    td { a href=(format!("/console/dead/{}", d.id)) { "#" (d.id) } }
                    td { (d.plugin) } td { (d.key) } td.reason { (d.reason) } td { (d.attempts) } td { (time(d.dead_at)) }
                }
            }
        }
    }
}

/// The dead letters a replay or purge form names: the ticked ones, or
/// (scope `matching`) every one the page showed; `None` when that is none.
fn chosen(form: &Form) -> Option<Selection> {
    let field = if form.get("scope") == Some("matching") { "shown" } else { "id" };
    let ids: Vec<i64> = form.all(field).filter_map(|v| v.parse().ok()).collect();
    (!ids.is_empty()).then(|| Selection {
        ids,
        skip_missing: true,
        ..Selection::default()
    })
}

/// What the page says of the listed records that were gone when acted on.
fn gone(selected: usize, done: usize) -> Markup {
    let gone = selected.saturating_sub(done);
    html! { @if gone > 0 { p #gone { (gone) " of those listed were already gone (replayed, purged or swept since the page was shown)." } } }
}

fn refused(c: &Console, status: StatusCode, why: &str) -> Response {
    (
        status,
        view::page(
            c,
            "/console/dead",
            "Not done",
            false,
            html! { p.error { (why) } p { a href="/console/dead" { "Back to the dead letters" } } },
        ),
    )
        .into_response()
}

fn done_page(c: &Console, title: &str, lines: Markup) -> Response {
    view::page(
        c,
        "/console/dead",
        title,
        false,
        html! { (lines) p { a href="/console/dead" { "Back to the dead letters" } } },
    )
    .into_response()
}

pub async fn replay(State(c): State<Arc<Console>>, body: Bytes) -> Response {
    if c.read_only() {
        return refused(
            &c,
            StatusCode::FORBIDDEN,
            "The console is read-only ([http] read_only = true): use `idem dlq replay`.",
        );
    }
    let Some(form) = c.form(&body) else {
        return csrf_refused();
    };
    let Some(selection) = chosen(&form) else {
        return refused(&c, StatusCode::BAD_REQUEST, "Nothing selected: tick the dead letters to replay.");
    };
    let selected = selection.ids.len();
    match crate::dlq::replay(&c.backends, &selection).await {
        Ok(done) => {
            tracing::info!(
                count = done.replayed.len(),
                kept = done.kept.len(),
                "console: dead letters replayed"
            );
            done_page(
                &c,
                "Replayed",
                html! {
                    p #replayed { (done.replayed.len()) " dead letter(s) republished." }
                    (gone(selected, done.replayed.len() + done.kept.len()))
                    ul { @for r in &done.replayed {
                        li { "#" (r.id) " " (r.plugin) " / " (r.key) ": message " code { (r.msg_id) } @if !r.claim_revived { " (no dead claim to reset)" } }
                    } }
                    @if !done.kept.is_empty() {
                        p #kept { (done.kept.len()) " kept, not republished:" }
                        ul { @for k in &done.kept { li { a href=(format!("/console/dead/{}", k.id)) { "#" (k.id) } ": " (k.why) } } }
                    }
                },
            )
        }
        Err(e) => refused(
            &c,
            StatusCode::BAD_GATEWAY,
            &format!("Replay stopped: {e:#}. Those listed as replayed before the error were republished."),
        ),
    }
}

pub async fn purge(State(c): State<Arc<Console>>, body: Bytes) -> Response {
    if c.read_only() {
        return refused(
            &c,
            StatusCode::FORBIDDEN,
            "The console is read-only ([http] read_only = true): use `idem dlq purge`.",
        );
    }
    let Some(form) = c.form(&body) else {
        return csrf_refused();
    };
    if form.get("confirm") != Some("yes") {
        return refused(
            &c,
            StatusCode::BAD_REQUEST,
            "Not purged: tick \u{201c}I mean it\u{201d} to confirm; a purged dead letter cannot be replayed.",
        );
    }
    let Some(selection) = chosen(&form) else {
        return refused(&c, StatusCode::BAD_REQUEST, "Nothing selected: tick the dead letters to purge.");
    };
    let selected = selection.ids.len();
    match crate::dlq::purge(&c.backends, &selection).await {
        Ok(n) => {
            tracing::info!(count = n, "console: dead letters purged");
            done_page(
                &c,
                "Purged",
                html! { p #purged { (n) " dead letter(s) deleted." } (gone(selected, n as usize)) },
            )
        }
        Err(e) => refused(&c, StatusCode::BAD_GATEWAY, &format!("Purge failed: {e:#}")),
    }
}
