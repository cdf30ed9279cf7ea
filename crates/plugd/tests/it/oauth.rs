//! plugd as an OAuth 2.1 protected resource and the console's single
//! sign-on (issue 28), against a real OpenID Connect provider (npm
//! `oidc-provider`, `tests/fixtures/oidc/provider.mjs`): its JWT access
//! tokens call `/mcp` and the API; tokens of the wrong audience, expired,
//! of another issuer, unsigned (`alg: none`) or signed by a key it never
//! published get `401` with the `WWW-Authenticate` challenge that names
//! the protected resource metadata; a rotated key is accepted once the
//! JWKS is fetched again; groups map to roles (no mapped group: `403`) and
//! reach the per-tool policy as `caller.groups`; the official Python MCP
//! SDK runs its whole OAuth flow (discovery from the 401, registration,
//! PKCE, token, call); and the console signs in through the provider's
//! page in Chromium, shows what the mapped role may see, and logs out,
//! here and at the provider's `end_session_endpoint`, back to the login
//! page.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::{Value, json};

use crate::gateway::{initialize, mcp_post};
use crate::http::{Resp, Serve, request_as};
use crate::risk::{runs, workspace};
use crate::support::{path_with_venv, repo};

/// A running `tests/fixtures/oidc/provider.mjs`; stopped on drop.
pub(crate) struct Idp {
    child: Child,
    pub(crate) issuer: String,
    addr: SocketAddr,
}

impl Idp {
    pub(crate) fn start() -> Idp {
        let tools = repo().join(".npm-tools");
        assert!(
            tools
                .join("node_modules/oidc-provider/package.json")
                .exists(),
            "{} has no oidc-provider: run ./scripts/test, which installs it",
            tools.display()
        );
        #[allow(clippy::disallowed_methods)] // the test's own provider, killed on drop
        let mut child = Command::new("node")
            .arg(repo().join("tests/fixtures/oidc/provider.mjs"))
            .env("NPM_TOOLS_DIR", &tools)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let Some(issuer) = line.trim().strip_prefix("READY ") else {
            let _ = child.kill();
            panic!("the OIDC provider did not start: {line:?}");
        };
        let addr = issuer.strip_prefix("http://").unwrap().parse().unwrap();
        Idp {
            child,
            issuer: issuer.to_owned(),
            addr,
        }
    }

    /// One HTTP/1.0 request to the provider; status and JSON body.
    pub(crate) fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text[9..12].parse().unwrap();
        let json = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str(b).ok())
            .unwrap_or(Value::Null);
        (status, json)
    }

    /// An access token of `user` for `resource`, through the real code flow.
    pub(crate) fn token(&self, user: &str, resource: &str) -> String {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("user", user)
            .append_pair("resource", resource)
            .finish();
        let (status, v) = self.call("GET", &format!("/test/token?{q}"), None);
        assert_eq!(status, 200, "{v}");
        v["access_token"].as_str().unwrap().to_owned()
    }

    /// `claims` signed by the provider's current key (or by a key it never
    /// published).
    pub(crate) fn sign(&self, claims: Value, foreign: bool) -> String {
        let key = if foreign { "foreign" } else { "current" };
        let (status, v) = self.call(
            "POST",
            "/test/sign",
            Some(&json!({"claims": claims, "key": key})),
        );
        assert_eq!(status, 200, "{v}");
        v["token"].as_str().unwrap().to_owned()
    }

    fn rotate(&self) -> String {
        let (status, v) = self.call("POST", "/test/rotate", Some(&json!({})));
        assert_eq!(status, 200, "{v}");
        v["kid"].as_str().unwrap().to_owned()
    }

    /// Registers the console's callback `redirect`, and the console's
    /// login page beside it as where a logout may return.
    pub(crate) fn configure_console(&self, redirect: &str) {
        let back = redirect.replace("/console/sso/callback", "/console/login");
        let (status, v) = self.call(
            "POST",
            "/test/configure",
            Some(&json!({ "console_redirect": redirect, "post_logout_redirect": back })),
        );
        assert_eq!(status, 200, "{v}");
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` without its ANSI colour sequences.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// plugd.yaml with `auth:` for `issuer` and a `deny` for interns.
pub(crate) fn config(issuer: &str) -> String {
    format!(
        r#"auth:
  scopes_supported: [mcp]
  issuers:
    - issuer: {issuer}
      audience: plugd
      client_id: console
  role_mapping:
    - {{group: admins, role: admin}}
    - {{group: interns, role: agent}}
    - {{group: viewers, role: viewer}}
    - {{group: acme-devs, role: agent, org: acme}}
policy:
  - name: no-lo-for-interns
    when: '"interns" in caller.groups && tool.name == "risky/lo"'
    effect: deny
"#
    )
}

fn mcp_tools(serve: &Serve, token: &str) -> (String, Vec<String>) {
    let r = mcp_post(serve, token, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let sid = r.header("mcp-session-id").unwrap().to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let r = mcp_post(serve, token, "/mcp", Some(&sid), &list);
    assert_eq!(r.status, 200, "{}", r.text());
    let names = r.json()["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    (sid, names)
}

fn get(serve: &Serve, token: &str, path: &str) -> Resp {
    request_as(serve, token, "GET", path, &[], None)
}

/// A `401` with the challenge naming the metadata document of `serve`.
fn assert_challenged(serve: &Serve, r: &Resp, invalid_token: bool, what: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.text());
    let h = r
        .header("www-authenticate")
        .unwrap_or_else(|| panic!("{what}: no WWW-Authenticate"));
    let url = format!(
        "http://{}/.well-known/oauth-protected-resource/mcp",
        serve.addr
    );
    assert!(
        h.starts_with("Bearer ") && h.contains(&format!("resource_metadata=\"{url}\"")),
        "{what}: {h}"
    );
    assert_eq!(
        h.contains("error=\"invalid_token\""),
        invalid_token,
        "{what}: {h}"
    );
}

#[test]
fn jwt_access_tokens_of_the_issuer_are_checked_mapped_and_reach_policy() {
    let idp = Idp::start();
    let ws = workspace(&config(&idp.issuer));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let resource = format!("http://{}/mcp", serve.addr);

    // The protected resource metadata, public, in both forms.
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let r = get(&serve, "", path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let doc = r.json();
        assert_eq!(doc["resource"], resource.as_str(), "{doc}");
        assert_eq!(doc["authorization_servers"], json!([idp.issuer]), "{doc}");
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]), "{doc}");
        assert_eq!(doc["scopes_supported"], json!(["mcp"]), "{doc}");
    }
    let r = get(&serve, "", "/.well-known/oauth-protected-resource/other");
    assert_eq!(r.status, 404, "{}", r.text());

    // No token: the challenge, without error=.
    for path in ["/mcp", "/v1/tools"] {
        let r = request_as(&serve, "", "POST", path, &[], None);
        assert_challenged(&serve, &r, false, path);
    }

    // alice (admins → admin): /mcp tools/call and the API.
    let alice = idp.token("alice", &resource);
    let (sid, tools) = mcp_tools(&serve, &alice);
    let lo = tools
        .iter()
        .find(|t| t.ends_with("lo"))
        .unwrap_or_else(|| panic!("{tools:?}"))
        .clone();
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": lo, "arguments": {}}});
    let r = mcp_post(&serve, &alice, "/mcp", Some(&sid), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["result"].is_object(), "{}", r.text());
    assert_eq!(runs(&ws, "lo"), 1);
    let r = request_as(
        &serve,
        &alice,
        "POST",
        "/v1/tools/risky/plain:invoke",
        &[("Content-Type", "application/json")],
        Some(b"{\"args\": {}}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(&serve, &alice, "/v1/tokens").status, 200);

    // bob (interns → agent): the deny on caller.groups hides risky/lo from
    // his tools/list; his role keeps him from the admin's routes.
    let bob = idp.token("bob", &resource);
    let (_, bobs) = mcp_tools(&serve, &bob);
    assert!(!bobs.contains(&lo), "{bobs:?}");
    assert_eq!(bobs.len() + 1, tools.len(), "{bobs:?} {tools:?}");
    let r = get(&serve, &bob, "/v1/tokens");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("agent"), "{}", r.text());
    let listed = get(&serve, &bob, "/v1/tools");
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(!listed.text().contains("risky/lo"), "{}", listed.text());

    // carol (visitors, mapped to nothing): no access.
    let carol = idp.token("carol", &resource);
    for path in ["/v1/tools", "/mcp"] {
        let r = request_as(&serve, &carol, "POST", path, &[], None);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.text().contains("role_mapping"), "{}", r.text());
    }

    // plugd tokens keep working.
    assert_eq!(get(&serve, &serve.token.clone(), "/v1/tools").status, 200);

    // Refused tokens: 401 with the challenge and error="invalid_token",
    // each cause in the log, never the token.
    let claims = |f: &dyn Fn(&mut Value)| {
        let mut c = json!({"iss": idp.issuer, "sub": "alice", "aud": "plugd",
            "exp": now() + 300, "iat": now(), "groups": ["admins"]});
        f(&mut c);
        c
    };
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let bad = [
        (
            idp.sign(claims(&|c| c["aud"] = json!("someone-else")), false),
            "wrong_audience",
        ),
        (
            idp.sign(claims(&|c| c["exp"] = json!(now() - 600)), false),
            "expired",
        ),
        (
            idp.sign(claims(&|c| c["iss"] = json!("http://127.0.0.1:1")), false),
            "wrong_issuer",
        ),
        (
            format!("{}.{}.", b64(json!({"alg": "none"})), b64(claims(&|_| {}))),
            "alg_none",
        ),
        (idp.sign(claims(&|_| {}), true), "unknown_kid"),
        (
            {
                // A valid token with its payload swapped: the signature fails.
                let good = idp.sign(claims(&|_| {}), false);
                let parts: Vec<&str> = good.split('.').collect();
                format!(
                    "{}.{}.{}",
                    parts[0],
                    b64(claims(&|c| c["sub"] = json!("mallory"))),
                    parts[2]
                )
            },
            "bad_signature",
        ),
        ("x".repeat(20_000), "too_large"),
    ];
    for (token, cause) in &bad {
        for path in ["/mcp", "/v1/tools"] {
            let r = request_as(&serve, token, "POST", path, &[], None);
            assert_challenged(&serve, &r, true, cause);
        }
    }
    let log = plain(&serve.log_text());
    for (token, cause) in &bad {
        assert!(
            log.contains(&format!("cause=\"{cause}\"")),
            "{cause} not logged:\n{log}"
        );
        assert!(!log.contains(token.as_str()), "a token was logged");
    }
    assert!(!log.contains(&alice), "a token was logged");

    // Rotation: a token signed by a new key passes once the JWKS is
    // fetched again (at most every 5 s per issuer; the unknown kid above
    // fetched it last).
    let kid = idp.rotate();
    std::thread::sleep(Duration::from_millis(5_200));
    let rotated = idp.token("alice", &resource);
    let header: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(rotated.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["kid"], kid.as_str());
    let r = get(&serve, &rotated, "/v1/tools");
    assert_eq!(r.status, 200, "{}", r.text());
    // And the old key's tokens still pass (both keys are published).
    assert_eq!(get(&serve, &alice, "/v1/tools").status, 200);
    let (_, log) = serve.stop();
    assert!(log.contains("oidc:127.0.0.1:"), "{log}");
}

#[test]
fn without_auth_issuers_nothing_changes() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    for token in ["", serve.token.as_str()] {
        let r = get(&serve, token, "/.well-known/oauth-protected-resource");
        assert_eq!(r.status, 404, "{}", r.text());
    }
    let r = request_as(&serve, "", "POST", "/mcp", &[], None);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"plugd\""));
    // A JWT-looking token is just a wrong plugd token.
    let r = request_as(
        &serve,
        "eyJhbGciOiJSUzI1NiJ9.e30.x",
        "GET",
        "/v1/tools",
        &[],
        None,
    );
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"plugd\""));
}

#[test]
fn the_python_mcp_sdk_runs_its_oauth_flow_against_mcp() {
    let idp = Idp::start();
    let ws = workspace(&config(&idp.issuer));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let url = format!("http://{}/mcp", serve.addr);
    let started = Instant::now();
    // Bounded: coreutils' timeout ends a client that hangs.
    #[allow(clippy::disallowed_methods)] // the SDK client, run to its end
    let out = Command::new("timeout")
        .arg("90")
        .arg(repo().join(".venv/bin/python3"))
        .arg(repo().join("tests/fixtures/oidc/mcp_oauth_client.py"))
        .args([&url, "alice", "pw-alice", "lo"])
        .env("PATH", path_with_venv())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the client hung"
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(report.get("error").is_none(), "{report}");
    let authorize = report["authorize_url"].as_str().unwrap();
    assert!(
        authorize.starts_with(&format!("{}/auth?", idp.issuer)),
        "{authorize}"
    );
    for part in ["code_challenge=", "code_challenge_method=S256", "resource="] {
        assert!(authorize.contains(part), "{part}: {authorize}");
    }
    assert!(
        report["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t.as_str().unwrap().ends_with("lo")),
        "{report}"
    );
    assert_eq!(report["call"]["is_error"], false, "{report}");
    assert_eq!(runs(&ws, "lo"), 1);
    let (_, log) = serve.stop();
    assert!(log.contains("oidc:127.0.0.1:"), "{log}");
}

/// Signs in on the console through the provider's login page as `user`.
async fn sso_login(b: &crate::browser::Browser, serve: &Serve, user: &str) {
    b.goto(&format!("http://{}/console/login", serve.addr))
        .await;
    let link = b.find("#sso a#sso-0").await;
    assert!(
        link.text()
            .await
            .unwrap()
            .starts_with("Sign in with 127.0.0.1:"),
        "{:?}",
        link.text().await
    );
    link.click().await.unwrap();
    b.type_into("#idp-user", user).await;
    b.type_into("#idp-password", &format!("pw-{user}")).await;
    b.find("#idp-submit").await.click().await.unwrap();
}

/// Asserts that the browser holds no console session: the console's page
/// sends it to the login page.
async fn assert_logged_out(b: &crate::browser::Browser, serve: &Serve) {
    b.goto(&format!("http://{}/console/#/plugins", serve.addr))
        .await;
    b.wait_for("the login page", || async {
        let url = b.c.current_url().await.ok()?;
        url.path().ends_with("/console/login").then_some(())
    })
    .await;
    b.find("form#login input#token").await;
}

/// Whether the console's Tokens menu entry is shown.
async fn tokens_menu_shown(b: &crate::browser::Browser) -> bool {
    b.js(
        "return getComputedStyle(document.querySelector('li.admin-only')).display !== 'none';",
        vec![],
    )
    .await
        == json!(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_with_the_provider_maps_groups_and_logs_out() {
    let idp = Idp::start();
    let ws = workspace(&config(&idp.issuer));
    let serve = Serve::start(&ws, "127.0.0.1:0");
    idp.configure_console(&format!("http://{}/console/sso/callback", serve.addr));
    let b = crate::browser::Browser::start().await;

    // alice (admins → admin): the Tokens menu.
    sso_login(&b, &serve, "alice").await;
    let who = b.wait_text("#whoami", |t| t.contains("(admin)")).await;
    assert!(
        who.starts_with("oidc:127.0.0.1:") && who.contains("/alice"),
        "{who}"
    );
    assert!(tokens_menu_shown(&b).await);
    // Logout ends the session here and at the provider: the page goes to
    // its end_session_endpoint (with the ID token as hint and the console's
    // login page as the way back), whose confirmation lands on that page.
    b.find("#logout").await.click().await.unwrap();
    let end = b
        .wait_for("the provider's end-session page", || async {
            let url = b.c.current_url().await.ok()?;
            (url.as_str().starts_with(&idp.issuer) && url.path().starts_with("/session/end"))
                .then_some(url)
        })
        .await;
    let q: std::collections::HashMap<String, String> = end.query_pairs().into_owned().collect();
    let back = format!("http://{}/console/login", serve.addr);
    assert_eq!(q.get("post_logout_redirect_uri"), Some(&back), "{end}");
    assert_eq!(
        q.get("client_id").map(String::as_str),
        Some("console"),
        "{end}"
    );
    let hint = q.get("id_token_hint").expect("an id_token_hint");
    assert_eq!(hint.split('.').count(), 3, "{hint}");
    b.find("button[name=logout][value=yes]")
        .await
        .click()
        .await
        .unwrap();
    b.wait_for("the console's login page", || async {
        let url = b.c.current_url().await.ok()?;
        url.as_str().starts_with(&back).then_some(())
    })
    .await;
    b.find("form#login").await;
    assert_logged_out(&b, &serve).await;

    // dave (viewers → viewer): no Tokens menu. The provider's own session
    // (cookies on 127.0.0.1) goes first, so its login page shows again.
    b.cdp("Network.clearBrowserCookies", json!({}))
        .await
        .unwrap();
    sso_login(&b, &serve, "dave").await;
    b.wait_text("#whoami", |t| t.contains("(viewer)")).await;
    assert!(!tokens_menu_shown(&b).await);

    // erin (acme-devs → agent in org acme): an org session, mapped again
    // on every request from what the sign-in said.
    b.cdp("Network.clearBrowserCookies", json!({}))
        .await
        .unwrap();
    sso_login(&b, &serve, "erin").await;
    b.wait_text("#whoami", |t| t.contains("(agent)")).await;
    let who = b
        .js(
            "return fetch('/console/session').then((r) => r.json());",
            vec![],
        )
        .await;
    assert_eq!(who["org_id"], "acme", "{who}");
    assert_eq!(who["role"], "agent", "{who}");

    // carol (a group mapped to nothing): a clear refusal, no session.
    b.cdp("Network.clearBrowserCookies", json!({}))
        .await
        .unwrap();
    sso_login(&b, &serve, "carol").await;
    let msg = b.wait_text("#sso-message", |t| !t.is_empty()).await;
    assert!(
        msg.contains("role_mapping") && msg.contains("visitors"),
        "{msg}"
    );
    assert_logged_out(&b, &serve).await;
    b.close().await;
    let (_, log) = serve.stop();
    let log = plain(&log);
    assert!(log.contains("console login by single sign-on"), "{log}");
    assert!(log.contains("cause=\"no_role\""), "{log}");
}
