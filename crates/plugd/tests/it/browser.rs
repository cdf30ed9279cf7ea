//! A real headless Chromium for the console tests, driven over WebDriver
//! (`fantoccini`) through Debian's `chromedriver` on a loopback port: each
//! [`Browser`] is its own chromedriver process (killed with its process group
//! on drop) and its own profile directory, with the performance log on, so a
//! test can list every request the page made and read the response bodies.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::repo;

/// Where Debian's `chromium` package puts the browser (`PLUGD_TEST_CHROMIUM` overrides).
const CHROMIUM: &str = "/usr/bin/chromium";
/// Where Debian's `chromium-driver` package puts chromedriver (`PLUGD_TEST_CHROMEDRIVER` overrides).
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long a wait for the page (an element, a text) may take.
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(20);

/// Browsers are heavy for a 2-core machine: at most two at once across the
/// test binary's threads.
static SLOTS: Mutex<usize> = Mutex::new(0);
const MAX_BROWSERS: usize = 2;

/// One browser slot, released on drop.
struct Slot;

impl Slot {
    fn take() -> Slot {
        loop {
            {
                let mut n = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
                if *n < MAX_BROWSERS {
                    *n += 1;
                    return Slot;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *SLOTS.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}

fn tool_path(var: &str, default: &str, package: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        path.exists(),
        "{} is missing: run ./scripts/test, which installs Debian's {package} package (or set {var})",
        path.display()
    );
    path
}

/// One request the page made, from the performance log.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) id: String,
    pub(crate) method: String,
    pub(crate) url: String,
    /// The response status, once `Network.responseReceived` came.
    pub(crate) status: Option<u64>,
    /// Whether `Network.loadingFinished` came (the body can be read).
    pub(crate) finished: bool,
}

/// A chromedriver command fantoccini has no method for: `POST
/// /session/{id}/{path}` with a JSON body.
#[derive(Debug)]
struct Extension {
    path: &'static str,
    body: Value,
}

impl WebDriverCompatibleCommand for Extension {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/{}",
            session_id.unwrap_or_default(),
            self.path
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.body.to_string()))
    }
}

/// A headless Chromium session and its chromedriver.
pub(crate) struct Browser {
    pub(crate) c: Client,
    driver: Child,
    /// The profile (`--user-data-dir`) and chromedriver's log.
    dir: tempfile::TempDir,
    /// Every request seen so far, by request id, in the order first seen.
    requests: Mutex<(Vec<String>, BTreeMap<String, Request>)>,
    _slot: Slot,
}

impl Browser {
    /// Starts chromedriver on a free loopback port and opens a headless
    /// session at 1280x800.
    pub(crate) async fn start() -> Browser {
        let slot = Slot::take();
        let chromium = tool_path("PLUGD_TEST_CHROMIUM", CHROMIUM, "chromium");
        let chromedriver = tool_path("PLUGD_TEST_CHROMEDRIVER", CHROMEDRIVER, "chromium-driver");
        let dir = tempfile::tempdir().unwrap();
        let driver_log = dir.path().join("chromedriver.log");
        // chromedriver takes a port number, not a listener: take a free one,
        // let it go, and try again if another process took it meanwhile.
        let mut attempt = 0;
        let (driver, addr) = loop {
            attempt += 1;
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            #[allow(clippy::disallowed_methods)] // tests run the browser's driver
            let mut child = std::process::Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .arg(format!("--log-path={}", driver_log.display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", chromedriver.display()));
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let end = Instant::now() + Duration::from_secs(20);
            let mut up = false;
            while Instant::now() < end {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    up = true;
                    break;
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if up {
                break (child, addr);
            }
            kill_group(&mut child);
            assert!(
                attempt < 3,
                "chromedriver did not listen on {addr}; its log:\n{}",
                std::fs::read_to_string(&driver_log).unwrap_or_default()
            );
        };
        let profile = dir.path().join("profile");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--window-size=1280,800",
                    format!("--user-data-dir={}", profile.display()),
                    // Nothing from the browser itself either: no updates,
                    // sync, field trials or default apps.
                    "--no-first-run",
                    "--no-default-browser-check",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--disable-default-apps",
                    "--disable-extensions",
                    "--hide-scrollbars",
                    // No crash handler process outliving the test.
                    "--disable-breakpad",
                ],
                "perfLoggingPrefs": {"enableNetwork": true, "enablePage": false},
            },
            "goog:loggingPrefs": {"performance": "ALL", "browser": "ALL"},
            "timeouts": {"script": 30000, "pageLoad": 30000, "implicit": 0},
        });
        let serde_json::Value::Object(caps) = caps else {
            unreachable!()
        };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let c = tokio::time::timeout(
            Duration::from_secs(60),
            ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&format!("http://{addr}")),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no browser session within 60 s; chromedriver's log:\n{}",
                std::fs::read_to_string(&driver_log).unwrap_or_default()
            )
        })
        .unwrap_or_else(|e| {
            panic!(
                "no browser session ({e}); chromedriver's log:\n{}",
                std::fs::read_to_string(&driver_log).unwrap_or_default()
            )
        });
        let b = Browser {
            c,
            driver,
            dir,
            requests: Mutex::new((Vec::new(), BTreeMap::new())),
            _slot: slot,
        };
        // Chromium's own first tab (chrome://new-tab-page…) is no request
        // of the page under test: start from about:blank with an empty log.
        b.goto("about:blank").await;
        b.drain_log().await;
        *b.requests.lock().unwrap() = (Vec::new(), BTreeMap::new());
        b
    }

    /// Ends the session (chromedriver quits Chromium), then chromedriver.
    pub(crate) async fn close(mut self) {
        let c = self.c.clone();
        let _ = tokio::time::timeout(Duration::from_secs(20), c.close()).await;
        kill_group(&mut self.driver);
    }

    /// A scratch directory that lives as long as the browser.
    pub(crate) fn scratch(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) async fn goto(&self, url: &str) {
        self.c
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("goto {url}: {e}"));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub(crate) async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.c
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script {script:?}: {e}"))
    }

    /// A chromedriver extension command.
    async fn extension(&self, path: &'static str, body: Value) -> Result<Value, String> {
        self.c
            .issue_cmd(Extension { path, body })
            .await
            .map_err(|e| e.to_string())
    }

    /// A DevTools protocol command through chromedriver (`goog/cdp/execute`).
    pub(crate) async fn cdp(&self, cmd: &str, params: Value) -> Result<Value, String> {
        self.extension("goog/cdp/execute", json!({"cmd": cmd, "params": params}))
            .await
    }

    /// Reads the performance log (chromedriver hands each entry out once)
    /// into the request table.
    async fn drain_log(&self) {
        let entries = self
            .extension("se/log", json!({"type": "performance"}))
            .await
            .unwrap_or_else(|e| panic!("performance log: {e}"));
        let mut guard = self.requests.lock().unwrap();
        let (order, table) = &mut *guard;
        for entry in entries.as_array().into_iter().flatten() {
            let Some(message) = entry["message"].as_str() else {
                continue;
            };
            let Ok(m) = serde_json::from_str::<Value>(message) else {
                continue;
            };
            let m = &m["message"];
            let p = &m["params"];
            let id = p["requestId"].as_str().unwrap_or_default().to_owned();
            match m["method"].as_str().unwrap_or_default() {
                "Network.requestWillBeSent" => {
                    let url = p["request"]["url"].as_str().unwrap_or_default().to_owned();
                    let method = p["request"]["method"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    // A redirect reuses the id: keep the first, add the hop.
                    let key = if table.contains_key(&id) {
                        format!("{id}#{}", order.len())
                    } else {
                        id.clone()
                    };
                    order.push(key.clone());
                    table.insert(
                        key,
                        Request {
                            id,
                            method,
                            url,
                            status: None,
                            finished: false,
                        },
                    );
                }
                "Network.webSocketCreated" => {
                    let url = p["url"].as_str().unwrap_or_default().to_owned();
                    order.push(format!("ws:{id}"));
                    table.insert(
                        format!("ws:{id}"),
                        Request {
                            id,
                            method: "WEBSOCKET".into(),
                            url,
                            status: None,
                            finished: false,
                        },
                    );
                }
                "Network.responseReceived" => {
                    if let Some(r) = table.get_mut(&id) {
                        r.status = p["response"]["status"].as_u64();
                    }
                }
                "Network.loadingFinished" => {
                    if let Some(r) = table.get_mut(&id) {
                        r.finished = true;
                    }
                }
                _ => {}
            }
        }
    }

    /// Every request the page made so far, in order.
    pub(crate) async fn requests(&self) -> Vec<Request> {
        self.drain_log().await;
        let guard = self.requests.lock().unwrap();
        guard.0.iter().map(|k| guard.1[k].clone()).collect()
    }

    /// Asserts that every request so far went to `addr` (or stayed inside
    /// the browser: `data:`, `blob:`, `about:`), and that there was at least
    /// one; returns them.
    pub(crate) async fn assert_only_loopback(&self, addr: SocketAddr) -> Vec<Request> {
        let requests = self.requests().await;
        assert!(!requests.is_empty(), "the performance log has no request");
        let origin = format!("http://{addr}/");
        for r in &requests {
            let local = r.url.starts_with(&origin)
                || r.url.starts_with("data:")
                || r.url.starts_with("blob:")
                || r.url.starts_with("about:");
            assert!(
                local,
                "the page sent {} {} off {origin}; every request: {requests:#?}",
                r.method, r.url
            );
        }
        requests
    }

    /// The bodies of every finished response so far, with their URLs (a
    /// stream still open, such as server-sent events, has none yet).
    pub(crate) async fn response_bodies(&self) -> Vec<(String, String)> {
        let requests = self.requests().await;
        let mut out = Vec::new();
        for r in requests.iter().filter(|r| r.finished) {
            if let Ok(v) = self
                .cdp("Network.getResponseBody", json!({"requestId": r.id}))
                .await
            {
                let body = v["body"].as_str().unwrap_or_default();
                let body = if v["base64Encoded"] == true {
                    use base64::Engine;
                    String::from_utf8_lossy(
                        &base64::engine::general_purpose::STANDARD
                            .decode(body)
                            .unwrap_or_default(),
                    )
                    .into_owned()
                } else {
                    body.to_owned()
                };
                out.push((r.url.clone(), body));
            }
        }
        out
    }

    /// Emulates a viewport of `width`x`height` CSS pixels (a phone's when
    /// `mobile`), whatever the window's size.
    pub(crate) async fn viewport(&self, width: u32, height: u32, mobile: bool) {
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .await
        .unwrap_or_else(|e| panic!("viewport {width}x{height}: {e}"));
    }

    /// A PNG of the viewport, written to `path`; its bytes.
    pub(crate) async fn screenshot_to(&self, path: &Path) -> Vec<u8> {
        let png = self
            .c
            .screenshot()
            .await
            .unwrap_or_else(|e| panic!("screenshot: {e}"));
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, &png).unwrap();
        png
    }

    /// A screenshot of the current screen for the README, as
    /// `docs/console/NAME.png`.
    pub(crate) async fn screenshot(&self, name: &str) -> Vec<u8> {
        self.screenshot_to(&repo().join("docs/console").join(format!("{name}.png")))
            .await
    }

    /// The first element matching `css`, waiting for it.
    pub(crate) async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.wait_for(&format!("element {css}"), move || async move {
            self.c.find(Locator::Css(css)).await.ok()
        })
        .await
    }

    /// Polls `f` until it gives `Some` or [`PAGE_WAIT`] passes (then panics
    /// naming `what`, with the page's URL and text).
    pub(crate) async fn wait_for<T, F, Fut>(&self, what: &str, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let end = Instant::now() + PAGE_WAIT;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            if Instant::now() > end {
                let url = self
                    .c
                    .current_url()
                    .await
                    .map(|u| u.to_string())
                    .unwrap_or_default();
                let text = self.body_text().await;
                panic!("waited {PAGE_WAIT:?} for {what} on {url}; the page says:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the first element matching `css` once `ok` holds for it.
    pub(crate) async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let ok = &ok;
        let found = self
            .wait_for_opt(PAGE_WAIT, move || async move {
                let t = self.text_of(css).await?;
                ok(&t).then_some(t)
            })
            .await;
        if let Some(t) = found {
            return t;
        }
        let last = self.text_of(css).await;
        panic!(
            "the text of {css} never passed the check; last: {last:?}; the page says:\n{}",
            self.body_text().await
        )
    }

    /// Polls `f` until `Some` or `limit` passes; `None` then.
    pub(crate) async fn wait_for_opt<T, F, Fut>(&self, limit: Duration, mut f: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = f().await {
                return Some(v);
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The rendered text of the first element matching `css`, if any.
    pub(crate) async fn text_of(&self, css: &str) -> Option<String> {
        let e = self.c.find(Locator::Css(css)).await.ok()?;
        e.text().await.ok()
    }

    /// Text written straight into `<main>` beside its elements (a view that
    /// renders an absent part as text, such as a stray `null`).
    pub(crate) async fn stray_text(&self) -> Vec<String> {
        let v = self
            .js(
                "return Array.from(document.getElementById('main').childNodes)\
                 .filter(n => n.nodeType === 3 && n.textContent.trim())\
                 .map(n => n.textContent);",
                vec![],
            )
            .await;
        serde_json::from_value(v).unwrap_or_default()
    }

    /// The page's visible text.
    pub(crate) async fn body_text(&self) -> String {
        self.text_of("body").await.unwrap_or_default()
    }

    /// The page's whole DOM as HTML, hidden parts and input values included
    /// (an `<input>`'s typed value is a property, so each is added).
    pub(crate) async fn dom_and_values(&self) -> String {
        let v = self
            .js(
                "return document.documentElement.outerHTML + '\\n' + \
                 Array.from(document.querySelectorAll('input, textarea, select'))\
                 .map(e => e.name + '=' + e.value).join('\\n');",
                vec![],
            )
            .await;
        v.as_str().unwrap_or_default().to_owned()
    }

    /// The labels of the visible buttons inside `scope`, read in one script
    /// (so a redraw cannot make one look absent).
    pub(crate) async fn button_labels(&self, scope: &str) -> Vec<String> {
        let v = self
            .js(
                "return Array.from(document.querySelectorAll(arguments[0] + ' button'))\
                 .filter(b => b.getClientRects().length > 0 && getComputedStyle(b).visibility !== 'hidden')\
                 .map(b => b.textContent.trim());",
                vec![json!(scope)],
            )
            .await;
        serde_json::from_value(v).unwrap()
    }

    /// Whether a visible button `label` is inside `scope`.
    pub(crate) async fn has_button(&self, scope: &str, label: &str) -> bool {
        self.button_labels(scope).await.iter().any(|l| l == label)
    }

    /// The visible buttons whose text is `label` inside `scope` (a CSS
    /// selector; "body" for all).
    pub(crate) async fn buttons(
        &self,
        scope: &str,
        label: &str,
    ) -> Vec<fantoccini::elements::Element> {
        let v = self
            .c
            .find_all(Locator::Css(&format!("{scope} button")))
            .await
            .unwrap_or_default();
        let mut out = Vec::new();
        for b in v {
            let text = b.text().await.unwrap_or_default();
            if text.trim() == label && b.is_displayed().await.unwrap_or(false) {
                out.push(b);
            }
        }
        out
    }

    /// Clicks the one visible button `label` inside `scope`, waiting for it.
    /// Types `text` into the first field matching `css`, scrolled into
    /// view first, found again when a live redraw replaced it.
    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        for _ in 0..20 {
            let field = self.find(css).await;
            let arg = serde_json::to_value(&field).unwrap_or(Value::Null);
            let typed = match self
                .c
                .execute("arguments[0].scrollIntoView({block: 'center'});", vec![arg])
                .await
            {
                Ok(_) => field.send_keys(text).await,
                Err(e) => Err(e),
            };
            match typed {
                Ok(()) => return,
                // Replaced by a redraw, or caught mid-redraw.
                Err(e)
                    if e.to_string().contains("stale element")
                        || e.to_string().contains("not interactable") =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("type into {css}: {e}"),
            }
        }
        panic!("the field {css} went stale or out of reach 20 times in a row");
    }

    pub(crate) async fn click_button(&self, scope: &str, label: &str) {
        // Live updates redraw the page at any moment: a button found just
        // before a redraw is stale by the click, so find it again.
        for _ in 0..20 {
            let b = self
                .wait_for(
                    &format!("a button {label:?} in {scope}"),
                    move || async move { self.buttons(scope, label).await.into_iter().next() },
                )
                .await;
            match b.click().await {
                Ok(()) => return,
                Err(e) if e.to_string().contains("stale element") => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("click {label:?} in {scope}: {e}"),
            }
        }
        panic!("the button {label:?} in {scope} went stale 20 times in a row");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}

/// Kills chromedriver's process group (Chromium with it) and reaps it.
fn kill_group(child: &mut Child) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}
