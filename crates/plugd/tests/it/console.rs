//! The operator console in a real browser (issue 15): a real `plugd serve
//! --listen 127.0.0.1:0` with real plugins (the Salmex fixture
//! `tests/plugins/console-settings`, a crash-prone native one), and headless
//! Chromium driven through chromedriver (crate::browser) by the contract's
//! URLs and DOM (`#/plugins`, `pre#command-line`, `form#settings`, …). Each
//! test also checks in the browser's network log that no request left
//! loopback; the main screens are written to `docs/console/` at 1280x800 and
//! 390x844 for the README.

use std::time::Duration;

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use serde_json::{Value, json};
use sha2::Digest;

use crate::browser::Browser;
use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, eventually_blocking, repo, stderr};

/// The Salmex fixture's id (its tools are `console-settings/NAME`).
pub(crate) const FIXTURE: &str = "console-settings";
/// A secret typed into the settings form: it must reach the plugin and
/// never come back to the browser.
const SECRET: &str = "s3cr3t-Console-Value-71f0";

/// A workspace with the Salmex fixture (unapproved unless `approve`).
pub(crate) fn workspace(approve: bool) -> Ws {
    let ws = Ws::new();
    let to = ws.plugin_dir(FIXTURE);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["plugin.json", "main.py"] {
        std::fs::copy(
            repo().join("tests/plugins").join(FIXTURE).join(f),
            to.join(f),
        )
        .unwrap();
    }
    if approve {
        let o = ws.plugd(&["plugin", "approve", FIXTURE]);
        assert!(o.status.success(), "approve: {}", stderr(&o));
    }
    ws
}

/// `POST /v1/tools/{name}:invoke` with `token`: status and body.
pub(crate) fn invoke(serve: &Serve, token: &str, name: &str, args: Value) -> (u16, Value) {
    let body = json!({"args": args}).to_string();
    let r = request_as(
        serve,
        token,
        "POST",
        &format!("/v1/tools/{name}:invoke"),
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    );
    (r.status, r.json())
}

/// The names `GET /v1/tools` lists to `token`.
fn tool_names(serve: &Serve, token: &str) -> Vec<String> {
    let r = request_as(serve, token, "GET", "/v1/tools", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

/// The text of a tool result's first content item.
fn result_text(v: &Value) -> &str {
    v["content"][0]["text"].as_str().unwrap_or_default()
}

/// The plugin's state as `GET /v1/plugins/{id}` gives it.
fn api_state(serve: &Serve, id: &str) -> Value {
    serve.get(&format!("/v1/plugins/{id}")).json()["state"].clone()
}

/// A browser on `serve`'s console.
pub(crate) struct Console<'a> {
    pub(crate) serve: &'a Serve,
    pub(crate) b: Browser,
}

impl<'a> Console<'a> {
    pub(crate) async fn open(serve: &'a Serve) -> Console<'a> {
        Console {
            serve,
            b: Browser::start().await,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.serve.addr)
    }

    /// Logs in on `/console/login` with `token` by typing it and pressing
    /// "Log in"; waits for `#whoami` to name `role`.
    pub(crate) async fn login(&self, token: &str, role: &str) {
        self.b.goto(&self.url("/console/login")).await;
        self.type_token(token).await;
        self.b
            .wait_text("#whoami", |t| t.contains(&format!("({role})")))
            .await;
    }

    pub(crate) async fn type_token(&self, token: &str) {
        let input = self.b.find("form#login input#token").await;
        assert_eq!(
            input.attr("type").await.unwrap().as_deref(),
            Some("password")
        );
        let label = self.b.find("form#login label[for=token]").await;
        assert_eq!(label.text().await.unwrap().trim(), "Token");
        input.clear().await.unwrap();
        input.send_keys(token).await.unwrap();
        self.b.click_button("form#login", "Log in").await;
    }

    /// Goes to a hash route of the app (without reloading once loaded).
    pub(crate) async fn route(&self, hash: &str) {
        let here = self.b.c.current_url().await.unwrap();
        if here.path() == "/console/" {
            self.b
                .js("location.hash = arguments[0];", vec![json!(hash)])
                .await;
        } else {
            self.b.goto(&self.url(&format!("/console/{hash}"))).await;
        }
    }

    /// Marks the document; [`Console::not_reloaded`] checks the mark is
    /// still there (the page updated itself, nobody reloaded it).
    pub(crate) async fn mark(&self) {
        self.b.js("window.__plugdMark = 42;", vec![]).await;
    }

    pub(crate) async fn not_reloaded(&self) {
        let v = self.b.js("return window.__plugdMark || 0;", vec![]).await;
        assert_eq!(v, 42, "the page was reloaded");
    }

    /// Every request so far stayed on serve's loopback address.
    pub(crate) async fn only_loopback(&self) {
        self.b.assert_only_loopback(self.serve.addr).await;
    }

    /// Whether the element matching `css` has the `hidden` attribute.
    pub(crate) async fn hidden(&self, css: &str) -> bool {
        self.b
            .js(
                "const e = document.querySelector(arguments[0]); return e ? e.hidden : null;",
                vec![json!(css)],
            )
            .await
            .as_bool()
            .unwrap_or_else(|| panic!("no element {css}"))
    }

    /// Screenshots of the current screen at 1280x800 and 390x844, light and
    /// dark (the system's preference, emulated), as
    /// `docs/console/NAME-1280.png`, `NAME-390.png`, `NAME-dark-1280.png`
    /// and `NAME-dark-390.png`; back to 1280 and light after.
    pub(crate) async fn screenshots(&self, name: &str) {
        self.screenshots_at(name, None).await
    }

    /// Makes the page see `scheme` (`light` or `dark`) as the system's.
    pub(crate) async fn color_scheme(&self, scheme: &str) {
        self.b
            .cdp(
                "Emulation.setEmulatedMedia",
                json!({"features": [{"name": "prefers-color-scheme", "value": scheme}]}),
            )
            .await
            .unwrap_or_else(|e| panic!("prefers-color-scheme {scheme}: {e}"));
    }

    /// [`Console::screenshots`] scrolled to the element `at` (else the top).
    pub(crate) async fn screenshots_at(&self, name: &str, at: Option<&str>) {
        for scheme in ["dark", "light"] {
            self.color_scheme(scheme).await;
            let bg = self
                .b
                .js(
                    "return getComputedStyle(document.documentElement).backgroundColor;",
                    vec![],
                )
                .await;
            // The page follows the system: dark means a dark background.
            let dark_bg = bg.as_str() == Some("rgb(18, 22, 27)");
            assert_eq!(
                dark_bg,
                scheme == "dark",
                "{name} in {scheme}: background {bg}"
            );
            let name = if scheme == "dark" {
                format!("{name}-dark")
            } else {
                name.to_owned()
            };
            self.shots(&name, at).await;
        }
    }

    async fn shots(&self, name: &str, at: Option<&str>) {
        for (w, h) in [(390u32, 844u32), (1280, 800)] {
            self.b.viewport(w, h, w < 500).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            self.b
                .js(
                    "const e = arguments[0] && document.querySelector(arguments[0]);\
                     if (e) e.scrollIntoView({block: 'start'}); else window.scrollTo(0, 0);",
                    vec![json!(at)],
                )
                .await;
            // The README's pictures name no test's temporary directory: the
            // workspace reads as ~/workspace while the picture is taken.
            self.b
                .js(
                    "const re = /\\/tmp\\/\\.tmp[A-Za-z0-9_]+/g; const kept = [];\
                     const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);\
                     for (let n = walk.nextNode(); n; n = walk.nextNode()) {\
                       if (re.test(n.data)) { kept.push([n, n.data]); n.data = n.data.replace(re, '~/workspace'); }\
                       re.lastIndex = 0;\
                     }\
                     window.__plugdMasked = kept; return kept.length;",
                    vec![],
                )
                .await;
            let png = self.b.screenshot(&format!("{name}-{w}")).await;
            self.b
                .js(
                    "for (const [n, d] of window.__plugdMasked || []) n.data = d; window.__plugdMasked = [];",
                    vec![],
                )
                .await;
            if w == 390 {
                let sw = self
                    .b
                    .js("return document.documentElement.scrollWidth;", vec![])
                    .await;
                assert!(
                    sw.as_u64().unwrap() <= 390,
                    "{name} is {sw} px wide on a 390 px screen"
                );
            }
            assert_eq!(png_size(&png), (w, h), "{name} at {w}");
        }
    }

    pub(crate) async fn close(self) {
        self.only_loopback().await;
        self.b.close().await;
    }
}

/// Presses Tab once (a real key event through WebDriver's actions).
async fn tab(b: &Browser) {
    let keys = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: '\u{e004}' })
        .then(KeyAction::Up { value: '\u{e004}' });
    b.c.perform_actions(keys).await.unwrap();
}

/// The focused element: tag, id, text, and whether its focus is visible (an
/// outline of a non-zero width, or a box shadow).
async fn focused(b: &Browser) -> Value {
    b.js(
        "const e = document.activeElement; const s = getComputedStyle(e);\
         return {tag: e.tagName.toLowerCase(), id: e.id, text: (e.textContent || '').trim(),\
           nav: !!e.closest('nav'),\
           visible: (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) || s.boxShadow !== 'none'};",
        vec![],
    )
    .await
}

/// The harness itself, on a page serve has without the console: the browser
/// shows `/healthz`'s JSON, the performance log lists that one request (to
/// loopback) with its body, and screenshots are PNGs of the viewport's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_harness_reads_healthz_and_its_network_log() {
    let ws = Ws::new();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let b = Browser::start().await;
    let url = format!("http://{}/healthz", serve.addr);
    b.goto(&url).await;
    let text = b.wait_text("body", |t| t.contains("status")).await;
    let v: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["status"], "ok", "{text}");

    let requests = b.assert_only_loopback(serve.addr).await;
    let health: Vec<_> = requests.iter().filter(|r| r.url == url).collect();
    assert_eq!(health.len(), 1, "{requests:#?}");
    assert_eq!(health[0].method, "GET");
    assert_eq!(health[0].status, Some(200), "{requests:#?}");
    let bodies = b.response_bodies().await;
    let body = bodies
        .iter()
        .find(|(u, _)| *u == url)
        .unwrap_or_else(|| panic!("no body for {url}: {bodies:?}"));
    let v: Value = serde_json::from_str(&body.1).unwrap();
    assert_eq!(v["status"], "ok");

    // A request to another host would be caught: the check is not vacuous.
    let other = b
        .js(
            "return fetch('http://127.0.0.2:9/x').then(() => 'sent', () => 'failed');",
            vec![],
        )
        .await;
    assert!(other == "failed" || other == "sent", "{other}");
    let all = b.requests().await;
    assert!(
        all.iter().any(|r| r.url == "http://127.0.0.2:9/x"),
        "the log missed a fetch: {all:#?}"
    );

    for (w, h) in [(1280u32, 800u32), (390, 844)] {
        b.viewport(w, h, w < 500).await;
        let png = b
            .screenshot_to(&b.scratch().join(format!("healthz-{w}.png")))
            .await;
        let (pw, ph) = png_size(&png);
        assert_eq!((pw, ph), (w, h), "screenshot of a {w}x{h} viewport");
    }
    b.close().await;
}

/// Width and height of a PNG (its IHDR chunk).
pub(crate) fn png_size(png: &[u8]) -> (u32, u32) {
    let be = |i: usize| u32::from_be_bytes(png[i..i + 4].try_into().unwrap());
    assert_eq!(&png[12..16], b"IHDR");
    (be(16), be(20))
}

/// A wrong token is refused with a visible message and no cookie; the right
/// one logs in. The keyboard alone reaches the token field, then (logged in)
/// every nav link, each with a visible focus ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_login_refuses_a_wrong_token_and_works_from_the_keyboard() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let con = Console::open(&serve).await;
    let b = &con.b;

    // Keyboard: from nothing focused, Tab reaches the token field.
    b.goto(&con.url("/console/login")).await;
    b.find("input#token").await;
    b.js(
        "document.activeElement && document.activeElement.blur();",
        vec![],
    )
    .await;
    let mut reached = None;
    let mut path = Vec::new();
    // Tab starts after the field the page focused (Chrome keeps that as the
    // starting point): "Log in", the end of the page, the skip link, then
    // the token again; the header is hidden until login, so no nav link or
    // "Log out" is on the way.
    for _ in 0..6 {
        tab(b).await;
        let f = focused(b).await;
        path.push(f.clone());
        if f["id"] == "token" {
            reached = Some(f);
            break;
        }
    }
    let f = reached.unwrap_or_else(|| panic!("Tab never reached input#token: {path:?}"));
    assert!(
        path.iter()
            .all(|p| p["nav"] != true && p["text"] != "Log out"),
        "the logged-out page offers the header's controls: {path:?}"
    );
    assert_eq!(
        f["visible"], true,
        "no visible focus on the token field: {f}"
    );
    con.screenshots("login").await;

    // A wrong token: a visible message, still on the login page, no cookie.
    let wrong = format!("{}x", &serve.token[..serve.token.len() - 1]);
    con.type_token(&wrong).await;
    let msg = b.wait_text("#login-error", |t| !t.trim().is_empty()).await;
    assert!(msg.contains("Not logged in"), "{msg}");
    assert!(
        b.find("#login-error").await.is_displayed().await.unwrap(),
        "the error is not visible"
    );
    assert!(
        b.c.current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/console/login")
    );
    let cookies = b.c.get_all_cookies().await.unwrap();
    assert!(
        !cookies
            .iter()
            .any(|c| c.name().starts_with("plugd_console")),
        "{cookies:?}"
    );

    // The right one: the app, with who is logged in, and an HttpOnly cookie
    // the page's script cannot read.
    con.type_token(&serve.token).await;
    let who = b.wait_text("#whoami", |t| t.contains("(admin)")).await;
    assert!(who.contains("token:"), "{who}");
    b.find("table#plugins").await;
    // Named per port (`plugd_console_PORT`), so two serves on one host
    // keep their own sessions.
    let name = format!("plugd_console_{}", serve.addr.port());
    let cookie = b.c.get_named_cookie(&name).await.unwrap();
    assert_eq!(
        format!("{:?}", cookie.same_site()),
        "Some(Strict)",
        "{cookie:?}"
    );
    assert_eq!(cookie.http_only(), Some(true), "{cookie:?}");
    assert_eq!(
        b.js("return document.cookie;", vec![]).await,
        "",
        "the session cookie is readable by script"
    );

    // Keyboard: Tab reaches each nav link in order, each with visible focus.
    b.js(
        "document.activeElement && document.activeElement.blur();",
        vec![],
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..20 {
        tab(b).await;
        let f = focused(b).await;
        if f["nav"] == true && f["tag"] == "a" {
            assert_eq!(f["visible"], true, "no visible focus on {f}");
            let text = f["text"].as_str().unwrap().to_owned();
            let word = text
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            seen.push(word);
            if seen.len() == 10 {
                break;
            }
        }
    }
    // Tokens and Audit are an administrator's (this login is one).
    assert_eq!(
        seen,
        [
            "Overview",
            "Plugins",
            "Tools",
            "Approvals",
            "Activity",
            "Packages",
            "Sessions",
            "Configuration",
            "Tokens",
            "Audit"
        ],
        "nav links by Tab"
    );

    // "Log out" ends the session; `plugd console`'s one-time link logs in
    // again (as serve's user), and works only once.
    b.click_button("header", "Log out").await;
    b.find("form#login input#token").await;
    let r = b
        .js("return fetch('/v1/plugins').then(r => r.status);", vec![])
        .await;
    assert_eq!(r, 401, "the session outlived Log out");
    let o = ws.plugd(&["console"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let link = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let link = link
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no link in {link:?}"))
        .to_owned();
    assert!(link.starts_with(&con.url("/console/login#code=")), "{link}");
    // Opened in a tab already on /console/login, the link changes only the
    // fragment: the page still spends it.
    b.goto(&con.url("/console/login")).await;
    b.find("input#token").await;
    b.goto(&link).await;
    b.wait_text("#whoami", |t| t.contains("(admin)")).await;
    b.find("table#plugins").await;
    b.goto("about:blank").await;
    b.goto(&link).await;
    let msg = b.wait_text("#login-error", |t| !t.trim().is_empty()).await;
    assert!(msg.contains("did not work"), "{msg}");
    con.close().await;
}

/// The consent screen shows the plugin's real command line before Approve;
/// after the click the page shows it running without a reload, and serve's
/// API agrees. The plugins list at 390 px has no horizontal overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_approves_a_plugin_after_showing_its_command_line() {
    let ws = workspace(false);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;

    con.route("#/plugins").await;
    let row = format!("table#plugins tr[data-plugin=\"{FIXTURE}\"]");
    let st = b
        .wait_text(&format!("{row} td.state"), |t| !t.is_empty())
        .await;
    assert!(st.starts_with("unapproved"), "{st}");
    b.find(&format!("{row} a[href=\"#/plugins/{FIXTURE}\"]"))
        .await;
    con.screenshots("plugins").await;

    // The consent screen: the real command, before any Approve.
    b.find(&format!("{row} a[href=\"#/plugins/{FIXTURE}\"]"))
        .await
        .click()
        .await
        .unwrap();
    let show = ws.plugd(&["plugin", "show", FIXTURE, "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let show: Value = serde_json::from_slice(&show.stdout).unwrap();
    let argv: Vec<&str> = show["command"]
        .as_array()
        .unwrap_or_else(|| panic!("no command in plugin show: {show}"))
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(argv.iter().any(|a| a.ends_with("main.py")), "{argv:?}");
    let cmd = b
        .wait_text("section#consent pre#command-line", |t| !t.is_empty())
        .await;
    assert_eq!(cmd.trim(), argv.join(" "), "the page's command line");
    for id in [
        "environment",
        "sandbox",
        "permissions",
        "signature",
        "digest",
    ] {
        b.find(&format!("section#consent #{id}")).await;
    }
    let digest = b.text_of("section#consent #digest").await.unwrap();
    assert_eq!(digest.trim(), show["digest"].as_str().unwrap());
    assert!(
        b.text_of("#plugin-state")
            .await
            .unwrap()
            .contains("unapproved"),
        "{:?}",
        b.text_of("#plugin-state").await
    );
    assert!(!b.has_button("body", "Revoke").await);
    con.screenshots("consent").await;

    // Approving is offered after what it allows, and asks once more,
    // naming the plugin and its command line.
    assert!(!b.has_button(".plugin-head", "Approve").await);
    let after = b
        .js(
            "const c = document.getElementById('consent'), a = document.getElementById('approve');\
             return !!a && !!(c.compareDocumentPosition(a) & Node.DOCUMENT_POSITION_FOLLOWING);",
            vec![],
        )
        .await;
    assert_eq!(
        after,
        json!(true),
        "the Approve button follows the consent summary"
    );
    assert!(con.hidden("#approve-confirm").await);
    con.mark().await;
    b.click_button("#approve", "Approve…").await;
    let asked = b
        .wait_text("#approve-confirm", |t| t.contains("Confirm approval"))
        .await;
    assert!(
        asked.contains(&format!("Approve {FIXTURE}?")) && asked.contains(&argv.join(" ")),
        "{asked}"
    );
    assert_eq!(
        serve.get(&format!("/v1/plugins/{FIXTURE}")).json()["approved"],
        false,
        "nothing is approved before the confirmation"
    );
    b.click_button("#approve-confirm", "Confirm approval").await;
    b.wait_text("#plugin-state", |t| t.trim() == "running")
        .await;
    con.not_reloaded().await;
    assert_eq!(
        serve.get(&format!("/v1/plugins/{FIXTURE}")).json()["approved"],
        true
    );
    assert_eq!(api_state(&serve, FIXTURE), "running");
    assert!(
        !b.has_button(".plugin-head", "Approve").await
            && b.has_button(".plugin-head", "Revoke").await,
        "after approval: Revoke, not Approve"
    );
    con.screenshots("plugin").await;

    // The list follows; on a phone it fits the screen's width.
    con.route("#/plugins").await;
    b.wait_text(&format!("{row} td.state"), |t| t.starts_with("running"))
        .await;
    con.not_reloaded().await;
    b.viewport(390, 844, true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let width = b
        .js("return document.documentElement.scrollWidth;", vec![])
        .await;
    assert!(
        width.as_u64().unwrap() <= 390,
        "the plugins page is {width} px wide at 390"
    );
    b.viewport(1280, 800, false).await;
    con.close().await;
}

/// The settings form: a select, a field shown only for one of its values, a
/// group, an integer, a boolean and a secret. Saved from the page, the
/// plugin receives them all (its show_config tool echoes its config, the
/// secret as a SHA-256); afterwards the secret shows `set` and its value is
/// in neither the DOM nor any response the page received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_settings_form_reaches_the_plugin_and_keeps_the_secret() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route(&format!("#/plugins/{FIXTURE}")).await;

    let form = "form#settings";
    b.find(&format!("{form} select[name=units]")).await;
    // Read in one script: live updates may redraw the form until it has
    // the focus (the page leaves a form being edited alone).
    let controls = b
        .js(
            "const f = document.querySelector('form#settings');\
             const out = {};\
             for (const k of arguments[0]) {\
               const c = f.querySelector(`[name='${k}']`);\
               out[k] = c && {tag: c.tagName.toLowerCase(), type: c.type,\
                 label: !!(c.id && f.querySelector(`label[for='${c.id}']`)),\
                 group: c.closest('details[data-group]')?.dataset.group || null};\
             }\
             return out;",
            vec![json!([
                "units",
                "imperial_note",
                "retries",
                "verbose",
                "api_key"
            ])],
        )
        .await;
    let want = json!({
        "units": {"tag": "select", "type": "select-one", "label": true, "group": "Display"},
        "imperial_note": {"tag": "input", "type": "text", "label": true, "group": "Display"},
        "retries": {"tag": "input", "type": "number", "label": true, "group": "Connection"},
        "verbose": {"tag": "input", "type": "checkbox", "label": true, "group": "Connection"},
        "api_key": {"tag": "input", "type": "password", "label": true, "group": "Connection"},
    });
    assert_eq!(controls, want);
    assert_eq!(
        b.text_of(".secret-state[data-for=api_key]")
            .await
            .as_deref(),
        Some("unset")
    );
    b.js(
        "document.querySelector('form#settings select[name=units]').focus();",
        vec![],
    )
    .await;
    // show_when: hidden while units is metric, shown for imperial.
    assert!(
        con.hidden("[data-field=imperial_note]").await,
        "imperial_note shown for metric"
    );
    b.find(&format!("{form} select[name=units]"))
        .await
        .select_by_value("imperial")
        .await
        .unwrap();
    let shown = b
        .wait_for_opt(Duration::from_secs(5), || async {
            (!con.hidden("[data-field=imperial_note]").await).then_some(())
        })
        .await;
    assert!(shown.is_some(), "imperial_note stayed hidden for imperial");

    let note = b.find(&format!("{form} input[name=imperial_note]")).await;
    note.send_keys("miles, please").await.unwrap();
    let retries = b.find(&format!("{form} input[name=retries]")).await;
    retries.clear().await.unwrap();
    retries.send_keys("5").await.unwrap();
    let verbose = b.find(&format!("{form} input[name=verbose]")).await;
    if !verbose.is_selected().await.unwrap() {
        verbose.click().await.unwrap();
    }
    b.find(&format!("{form} input[name=api_key]"))
        .await
        .send_keys(SECRET)
        .await
        .unwrap();
    con.screenshots_at("settings", Some("#settings-section"))
        .await;
    b.click_button(form, "Save").await;
    b.wait_text("#settings-status", |t| t.starts_with("Saved"))
        .await;

    // The plugin has them (config/changed), the secret included.
    let want_hash = format!("sha256:{}", hex::encode(sha2::Sha256::digest(SECRET)));
    let mut last = Value::Null;
    let got = eventually_blocking(Duration::from_secs(15), || {
        let (status, v) = invoke(&serve, &agent, &format!("{FIXTURE}/show_config"), json!({}));
        assert_eq!(status, 200, "{v}");
        last = serde_json::from_str(result_text(&v)).unwrap_or(Value::Null);
        last["units"] == "imperial"
            && last["imperial_note"] == "miles, please"
            && last["retries"] == 5
            && last["verbose"] == true
            && last["api_key"] == want_hash.as_str()
    });
    assert!(got, "the plugin's config: {last}");

    // The secret shows `set`, its input is empty, and its value is nowhere.
    b.wait_text(".secret-state[data-for=api_key]", |t| t == "set")
        .await;
    // Read in one script: live updates redraw the form at any time.
    let value = b
        .js(
            "const e = document.querySelector(arguments[0]); return e && [e.type, e.value];",
            vec![json!(format!("{form} input[name=api_key]"))],
        )
        .await;
    assert_eq!(value, json!(["password", ""]));
    let dom = b.dom_and_values().await;
    assert!(!dom.contains(SECRET), "the secret is in the DOM");
    let bodies = b.response_bodies().await;
    assert!(
        bodies
            .iter()
            .any(|(u, _)| u.contains(&format!("/v1/plugins/{FIXTURE}/config"))),
        "no settings response was read: {:?}",
        bodies.iter().map(|(u, _)| u).collect::<Vec<_>>()
    );
    for (url, body) in &bodies {
        assert!(!body.contains(SECRET), "the secret came back in {url}");
    }
    // A reload reads the form afresh: still `set`, still not there.
    b.c.refresh().await.unwrap();
    b.wait_text(".secret-state[data-for=api_key]", |t| t == "set")
        .await;
    assert_eq!(
        b.js(
            "return document.querySelector('form#settings select[name=units]').value;",
            vec![]
        )
        .await,
        "imperial"
    );
    assert!(!b.dom_and_values().await.contains(SECRET));
    for (url, body) in b.response_bodies().await {
        assert!(!body.contains(SECRET), "the secret came back in {url}");
    }
    con.close().await;
}

/// Disabling a tool on the page takes it from the agent at once (GET
/// /v1/tools with an agent token, and its calls fail); the try-it form of
/// another tool calls it with typed arguments and shows the result, and an
/// argument the schema requires, left out, shows the tool's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_disables_a_tool_for_the_agent_and_tries_another() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let shout = format!("{FIXTURE}/shout");
    let show = format!("{FIXTURE}/show_config");
    // The first call starts the plugin, so its tools are known.
    let (status, v) = invoke(&serve, &agent, &show, json!({}));
    assert_eq!(status, 200, "{v}");
    assert!(tool_names(&serve, &agent).contains(&show));

    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/tools").await;
    let row = format!("table#tools tr[data-tool=\"{show}\"]");
    let risk = b
        .wait_text(&format!("{row} td.risk"), |t| !t.is_empty())
        .await;
    assert!(risk.contains("low"), "{risk}");
    con.screenshots("tools").await;
    b.click_button(&row, "Disable").await;
    b.find(&format!("{row} td.enabled")).await;
    b.wait_text(&format!("{row} td.enabled"), |t| t == "disabled")
        .await;
    assert!(b.has_button(&row, "Enable").await);
    assert!(
        !tool_names(&serve, &agent).contains(&show),
        "the agent still lists {show}"
    );
    let (status, v) = invoke(&serve, &agent, &show, json!({}));
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("tool_disabled")),
        "{v}"
    );
    assert!(
        tool_names(&serve, &agent).contains(&shout),
        "the other tools stay"
    );

    // Try it: the generated form, typed arguments, the result.
    con.route(&format!("#/tools/{shout}")).await;
    let word = b.find("form#try input[name=word]").await;
    assert_eq!(
        b.stray_text().await,
        Vec::<String>::new(),
        "text beside the tool page's parts"
    );
    // Required fields first (the schema served sorts `times` before `word`).
    let order = b
        .js(
            "return Array.from(document.querySelectorAll('form#try [name]')).map(e => e.name);",
            vec![],
        )
        .await;
    assert_eq!(order, json!(["word", "times"]));
    // Nothing is sent while a field is wrong: each says why beside it.
    let times = b.find("form#try input[name=times]").await;
    assert_eq!(times.attr("type").await.unwrap().as_deref(), Some("number"));
    times.send_keys("one").await.unwrap();
    b.click_button("form#try", "Call").await;
    let why = b.wait_text("#a-word-err", |t| !t.is_empty()).await;
    assert_eq!(why, "required");
    assert_eq!(
        b.text_of("#a-times-err").await.unwrap_or_default(),
        "not a number"
    );
    assert_eq!(
        b.find("form#try input[name=word]")
            .await
            .attr("aria-invalid")
            .await
            .unwrap()
            .as_deref(),
        Some("true")
    );
    assert_eq!(b.text_of("#try-error").await.unwrap_or_default(), "");
    assert!(con.hidden("#try-progress").await, "no empty progress box");
    let records = serve.get("/v1/invocations").json();
    assert!(
        !records.to_string().contains("shout"),
        "a wrong form was sent: {records}"
    );
    word.send_keys("hey").await.unwrap();
    let times = b.find("form#try input[name=times]").await;
    times.clear().await.unwrap();
    times.send_keys("3").await.unwrap();
    b.click_button("form#try", "Call").await;
    // The result as text (not JSON), and a link to its record.
    let out = b
        .wait_text("#try-result pre.result-text", |t| t.contains("HEY"))
        .await;
    assert_eq!(out.trim(), "HEY HEY HEY", "{out}");
    let href = b
        .wait_for("a link to the call's record", || async {
            b.js(
                "const a = document.querySelector('a#try-record'); return a && a.getAttribute('href');",
                vec![],
            )
            .await
            .as_str()
            .map(str::to_owned)
        })
        .await;
    let id = href.strip_prefix("#/activity/").expect(&href).to_owned();
    // Records are written a moment after the call.
    let path = format!("/v1/invocations/{id}");
    assert!(
        eventually_blocking(Duration::from_secs(10), || serve.get(&path).status == 200),
        "no record {id}"
    );
    let record = serve.get(&path);
    assert_eq!(record.json()["tool"], shout, "{}", record.text());
    assert_eq!(b.text_of("#try-error").await.unwrap_or_default(), "");
    con.screenshots("tool").await;
    assert_eq!(b.text_of("#a-word-err").await.unwrap_or_default(), "");
    // Past the form's checks, the tool's own: 9 times is over its maximum.
    let times = b.find("form#try input[name=times]").await;
    times.clear().await.unwrap();
    times.send_keys("9").await.unwrap();
    let word = b.find("form#try input[name=word]").await;
    word.clear().await.unwrap();
    word.send_keys("no").await.unwrap();
    b.click_button("form#try", "Call").await;
    let err = b.wait_text("#try-error", |t| !t.trim().is_empty()).await;
    assert!(
        err.contains("invalid_arguments") || err.contains("times"),
        "{err}"
    );
    assert!(
        !b.text_of("#try-result")
            .await
            .unwrap_or_default()
            .contains("HEY")
    );
    con.close().await;
}

/// serve killed under an open console: a banner says it cannot be reached
/// and the page's actions go inert; serve back on the same address: the
/// banner goes by itself and the page works again, still logged in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_says_when_serve_is_gone_and_comes_back_by_itself() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/plugins").await;
    b.find("table#plugins").await;
    assert!(con.hidden("#offline").await, "a banner while serve answers");
    let inert = || async {
        b.js("return document.getElementById('main').inert;", vec![])
            .await
    };
    assert_eq!(inert().await, json!(false));

    let pid = rustix::process::Pid::from_raw(serve.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    b.wait_for("the unreachable banner", || async {
        (!con.hidden("#offline").await).then_some(())
    })
    .await;
    assert_eq!(
        inert().await,
        json!(true),
        "actions stay live while serve is gone"
    );
    let text = b.text_of("#offline").await.unwrap_or_default();
    assert!(text.contains("cannot be reached"), "{text}");

    let again = Serve::start(&ws, &serve.addr.to_string());
    b.wait_for_opt(Duration::from_secs(20), || async {
        con.hidden("#offline").await.then_some(())
    })
    .await
    .expect("the banner stayed after serve came back");
    assert_eq!(inert().await, json!(false));
    con.route("#/tools").await;
    b.find(&format!("table#tools tr[data-tool=\"{FIXTURE}/shout\"]"))
        .await;
    con.close().await;
    drop(again);
}

/// Two calls of a critical tool wait as pending approvals: the badge shows
/// 2 live, the approvals page lists both; Approve runs one (the caller gets
/// the tool's result), Deny refuses the other (403 call_denied), and the
/// badge goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_approves_one_pending_critical_call_and_denies_another() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/plugins").await;
    b.find("table#plugins").await;
    assert!(
        con.hidden("#approvals-badge").await,
        "a badge with nothing pending"
    );

    let launch = format!("{FIXTURE}/launch");
    let calls: Vec<_> = ["alpha", "beta"]
        .into_iter()
        .map(|target| {
            let (addr, token, launch) = (serve.addr, agent.clone(), launch.clone());
            let serve_ref = SendServe(addr);
            std::thread::spawn(move || serve_ref.invoke(&token, &launch, json!({"target": target})))
        })
        .collect();

    let badge = b.wait_text("#approvals-badge", |t| t.trim() == "2").await;
    assert_eq!(badge.trim(), "2");
    assert!(!con.hidden("#approvals-badge").await);
    con.route("#/approvals").await;
    let rows = b
        .wait_for("two rows in table#approvals", || async {
            let rows = b
                .js(
                    "return Array.from(document.querySelectorAll('table#approvals tr[data-approval]'))\
                     .map(r => ({id: r.dataset.approval, tool: r.querySelector('td.tool')?.textContent,\
                       text: r.textContent}));",
                    vec![],
                )
                .await;
            (rows.as_array()?.len() == 2).then_some(rows)
        })
        .await;
    let mut ids = std::collections::BTreeMap::new();
    for r in rows.as_array().unwrap() {
        assert_eq!(r["tool"], launch.as_str(), "{r}");
        let text = r["text"].as_str().unwrap();
        let target = if text.contains("alpha") {
            "alpha"
        } else {
            "beta"
        };
        ids.insert(target, r["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 2, "{ids:?}");
    // How long each may still wait, and a critical risk that looks apart
    // (a filled cell, not only the colour of a high one).
    let look = b
        .js(
            "const r = document.querySelector('table#approvals tr[data-approval]');\
             const bg = (c) => getComputedStyle(r.querySelector(c)).backgroundColor;\
             return {left: r.querySelector('td.left').textContent,\
                     risk: bg('td.risk-critical'), tool: bg('td.tool')};",
            vec![],
        )
        .await;
    let left = look["left"].as_str().unwrap_or_default();
    assert!(
        left.ends_with('s') && left.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{look}"
    );
    assert_ne!(look["risk"], look["tool"], "{look}");
    // Who asks: the agent's token, over HTTP.
    let who = b
        .text_of("table#approvals tr[data-approval] td.who-asks")
        .await
        .unwrap_or_default();
    assert!(
        who.contains("token:test-agent-") && who.contains("via http"),
        "{who}"
    );
    con.screenshots("approvals").await;
    b.click_button(
        &format!("tr[data-approval=\"{}\"]", ids["alpha"]),
        "Approve",
    )
    .await;
    // A deny reason typed beside the button reaches the caller (typed
    // once the table has redrawn without the approved call).
    b.wait_for("one row left in table#approvals", || async {
        let n = b
            .js(
                "return document.querySelectorAll('table#approvals tr[data-approval]').length;",
                vec![],
            )
            .await;
        (n == json!(1)).then_some(())
    })
    .await;
    b.type_into(
        &format!("tr[data-approval=\"{}\"] input[name=reason]", ids["beta"]),
        "not before the release",
    )
    .await;
    b.click_button(&format!("tr[data-approval=\"{}\"]", ids["beta"]), "Deny")
        .await;
    let results: Vec<(u16, Value)> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(results[0].0, 200, "{:?}", results[0]);
    assert_eq!(result_text(&results[0].1), "launched alpha");
    assert_eq!(results[1].0, 403, "{:?}", results[1]);
    assert_eq!(
        results[1].1["error"]["code"], "call_denied",
        "{:?}",
        results[1]
    );
    assert!(
        results[1].1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not before the release")),
        "{:?}",
        results[1]
    );
    b.wait_for_opt(Duration::from_secs(10), || async {
        con.hidden("#approvals-badge").await.then_some(())
    })
    .await
    .expect("the badge stayed after both calls were decided");
    b.find("#approvals-empty").await;
    // In the activity, the denied call reads as denied, not as a failure.
    con.route("#/activity").await;
    let statuses = b
        .wait_for("both calls in table#invocations", || async {
            let v = b
                .js(
                    "return Array.from(document.querySelectorAll('table#invocations td.status'))\
                     .map(td => td.textContent);",
                    vec![],
                )
                .await;
            let v: Vec<String> = serde_json::from_value(v).ok()?;
            (v.len() >= 2).then_some(v)
        })
        .await;
    assert!(
        statuses.iter().any(|s| s == "denied (refused)")
            && statuses.iter().any(|s| s == "succeeded"),
        "{statuses:?}"
    );
    con.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_a_held_plugd_yaml_change_and_an_admin_approves_it() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/config").await;
    b.find("#config-nothing").await;
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!("sandbox:\n  plugins:\n    {FIXTURE}: {{baseline: false}}\n"),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while serve.get("/v1/config").json()["pending"].is_null() {
        assert!(std::time::Instant::now() < deadline, "nothing held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    con.route("#/plugins").await;
    con.route("#/config").await;
    let want = format!("widens: sandbox.plugins.{FIXTURE}.baseline: true -> false");
    let held = b.wait_text("#config-held", |t| t.contains(&want)).await;
    assert!(
        held.contains("+    console-settings: {baseline: false}"),
        "{held}"
    );
    b.click_button("#config-held", "Approve").await;
    b.find("#config-nothing").await;
    assert!(serve.get("/v1/config").json()["pending"].is_null());
    let state = serve.get(&format!("/v1/plugins/{FIXTURE}")).json();
    assert_eq!(state["permissions"]["baseline"]["state"], "off", "{state}");
    con.close().await;
}

/// serve's address, for a call from another thread.
struct SendServe(std::net::SocketAddr);

impl SendServe {
    fn invoke(&self, token: &str, name: &str, args: Value) -> (u16, Value) {
        use std::io::{Read, Write};
        let body = json!({"args": args}).to_string();
        let mut s = std::net::TcpStream::connect(self.0).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        write!(
            s,
            "POST /v1/tools/{name}:invoke HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.0,
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// A plugin that crashes shows up as failed, with its reason, live; Restart
/// on the page brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_a_crash_as_failed_and_restarts_it() {
    let ws = Ws::new();
    // No restart budget: the first crash is final until an operator acts.
    ws.misbehave(
        "crashy",
        "good",
        None,
        "[plugin.supervisor]\nstart = \"eager\"\nrestart_attempts = 0\n",
    );
    let o = ws.plugd(&["plugin", "approve", "crashy"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    assert!(
        eventually_blocking(Duration::from_secs(20), || api_state(&serve, "crashy")
            == "running"),
        "{}",
        api_state(&serve, "crashy")
    );
    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/plugins/crashy").await;
    b.wait_text("#plugin-state", |t| t.trim() == "running")
        .await;
    con.mark().await;

    let (status, v) = invoke(&serve, &agent, "crashy_crash", json!({}));
    assert!(status >= 500, "{status} {v}");
    b.wait_text("#plugin-state", |t| t.trim() == "failed").await;
    let reason = b
        .wait_text("#plugin-reason", |t| !t.trim().is_empty())
        .await;
    assert!(!reason.is_empty());
    con.not_reloaded().await;
    assert_eq!(api_state(&serve, "crashy"), "failed");
    con.screenshots("failed").await;
    con.route("#/plugins").await;
    let st = b
        .wait_text("tr[data-plugin=crashy] td.state", |t| {
            t.starts_with("failed")
        })
        .await;
    assert!(st.len() > "failed".len(), "no reason in the list: {st:?}");

    con.route("#/plugins/crashy").await;
    b.click_button(".plugin-head", "Restart").await;
    b.wait_text("#plugin-state", |t| t.trim() == "running")
        .await;
    assert_eq!(api_state(&serve, "crashy"), "running");
    let (status, v) = invoke(&serve, &agent, "crashy_echo", json!({"x": 1}));
    assert_eq!(status, 200, "{v}");
    con.close().await;
}

/// A viewer reads everything but gets no button it could not use: no
/// Approve on an unapproved plugin, no Revoke/Stop/Restart on a running
/// one, no Disable on tools, no Save in settings, no Approve/Deny on a
/// pending call, no Call on a tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_viewer_sees_no_buttons_it_cannot_use() {
    let ws = workspace(true);
    ws.example("hello-salmex-python"); // left unapproved
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let viewer = make_token(&ws, "viewer");
    let agent = make_token(&ws, "agent");
    let (status, v) = invoke(&serve, &agent, &format!("{FIXTURE}/show_config"), json!({}));
    assert_eq!(status, 200, "{v}");
    let pending = {
        let (addr, token, name) = (serve.addr, agent.clone(), format!("{FIXTURE}/launch"));
        std::thread::spawn(move || {
            SendServe(addr).invoke(&token, &name, json!({"target": "gamma"}))
        })
    };

    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&viewer, "viewer").await;
    let none = [
        "Approve", "Revoke", "Stop", "Start", "Restart", "Disable", "Enable", "Save", "Deny",
        "Call",
    ];
    let check = |what: &'static str| async move {
        let labels = b.button_labels("body").await;
        // The check sees buttons: the viewer's own "Log out" is one.
        assert!(
            labels.iter().any(|l| l == "Log out"),
            "{labels:?} on {what}"
        );
        for label in none {
            assert!(
                !labels.iter().any(|l| l == label),
                "a viewer sees {label:?} on {what}: {labels:?}"
            );
        }
    };
    con.route("#/plugins/hello-salmex-python").await;
    b.wait_text("#plugin-state", |t| t.contains("unapproved"))
        .await;
    b.find("pre#command-line").await;
    check("an unapproved plugin").await;
    // No administrator's screens in its menu, no rows to tick for bulk
    // actions.
    let nav = b
        .js(
            "return [...document.querySelectorAll('nav a')].filter(a => a.getClientRects().length).map(a => a.dataset.nav);",
            vec![],
        )
        .await;
    assert!(nav.as_array().is_some_and(|n| n.len() == 8), "{nav}");
    assert!(
        !nav.to_string().contains("tokens") && !nav.to_string().contains("audit"),
        "{nav}"
    );
    con.route("#/plugins").await;
    b.find(&format!("table#plugins tr[data-plugin=\"{FIXTURE}\"]"))
        .await;
    let picks = b
        .js(
            "return document.querySelectorAll('table#plugins input[type=checkbox]').length;",
            vec![],
        )
        .await;
    assert_eq!(picks, 0);
    con.route(&format!("#/plugins/{FIXTURE}")).await;
    b.wait_text("#plugin-state", |t| t.trim() == "running")
        .await;
    b.find(&format!("table#tools tr[data-tool=\"{FIXTURE}/shout\"]"))
        .await;
    b.find("form#settings select[name=units]").await;
    check("a running plugin").await;
    con.route("#/tools").await;
    b.find(&format!("table#tools tr[data-tool=\"{FIXTURE}/shout\"]"))
        .await;
    check("the tools").await;
    con.route(&format!("#/tools/{FIXTURE}/shout")).await;
    b.find("form#try").await;
    check("a tool").await;
    b.wait_text("#approvals-badge", |t| t.trim() == "1").await;
    con.route("#/approvals").await;
    b.find("table#approvals tr[data-approval]").await;
    check("the approvals").await;
    con.close().await;
    // Let the pending call go (denied by the admin).
    let list = serve.get("/v1/approvals").json();
    let id = list["approvals"]
        .as_array()
        .or(list.as_array())
        .and_then(|a| a.first())
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .unwrap();
    assert_eq!(
        serve
            .post(&format!("/v1/approvals/{id}:deny"), &json!({}))
            .status,
        200
    );
    assert_eq!(pending.join().unwrap().0, 403);
}

/// Activity and logs: calls made by an agent show up on the activity page
/// live (no reload), the status filter keeps only failures, a record opens
/// with its trace id; a plugin's stderr line, written when its settings
/// change, appears in its page's live log; the packages page says why it is
/// empty instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_activity_records_and_a_live_log() {
    let ws = workspace(true);
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    let shout = format!("{FIXTURE}/shout");
    let (status, v) = invoke(&serve, &agent, &shout, json!({"word": "a", "times": 1}));
    assert_eq!(status, 200, "{v}");

    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;
    con.route("#/activity").await;
    b.wait_for("one record listed", || async {
        let n = b
            .js(
                "return document.querySelectorAll('table#invocations tbody tr').length;",
                vec![],
            )
            .await;
        (n.as_u64() == Some(1)).then_some(())
    })
    .await;
    con.mark().await;
    // A failed call (a missing required argument) appears without a reload.
    let (status, v) = invoke(&serve, &agent, &shout, json!({"times": 2}));
    assert_eq!(status, 422, "{v}");
    let failed = b
        .wait_for("the failed call listed live", || async {
            let v = b
                .js(
                    "return [...document.querySelectorAll('table#invocations tbody tr')].map(r => [r.dataset.invocation, r.querySelector('td.status').textContent]);",
                    vec![],
                )
                .await;
            let rows = v.as_array().cloned().unwrap_or_default();
            (rows.len() == 2)
                .then(|| {
                    // Stopped before it ran: it reads as refused, not as
                    // the tool failing.
                    rows.into_iter().find(|r| {
                        r[1].as_str().unwrap_or("") == "refused: invalid arguments (invalid_arguments)"
                    })
                })
                .flatten()
        })
        .await;
    con.not_reloaded().await;
    let failed_id = failed[0].as_str().unwrap().to_owned();
    // The status filter keeps only the failure.
    let status_select = b.find("form#activity-filter select[name=status]").await;
    status_select.select_by_value("failed").await.unwrap();
    b.click_button("form#activity-filter", "Filter").await;
    b.wait_for("only the failure listed", || async {
        let ids = b
            .js(
                "return [...document.querySelectorAll('table#invocations tbody tr')].map(r => r.dataset.invocation);",
                vec![],
            )
            .await;
        (ids == json!([failed_id])).then_some(())
    })
    .await;
    // Opened: its tool, status and trace id, as the API has them.
    con.route(&format!("#/activity/{failed_id}")).await;
    let trace = b.wait_text("#trace-id", |t| !t.is_empty()).await;
    // Its error with the message, and no bodies (records.keep_bodies is off).
    let message = b.wait_text("#error-message", |t| !t.is_empty()).await;
    assert!(message.contains("word"), "{message}");
    let args = b.text_of("#record-args").await.unwrap_or_default();
    assert!(args.contains("records.keep_bodies"), "{args}");
    assert_eq!(
        b.stray_text().await,
        Vec::<String>::new(),
        "text beside the record's parts"
    );
    let record = request_as(
        &serve,
        &serve.token,
        "GET",
        &format!("/v1/invocations/{failed_id}"),
        &[],
        None,
    )
    .json();
    let want = record["trace_id"].as_str().unwrap_or("(no trace)");
    assert_eq!(trace, want, "{record}");
    let heading = b.text_of("main h1").await.unwrap_or_default();
    assert!(
        heading.contains(&shout) && heading.contains("failed"),
        "{heading}"
    );

    // The live log: a settings change makes the plugin write to stderr.
    con.route(&format!("#/plugins/{FIXTURE}")).await;
    b.find("pre#log").await;
    let body = json!({"values": {"retries": 7}}).to_string();
    let r = request_as(
        &serve,
        &serve.token,
        "PUT",
        &format!("/v1/plugins/{FIXTURE}/config"),
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let log = b
        .wait_text("pre#log", |t| t.contains("config changed"))
        .await;
    assert!(log.contains("retries"), "{log}");

    // Packages with no marketplace configured: the reason, and empty tables.
    con.route("#/packages").await;
    let market = b
        .wait_text("section#marketplace", |t| t.contains("marketplace"))
        .await;
    assert!(
        market.to_lowercase().contains("not configured")
            || market.contains("marketplace_not_configured"),
        "{market}"
    );
    b.find("table#packages").await;
    b.find("table#bindings").await;
    con.close().await;
}
