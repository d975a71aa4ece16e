//! The console's page frame and the small pieces pages share: times,
//! durations, payloads, the activity chart.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::Console;
use crate::activity::Minute;

/// The navigation: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/console", "Overview"),
    ("/console/messages", "Messages"),
    ("/console/in-flight", "In flight"),
    ("/console/retrying", "Retrying"),
    ("/console/dead", "Dead letters"),
    ("/console/plugins", "Plugins"),
];

/// A page: the frame around `body`. `refresh` makes the page's script
/// reload its content every few seconds.
pub fn page(c: &Console, active: &str, title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Idem" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body data-refresh=[refresh.then_some("5000")] {
                header {
                    a.brand href="/console" { "Idem" }
                    span.ns { "namespace " code { (c.config.namespace) } }
                    nav {
                        @for (path, label) in NAV {
                            a href=(path) class=[(*path == active).then_some("active")] { (label) }
                        }
                    }
                    @if c.read_only() { span.badge { "read-only" } }
                    @if c.session.is_some() {
                        form.logout method="post" action="/console/logout" {
                            input type="hidden" name="csrf" value=(c.login_csrf);
                            button #logout type="submit" { "Log out" }
                        }
                    }
                }
                main id="content" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The login form.
pub fn login(c: &Console, next: &str, error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Log in · Idem" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body {
                main.login {
                    h1 { "Idem console" }
                    @if let Some(e) = error { p.error { (e) } }
                    form method="post" action="/console/login" {
                        input type="hidden" name="csrf" value=(c.login_csrf);
                        input type="hidden" name="next" value=(next);
                        label { "Token " input type="password" name="token" autofocus; }
                        button type="submit" { "Log in" }
                    }
                }
            }
        }
    }
}

/// A backend could not answer.
pub fn error_page(c: &Console, what: &str, error: &str) -> Markup {
    page(
        c,
        "",
        "Unavailable",
        false,
        html! {
            p.error { "Cannot read " (what) ": " (error) }
            p { "The page answers again once the store or broker does; " a href="/console" { "the overview" } " shows their health." }
        },
    )
}

/// The hidden CSRF field of an action's form.
pub fn csrf(c: &Console) -> Markup {
    html! { input type="hidden" name="csrf" value=(c.csrf); }
}

/// A Unix-ms time as UTC text.
pub fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// A span of milliseconds, short: `850 ms`, `12.4 s`, `3 min 5 s`, `2 h 4 min`.
pub fn span(ms: i64) -> String {
    let (sign, ms) = if ms < 0 { ("-", -ms) } else { ("", ms) };
    let text = match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    };
    format!("{sign}{text}")
}

/// A payload as text: JSON pretty-printed, anything else as (lossy) UTF-8.
pub fn payload(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned())
}

/// The series the chart draws: (label, CSS class, value).
type Series = (&'static str, &'static str, fn(&Minute) -> u64);

const SERIES: [Series; 5] = [
    ("done", "s-done", |m| m.done),
    ("duplicates suppressed", "s-dup", |m| m.duplicates),
    ("busy redeliveries", "s-busy", |m| m.busy),
    ("retries", "s-retry", |m| m.retries),
    ("dead letters", "s-dead", |m| m.dead_lettered),
];

/// The last hour per minute, one line per outcome, as inline SVG.
pub fn chart(minutes: &[Minute]) -> Markup {
    const W: f64 = 600.0;
    const H: f64 = 140.0;
    let top = minutes
        .iter()
        .flat_map(|m| SERIES.iter().map(move |(_, _, f)| f(m)))
        .max()
        .unwrap_or(0)
        .max(1);
    let step = W / (minutes.len().max(2) - 1) as f64;
    let line = |f: fn(&Minute) -> u64| -> String {
        minutes
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{:.1},{:.1}", i as f64 * step, H - f(m) as f64 / top as f64 * (H - 10.0)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        figure.chart {
            svg viewBox=(format!("0 -4 {W} {}", H + 8.0)) preserveAspectRatio="none" role="img" aria-label="messages per minute, last hour" {
                line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                @for (label, class, f) in SERIES {
                    polyline class=(class) points=(line(f)) { title { (label) } }
                }
            }
            figcaption {
                "per minute, last 60 minutes (peak " (top) "): "
                @for (label, class, _) in SERIES { span class=(format!("key {class}")) { (label) } " " }
            }
        }
    }
}

/// An optional value, or a dash.
pub fn or_dash(v: Option<&str>) -> Markup {
    match v {
        Some(v) if !v.is_empty() => html! { (v) },
        _ => html! { (PreEscaped("&mdash;")) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_short() {
        assert_eq!(span(850), "850 ms");
        assert_eq!(span(12_400), "12.4 s");
        assert_eq!(span(185_000), "3 min 5 s");
        assert_eq!(span(7_440_000), "2 h 4 min");
        assert_eq!(span(-1_500), "-1.5 s");
    }

    #[test]
    fn json_payloads_are_pretty_and_others_are_text() {
        assert_eq!(payload(br#"{"a":1}"#), "{\n  \"a\": 1\n}");
        assert_eq!(payload(b"<b>x"), "<b>x");
    }
}
