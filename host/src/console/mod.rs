//! The web console: what a pool is doing and what it did, and the
//! dead-letter actions, in a browser.
//!
//! Served under `/console` by `idem run` on its `[http] listen` address, and
//! by `idem console` without workers. Pages are rendered on the server
//! (maud escapes every value it splices, so a payload, key, header or
//! reason is text, never markup); the stylesheet and the one small script
//! (live refresh) are compiled into the binary; no page loads anything from
//! elsewhere, and the Content-Security-Policy says so to the browser.
//!
//! Guarding it:
//! - On a loopback address it is open to the machine's users, as
//!   `idem dlq` is, for requests addressed to a loopback name only (DNS
//!   rebinding). On any other address it needs `[http] token`
//!   (`IDEM_HTTP_TOKEN`), given as `Authorization: Bearer TOKEN` or typed
//!   into its login form (which sets an HttpOnly, SameSite=Strict cookie
//!   derived from the token and a key drawn at start); without a configured
//!   token it answers 403 naming the setting.
//! - Every action (replay, purge, login, logout) is a POST carrying a CSRF token
//!   drawn at start (the login form has its own, so the actions' token is
//!   shown only behind the token); one without it, or posted from another
//!   origin, changes nothing (403).
//! - `[http] read_only = true` hides replay and purge and refuses them.
//! - URLs are shown with their credentials redacted.

mod dead;
mod pages;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};

use crate::backend::Backends;
use crate::config::Config;
use crate::reload::Reloader;
use crate::runtime::Runtime;
use crate::worker::Worker;

/// The login cookie's name, before the console's port: browsers send a
/// host's cookies to all its ports, so each console of a multi-process
/// pool keeps its own.
const SESSION_COOKIE: &str = "idem_console";

/// What the console shows and acts on.
pub struct Console {
    backends: Backends,
    config: Config,
    /// The pool serving it, when it runs inside `idem run`.
    live: Option<Live>,
    /// The form token every action must carry (shown only on pages behind
    /// the token).
    csrf: String,
    /// The login form's own form token.
    login_csrf: String,
    /// The cookie value a successful login sets: derived from the token
    /// and a key drawn at start, so it is worthless to another process or
    /// after a restart, and says nothing about the token.
    session: Option<String>,
    /// The login cookie's name (`idem_console_{port}`).
    cookie: String,
    /// Why the console is off, if it is.
    off: Option<String>,
}

/// The running pool a console inside `idem run` also shows.
pub struct Live {
    /// Its runtime (loaded plugins).
    pub runtime: Arc<Runtime>,
    /// Its worker (in flight here, durations).
    pub worker: Arc<Worker>,
    /// Its reloader (reload history).
    pub reloader: Arc<Reloader>,
}

impl Console {
    /// A console over `backends`, listening on `bound`. On an address other
    /// than loopback without `http.token`, the console is off (every page
    /// answers 403 saying why); [`Console::refuse_unguarded`] turns that
    /// into an error for `idem console`.
    pub fn new(backends: Backends, config: Config, live: Option<Live>, bound: SocketAddr) -> Arc<Console> {
        let token = config.http.token.as_ref().map(|t| t.0.clone()).filter(|t| !t.is_empty());
        let off = (!bound.ip().is_loopback() && token.is_none()).then(|| {
            format!(
                "the console is off: it listens on {bound}, which is not a loopback address, and no token is set; \
                 set [http] token (or IDEM_HTTP_TOKEN), or listen on 127.0.0.1"
            )
        });
        let key = random_token();
        Arc::new(Console {
            backends,
            config,
            live,
            csrf: random_token(),
            login_csrf: random_token(),
            session: token.map(|t| hex::encode(Sha256::digest(format!("{key}:session:{t}")))),
            cookie: format!("{SESSION_COOKIE}_{}", bound.port()),
            off,
        })
    }

    /// Refuse (with the reason) a console that would be off.
    pub fn refuse_unguarded(&self) -> anyhow::Result<()> {
        match &self.off {
            Some(why) => anyhow::bail!("{why}"),
            None => Ok(()),
        }
    }

    /// Why the console is off, if it is (logged by `idem run`).
    pub fn off(&self) -> Option<&str> {
        self.off.as_deref()
    }

    fn read_only(&self) -> bool {
        self.config.http.read_only
    }

    /// Does this request carry the token (bearer or login cookie)?
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(session) = &self.session else {
            return true;
        };
        let token = self.config.http.token.as_ref().map(|t| t.0.as_str()).unwrap_or_default();
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| same(given, token));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(name, value)| name == self.cookie && same(value, session));
        bearer || cookie
    }

    /// Check a POSTed action's CSRF token; the parsed form if it holds.
    fn form(&self, body: &Bytes) -> Option<Form> {
        Form::checked(body, &self.csrf)
    }
}

/// The answer to a POST without the page's CSRF token.
fn csrf_refused() -> Response {
    (
        StatusCode::FORBIDDEN,
        "refused: this form was not sent by a console page (missing or wrong CSRF token); reload the page and try again",
    )
        .into_response()
}

/// A POSTed form's fields, in order (names can repeat).
pub(crate) struct Form(Vec<(String, String)>);

impl Form {
    /// The form in `body`, if its `csrf` field is `expected`.
    fn checked(body: &Bytes, expected: &str) -> Option<Form> {
        let form = Form(form_urlencoded::parse(body).into_owned().collect());
        form.get("csrf").is_some_and(|t| same(t, expected)).then_some(form)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0.iter().filter(move |(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Compare two secrets in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// The console's routes, guarded; merge into the HTTP endpoint's router.
pub fn router(console: Arc<Console>) -> Router {
    let guarded = Router::new()
        .route("/console", get(pages::overview))
        .route("/console/messages", get(pages::messages))
        .route("/console/in-flight", get(pages::in_flight))
        .route("/console/retrying", get(pages::retrying))
        .route("/console/plugins", get(pages::plugins))
        .route("/console/dead", get(dead::list))
        .route("/console/dead/{id}", get(dead::show))
        .route("/console/dead/replay", post(dead::replay))
        .route("/console/dead/purge", post(dead::purge))
        .route_layer(axum::middleware::from_fn_with_state(console.clone(), guard));
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", post(logout))
        .route("/console/assets/console.css", get(stylesheet))
        .route("/console/assets/console.js", get(script))
        .merge(guarded)
        .layer(axum::middleware::from_fn_with_state(console.clone(), headers))
        .with_state(console)
}

/// Every console answer: no framing, no sniffing, nothing loaded from
/// elsewhere, no script but the console's own file. Before that, two
/// refusals that keep other web pages out:
/// - without a token (a loopback console), a `Host` other than a loopback
///   name: a page whose domain was re-pointed at 127.0.0.1 (DNS rebinding)
///   would otherwise be same-origin with the console;
/// - a POST whose `Origin` is not the console's own.
async fn headers(State(c): State<Arc<Console>>, req: Request, next: Next) -> Response {
    if let Some(why) = &c.off {
        return (StatusCode::FORBIDDEN, why.clone()).into_response();
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if c.session.is_none() && !loopback_host(&host) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!("refused: the console without a token answers only to loopback names (127.0.0.1, localhost, [::1]), not {host:?}; set [http] token to serve it under another name"),
        )
            .into_response();
    }
    if c.session.is_none() {
        // Loopback is trusted only as the machine itself: a proxy on it
        // would hand the console to whoever reaches the proxy.
        let proxied = ["forwarded", "x-forwarded-for", "x-forwarded-host", "x-real-ip", "via"]
            .into_iter()
            .find(|name| req.headers().contains_key(*name));
        if let Some(name) = proxied {
            return (
                StatusCode::FORBIDDEN,
                format!("refused: this request came through a proxy (it carries {name}) and the console has no token, so anyone who reaches the proxy would reach the console; set [http] token (or IDEM_HTTP_TOKEN)"),
            )
                .into_response();
        }
    }
    if req.method() == Method::POST {
        let origin = req.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok());
        if let Some(origin) = origin.filter(|o| *o != "null") {
            let same_site = origin.split_once("://").is_some_and(|(_, rest)| rest == host);
            if !same_site {
                return (
                    StatusCode::FORBIDDEN,
                    format!("refused: a form posted from {origin:?}, another site than this console's host {host:?} (behind a proxy, pass the browser's Host on, e.g. nginx's proxy_set_header Host $host)"),
                )
                    .into_response();
            }
        }
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

/// Pages and actions need the token (when one is set): a browser asking
/// for a page is sent to the login form, anything else gets 401.
async fn guard(State(c): State<Arc<Console>>, req: Request, next: Next) -> Response {
    if c.authorized(req.headers()) {
        return next.run(req).await;
    }
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if req.method() == Method::GET && wants_html {
        let next_page = req.uri().path_and_query().map(|p| p.as_str()).unwrap_or("/console");
        let target: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("next", next_page)
            .finish();
        return Redirect::to(&format!("/console/login?{target}")).into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"idem console\"")],
        "the console needs its token: send `Authorization: Bearer TOKEN` or log in at /console/login",
    )
        .into_response()
}

async fn login_page(State(c): State<Arc<Console>>, query: axum::extract::Query<Vec<(String, String)>>) -> Response {
    let next = query.0.iter().find(|(k, _)| k == "next").map(|(_, v)| v.clone());
    view::login(&c, safe_next(next.as_deref()), None).into_response()
}

async fn login(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(form) = Form::checked(&body, &c.login_csrf) else {
        return csrf_refused();
    };
    let next = safe_next(form.get("next"));
    let (Some(session), Some(token)) = (&c.session, c.config.http.token.as_ref()) else {
        return Redirect::to(next).into_response();
    };
    if !form.get("token").is_some_and(|given| same(given, &token.0)) {
        return (StatusCode::UNAUTHORIZED, view::login(&c, next, Some("wrong token"))).into_response();
    }
    // Behind a TLS-terminating proxy, keep the cookie off plain HTTP.
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let secure = if https { "; Secure" } else { "" };
    let cookie = format!("{}={session}; Path=/console; HttpOnly; SameSite=Strict{secure}", c.cookie);
    ([(header::SET_COOKIE, cookie)], Redirect::to(next)).into_response()
}

/// Log out: the browser drops the login cookie. Posted with the login
/// form's token, which pages show beside the button (read-only pages hold
/// no action's token).
async fn logout(State(c): State<Arc<Console>>, body: Bytes) -> Response {
    if Form::checked(&body, &c.login_csrf).is_none() {
        return csrf_refused();
    }
    let cookie = format!("{}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0", c.cookie);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/console/login")).into_response()
}

/// Is `host` (a `Host` header, port included or not) a loopback name?
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map(|(n, _)| n).unwrap_or(host),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Where a login may send the browser: console pages only.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n) if n.starts_with("/console") && !n.starts_with("/console/login") && !n.contains("//") => n,
        _ => "/console",
    }
}

async fn stylesheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/console.js"),
    )
}

/// A page's failure to read a backend, as a page (502) naming what failed.
pub(crate) fn backend_error(c: &Console, what: &str, e: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_GATEWAY, view::error_page(c, what, &e.to_string())).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_only_sends_the_browser_to_console_pages() {
        assert_eq!(safe_next(Some("/console/dead?plugin=x")), "/console/dead?plugin=x");
        assert_eq!(safe_next(Some("https://evil.example/")), "/console");
        assert_eq!(safe_next(Some("/console//evil.example")), "/console");
        assert_eq!(safe_next(Some("/console/login")), "/console");
        assert_eq!(safe_next(None), "/console");
    }

    #[test]
    fn only_loopback_names_reach_a_console_without_a_token() {
        for ok in ["127.0.0.1:9464", "localhost", "LOCALHOST:1", "[::1]:9464", "127.0.0.2"] {
            assert!(loopback_host(ok), "{ok}");
        }
        for refused in ["evil.example:9464", "10.0.0.1:9464", "", "[fe80::1]:80", "localhost.evil.example"] {
            assert!(!loopback_host(refused), "{refused}");
        }
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", ""));
    }
}
