//! The web console in a real browser: headless Chromium (Debian's package,
//! installed by scripts/services.sh) driven over WebDriver by chromedriver,
//! against a real `idem run` pool and an `idem console` process.
//!
//! Each page is screenshotted into `target/console-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::common::{idem, wait_for, wait_until, Env};

/// A chromedriver process and a headless Chromium session on it.
struct Browser {
    client: Client,
    driver: Child,
    shots: PathBuf,
}

impl Browser {
    async fn start(shots: &str) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/services.sh installs it)");
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        wait_until(Duration::from_secs(30), "chromedriver answers", || async {
            reqwest::get(&status).await.is_ok_and(|r| r.status().is_success())
        })
        .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000"],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a Chromium session");
        let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/console-screenshots")
            .join(shots);
        std::fs::create_dir_all(&shots).unwrap();
        Browser { client, driver, shots }
    }

    /// The element `css` selects, once the page has it.
    async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
    }

    async fn text(&self, css: &str) -> String {
        self.element(css).await.text().await.unwrap()
    }

    async fn click(&self, css: &str) {
        self.element(css).await.click().await.unwrap();
    }

    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    async fn stop(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn json_of(config: &Path, args: &[&str]) -> Value {
    let (ok, out, err) = idem(config, args);
    assert!(ok, "idem {args:?}: {err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{out}: {e}"))
}

async fn stats(config: &Path) -> Value {
    json_of(config, &["stats", "--json"])
}

/// A message file line.
fn line(id: &str, handler: &str, payload: Value, headers: &[(&str, &str)]) -> String {
    json!({ "id": id, "handler": handler, "payload": payload, "headers": headers }).to_string() + "\n"
}

fn publish(config: &Path, dir: &Path, lines: &str) {
    let file = dir.join(format!("m-{}.jsonl", uuid::Uuid::new_v4()));
    std::fs::write(&file, lines).unwrap();
    let (ok, _, err) = idem(config, &["publish", "--file", file.to_str().unwrap()]);
    assert!(ok, "{err}");
}

const XSS: &str = "<script>window.__idemXss=1</script><img src=x onerror=\"window.__idemXss=2\">";

/// A message id (the poison plugin's key) that is markup.
const XSS_KEY: &str = "k\"><img src=x onerror=window.__idemXss=3>";

/// The console's token in the token test.
const TOKEN: &str = "s3cret-console-token-0123";

/// The CSRF token of a console page's action form.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("an action form's CSRF token")
        .to_string()
}

/// A pool with duplicates and poison, then the console: the overview's
/// duplicate count is what `idem stats` reports; searching the poison key
/// finds its dead letter; replay republishes it (the store shows the old
/// record gone and the message dead again, as poison stays poison); a
/// payload and header holding markup render as text and run nothing; a
/// POST without the page's CSRF token changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_a_pools_duplicates_and_dead_letters_and_replays_them() {
    let mut env = Env::new().await;
    let http = format!("127.0.0.1:{}", free_port());
    env.config.http.listen = Some(http.clone());
    let config = env.dir.path().join("idem.toml");
    std::fs::write(&config, toml::to_string(&env.config).unwrap()).unwrap();
    let dir = env.dir.path().to_path_buf();

    let mut first = String::new();
    for i in 0..20 {
        first += &line(
            &format!("g-{i}"),
            "grant-credits",
            json!({ "user": format!("u-{i}"), "balance": i }),
            &[],
        );
    }
    first += &line("poison-1", "poison", json!({ "mode": "permanent" }), &[]);
    first += &line(
        "poison-xss",
        "poison",
        json!({ "mode": "permanent", "note": XSS }),
        &[("x-note", XSS)],
    );
    first += &line(XSS_KEY, "poison", json!({ "mode": "permanent" }), &[]);
    publish(&config, &dir, &first);
    let mut run = crate::common::spawn_idem_run(&config, &dir.join("run.log"));
    wait_until(Duration::from_secs(60), "20 done, 3 dead", || async {
        let s = stats(&config).await;
        s["done"] == 20 && s["dead_lettered"] == 3
    })
    .await;
    // The same five grants again: duplicates, acked without running.
    let again: String = (0..5)
        .map(|i| {
            line(
                &format!("g-{i}"),
                "grant-credits",
                json!({ "user": format!("u-{i}"), "balance": i }),
                &[],
            )
        })
        .collect();
    publish(&config, &dir, &again);
    let duplicates = wait_for(Duration::from_secs(30), "5 duplicates recorded", || async {
        let s = stats(&config).await;
        (s["pending"] == 0 && s["last_hour"]["duplicates"] == 5).then(|| s["last_hour"]["duplicates"].clone())
    })
    .await;

    let browser = Browser::start("pool").await;
    let base = format!("http://{http}");
    let b = &browser.client;

    // Overview: the duplicate count `idem stats` reports.
    b.goto(&format!("{base}/console")).await.unwrap();
    assert_eq!(browser.text("#hour-duplicates").await, duplicates.to_string());
    assert_eq!(browser.text("#count-done").await, "20");
    assert_eq!(browser.text("#count-dead").await, "3");
    browser.shot("overview").await;

    // Messages: search the poison key.
    b.goto(&format!("{base}/console/messages")).await.unwrap();
    browser.click("select[name=plugin] option[value=poison]").await;
    b.find(Locator::Css("input[name=key]"))
        .await
        .unwrap()
        .send_keys("poison-1")
        .await
        .unwrap();
    browser.click("form.search button").await;
    assert_eq!(browser.text("#claim-state").await, "dead");
    browser.shot("messages").await;
    let letters = json_of(&config, &["dlq", "list", "--json"]);
    let poison_id = letters.as_array().unwrap().iter().find(|d| d["key"] == "poison-1").unwrap()["id"]
        .as_i64()
        .unwrap();
    browser.click("#dead-letters a").await;
    assert_eq!(browser.text("#dead-key").await, "poison-1");
    assert!(browser.text("#dead-reason").await.contains("poison: this message is refused"));
    browser.shot("dead-letter").await;

    // A POST without the page's CSRF token (or with a wrong one) is
    // refused and changes nothing.
    let http_client = reqwest::Client::new();
    let page = http_client
        .get(format!("{base}/console/dead"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let cross_site = http_client
        .post(format!("{base}/console/dead/replay"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}&id={poison_id}&scope=selected", csrf_of(&page)))
        .send()
        .await
        .unwrap();
    assert_eq!(cross_site.status(), 403, "a form posted from another site");
    let rebound = http_client
        .get(format!("{base}/console/dead"))
        .header("host", format!("evil.example:{}", http.rsplit(':').next().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421, "a request under a name other than loopback's");
    // Without a token, loopback is trusted as the machine itself, not as a
    // proxy on it serving whoever reaches the proxy (before, both passed).
    let proxied = http_client
        .get(format!("{base}/console/dead"))
        .header("x-forwarded-for", "203.0.113.7")
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), 403, "a request through a proxy");
    assert!(proxied.text().await.unwrap().contains("[http] token"));
    let proxied_purge = http_client
        .post(format!("{base}/console/dead/purge"))
        .header("via", "1.1 proxy")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}&id={poison_id}&scope=selected&confirm=yes", csrf_of(&page)))
        .send()
        .await
        .unwrap();
    assert_eq!(proxied_purge.status(), 403, "a purge through a proxy");
    for body in [
        format!("id={poison_id}&scope=selected"),
        format!("id={poison_id}&scope=selected&csrf=guess"),
    ] {
        let refused = http_client
            .post(format!("{base}/console/dead/replay"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403);
    }
    // Records the page listed and that are gone since (replayed, purged or
    // swept) are passed over and said to be gone; before, one gone record
    // stopped the whole action with a 502.
    let gone = http_client
        .post(format!("{base}/console/dead/replay"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={}&shown=999999998&shown=999999999&scope=matching", csrf_of(&page)))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 200);
    let said = gone.text().await.unwrap();
    assert!(
        said.contains("0 dead letter(s) republished") && said.contains("2 of those listed were already gone"),
        "{said}"
    );
    let still = json_of(&config, &["dlq", "show", &poison_id.to_string(), "--json"]);
    assert_eq!(still["key"], "poison-1");

    // Replay from the browser: the record goes, the message runs again and,
    // poison being poison, dies again under a new record.
    browser.click("#replay").await;
    assert!(browser.text("#replayed").await.starts_with("1 dead letter(s) republished"));
    browser.shot("replayed").await;
    let (ok, _, err) = idem(&config, &["dlq", "show", &poison_id.to_string()]);
    assert!(!ok && err.contains("no dead letter"), "{err}");
    wait_until(Duration::from_secs(30), "the replayed poison dead again", || async {
        let letters = json_of(&config, &["dlq", "list", "--json"]);
        letters
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["key"] == "poison-1" && d["id"].as_i64().unwrap() > poison_id)
    })
    .await;

    // Markup from a message is text: nothing runs.
    let letters = json_of(&config, &["dlq", "list", "--json"]);
    let xss_id = letters.as_array().unwrap().iter().find(|d| d["key"] == "poison-xss").unwrap()["id"]
        .as_i64()
        .unwrap();
    b.goto(&format!("{base}/console/dead/{xss_id}")).await.unwrap();
    let shown = browser.text("#dead-payload").await;
    assert!(
        shown.contains("<script>window.__idemXss=1</script>"),
        "the payload shows as text: {shown}"
    );
    assert!(browser.text("#dead-headers").await.contains(XSS), "the header shows as text");
    assert!(b.source().await.unwrap().contains("&lt;script&gt;window.__idemXss=1"));
    assert_eq!(
        b.execute("return typeof window.__idemXss", vec![]).await.unwrap(),
        json!("undefined")
    );
    browser.shot("dead-letter-markup").await;
    // A key that is markup is text in the list and on its message page.
    b.goto(&format!("{base}/console/dead")).await.unwrap();
    assert!(browser.text("#dead-count").await.starts_with("3 dead letter(s) match"));
    assert!(browser.text("#dead-list").await.contains(XSS_KEY));
    assert!(!b.source().await.unwrap().contains("<img src=x onerror=window.__idemXss=3>"));
    browser.shot("dead-letters").await;
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("plugin", "poison")
        .append_pair("key", XSS_KEY)
        .finish();
    b.goto(&format!("{base}/console/messages?{query}")).await.unwrap();
    assert_eq!(browser.text("#claim-state").await, "dead");
    assert!(browser.text("main h1").await.contains(XSS_KEY));
    assert!(!b.source().await.unwrap().contains("<img src=x onerror=window.__idemXss=3>"));
    assert_eq!(
        b.execute("return typeof window.__idemXss", vec![]).await.unwrap(),
        json!("undefined")
    );

    // Purge every dead letter the filtered list shows: refused without the
    // confirmation box, done with it.
    b.goto(&format!("{base}/console/dead?plugin=poison&reason=refused")).await.unwrap();
    assert!(browser.text("#dead-count").await.starts_with("3 dead letter(s) match"));
    browser.click("button.danger[value=matching]").await;
    assert!(browser.text("main p.error").await.starts_with("Not purged"));
    assert_eq!(json_of(&config, &["dlq", "list", "--json"]).as_array().unwrap().len(), 3);
    b.back().await.unwrap();
    browser.click("label.confirm input").await;
    browser.click("button.danger[value=matching]").await;
    assert_eq!(browser.text("#purged").await, "3 dead letter(s) deleted.");
    assert_eq!(json_of(&config, &["dlq", "list", "--json"]), json!([]));

    // The other pages answer, with what the pool holds.
    for (page, css) in [("in-flight", "main h1"), ("retrying", "main h1"), ("plugins", "main table")] {
        b.goto(&format!("{base}/console/{page}")).await.unwrap();
        browser.text(css).await;
        browser.shot(page).await;
    }
    let plugins = b.source().await.unwrap();
    let version = env.config.plugins["grant-credits"].path.clone();
    assert!(plugins.contains(&idem_host::plugin::version_of(&std::fs::read(version).unwrap())));

    browser.stop().await;
    let _ = Command::new("kill").arg("-TERM").arg(run.id().to_string()).status();
    assert!(run.wait().unwrap().success());
}

/// `idem console` on an address other than loopback: refused without a
/// token; with one, a request without it gets 401, a bearer token or the
/// login form gets in; read-only hides and refuses replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_off_loopback_needs_its_token_and_read_only_refuses_actions() {
    let env = Env::new().await;
    let mut config = env.config.clone();
    let config_path = env.dir.path().join("idem.toml");
    std::fs::write(&config_path, toml::to_string(&config).unwrap()).unwrap();
    let dir = env.dir.path().to_path_buf();
    publish(&config_path, &dir, &line("poison-2", "poison", json!({ "mode": "permanent" }), &[]));
    let pool = env.start().await;
    wait_until(Duration::from_secs(30), "poison-2 dead", || async {
        pool.backends.admin.counts().await.unwrap().dead_letters == 1
    })
    .await;
    pool.stop().await.unwrap();

    // No token: refused at start, naming the setting.
    let port = free_port();
    let (ok, _, err) = idem(&config_path, &["console", "--listen", &format!("0.0.0.0:{port}")]);
    assert!(!ok && err.contains("[http] token"), "{err}");

    // A short token is refused.
    config.http.token = Some(idem_host::config::Secret("s3cret".into()));
    std::fs::write(&config_path, toml::to_string(&config).unwrap()).unwrap();
    let (ok, _, err) = idem(&config_path, &["console", "--listen", &format!("0.0.0.0:{port}")]);
    assert!(!ok && err.contains("shorter than 16 characters"), "{err}");

    config.http.token = Some(idem_host::config::Secret(TOKEN.into()));
    config.http.read_only = true;
    std::fs::write(&config_path, toml::to_string(&config).unwrap()).unwrap();
    let mut console = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["console", "--listen", &format!("0.0.0.0:{port}"), "--config"])
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    wait_until(Duration::from_secs(30), "the console answers", || async {
        client.get(format!("{base}/console/login")).send().await.is_ok()
    })
    .await;
    let bare = client.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(bare.status(), 401);
    let wrong = client.get(format!("{base}/console")).bearer_auth("guess").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let post = client
        .post(format!("{base}/console/dead/replay"))
        .body("scope=matching")
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 401);
    let page = client.get(format!("{base}/console")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("id=\"count-dead\""));

    // In the browser: sent to the login form, in with the token.
    let browser = Browser::start("token").await;
    let b = &browser.client;
    b.goto(&format!("{base}/console/dead")).await.unwrap();
    assert!(b.current_url().await.unwrap().path().ends_with("/console/login"));
    browser.shot("login").await;
    b.find(Locator::Css("input[name=token]"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    browser.click("form button").await;
    assert!(browser.text("#dead-count").await.starts_with("1 dead letter(s) match"));
    // Read-only: no replay or purge on the pages, and a replay POSTed
    // anyway is refused.
    let letters = json_of(&config_path, &["dlq", "list", "--json"]);
    let id = letters[0]["id"].as_i64().unwrap();
    b.goto(&format!("{base}/console/dead/{id}")).await.unwrap();
    assert_eq!(browser.text(".badge").await, "read-only");
    assert!(b.find(Locator::Css("#replay")).await.is_err(), "no replay button when read-only");
    let source = b.source().await.unwrap();
    assert!(!source.contains("action=\"/console/dead/"), "no action forms when read-only");
    browser.shot("read-only").await;
    b.goto(&format!("{base}/console/dead")).await.unwrap();
    assert!(browser.text("#dead-list").await.contains("poison-2"));
    assert!(
        !b.source().await.unwrap().contains("action=\"/console/dead/"),
        "no action forms when read-only"
    );
    // The login cookie is this console's own (a host's cookies go to all
    // its ports), and logging out drops it.
    let cookies: Vec<String> = b.get_all_cookies().await.unwrap().iter().map(|c| c.name().to_string()).collect();
    assert_eq!(cookies, vec![format!("idem_console_{port}")]);
    browser.click("#logout").await;
    browser.element("input[name=token]").await;
    assert!(b.get_all_cookies().await.unwrap().is_empty(), "logged out");
    b.goto(&format!("{base}/console/dead")).await.unwrap();
    browser.element("input[name=token]").await;
    assert!(b.current_url().await.unwrap().path().ends_with("/console/login"));
    browser.stop().await;
    let replay = client
        .post(format!("{base}/console/dead/replay"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("id={id}&scope=selected"))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 403);
    assert!(replay.text().await.unwrap().contains("read-only"));
    let still = json_of(&config_path, &["dlq", "show", &id.to_string(), "--json"]);
    assert_eq!(still["key"], "poison-2");

    let _ = console.kill();
    let _ = console.wait();
}
