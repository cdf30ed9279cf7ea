//! Calls through bindings over real HTTP: a Python-stdlib `vai.rpc.v1`
//! package in two versions pushed to a real `docker-registry`, pulled by a
//! real serve, bound per org and project, and called with org tokens at
//! `POST /v1/plugin-tools/{export}:invoke`. Rollout 100/0 and 50/50 checked
//! call by call against the SHA-256 rule; the binding's config and secret
//! reach the plugin's context and nothing else (answers, errors, records,
//! serve's log); org isolation both ways; invocation records' fields; a
//! lying package, a deleted secret and malformed bodies. Installed files
//! changed (edited, added, replaced by a symlink) before the first call or
//! after it never run, a pull restores them, and `plugd package restart` /
//! `POST /v1/plugin-packages/{id}:restart` recover a failed package process
//! without restarting serve.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plugd_control::Binding;
use serde_json::{Value, json};

use crate::http::{Resp, Serve, request_as};
use crate::packages::{Registry, json_out, push};
use crate::support::{Ws, eventually_blocking, ok, plugd_cmd, stderr};

const MASTER_KEY: &str = crate::support::TEST_MASTER_KEY;

/// The org secret the bindings use; the plugin answers it reversed.
pub(crate) const SECRET: &str = "tok-A1b2C3d4e5";

/// The test plugin: hello as argv[1]@argv[2]; `whoami` answers what its
/// context holds (the secret reversed and echoed as is, which plugd must
/// mask) and prints the secret on stderr; `leak` fails with the secret in
/// its message.
const PLUGIN: &str = r#"import json, os, sys, threading
PKG, VER = sys.argv[1], sys.argv[2]
INSTANCE = os.urandom(8).hex()
out, inp, lock = sys.stdout.buffer, sys.stdin.buffer, threading.Lock()
def send(o):
    b = json.dumps(o).encode()
    with lock:
        out.write(b"Content-Length: %d\r\n\r\n" % len(b) + b); out.flush()
def read():
    n = None
    while True:
        l = inp.readline()
        if not l: return None
        l = l.strip()
        if not l: break
        k, _, v = l.partition(b":")
        if k.strip().lower() == b"content-length": n = int(v)
    return json.loads(inp.read(n or 0))
def reply(rid, body):
    send({"protocol": "vai.rpc.v1", "type": "response", "id": rid, "ok": True, "body": body})
send({"protocol": "vai.rpc.v1", "type": "hello", "role": "plugin", "plugin": {"package_id": PKG, "version": VER}})
while True:
    m = read()
    if m is None or m.get("type") == "shutdown": break
    if m.get("type") != "request": continue
    b = m.get("body") or {}
    ctx = b.get("context") or {}
    tok = (ctx.get("secrets") or {}).get("api_token", "")
    sys.stderr.write("the token is %s\n" % tok); sys.stderr.flush()
    if b.get("export_id") == "leak":
        reply(m["id"], {"status": "failed", "result": {"content": [{"type": "text", "text": "refused token " + tok}], "is_error": True, "retryable": False}})
        continue
    reply(m["id"], {"status": "succeeded", "result": {"content": [{"type": "text", "text": "token " + tok}], "is_error": False, "retryable": False, "structured_output": {
        "version": VER, "instance": INSTANCE, "config": ctx.get("config"), "reversed": tok[::-1], "echo": tok,
        "slots": sorted((ctx.get("secrets") or {}).keys()), "org_id": ctx.get("org_id"),
        "project_id": ctx.get("project_id"), "session_id": ctx.get("session_id"),
        "invocation_id": ctx.get("invocation_id"),
        "scopes": (ctx.get("gateway") or {}).get("scopes"),
        "has_token": bool((ctx.get("gateway") or {}).get("delegation_token"))}}})
"#;

fn manifest(package_id: &str, version: &str, hello_as: &str) -> String {
    format!(
        r#"api_version = "vai.plugin.v1"
package_id = "{package_id}"
version = "{version}"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["python3", "plugin.py", "{hello_as}", "{version}"]

[[exports]]
id = "whoami"
kind = "tool"
display_name = "Who am I"
execution_class = "isolated"
config_schema = "schemas/config.json"

[exports.permissions]
secret_slots = ["api_token"]
gateway_api_scopes = ["sessions:read", "runs:read"]

[exports.tool]
input_schema = "schemas/any.json"

[[exports]]
id = "leak"
kind = "tool"
execution_class = "inline"

[exports.permissions]
secret_slots = ["api_token"]

[exports.tool]
input_schema = "schemas/any.json"

[[exports]]
id = "notify"
kind = "hook"

[exports.hook]
subscribes_to = ["run.completed"]
"#
    )
}

/// Writes package `package_id@version` (whose plugin says hello as
/// `hello_as`) below `parent`.
fn kit(parent: &Path, package_id: &str, version: &str, hello_as: &str) -> PathBuf {
    let dir = parent.join(format!("src-{}-{version}", package_id.replace('/', "_")));
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::write(
        dir.join("vai-plugin.toml"),
        manifest(package_id, version, hello_as),
    )
    .unwrap();
    std::fs::write(dir.join("plugin.py"), PLUGIN).unwrap();
    std::fs::set_permissions(
        dir.join("plugin.py"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type": "object"}"#).unwrap();
    std::fs::write(
        dir.join("schemas/config.json"),
        r#"{"type": "object", "additionalProperties": false, "properties": {"greeting": {"type": "string"}}}"#,
    )
    .unwrap();
    dir
}

/// A registry, a workspace and serve with `acme/kit` 0.1.0 and 0.2.0 (and
/// whatever `extra` pushes) pulled.
pub(crate) struct World {
    _reg: Registry,
    pub(crate) ws: Ws,
    pub(crate) serve: Serve,
}

pub(crate) fn world(extra: &[(&str, &str, &str)]) -> World {
    world_in(Ws::new(), extra)
}

/// [`world`] in `ws` (which may hold a plugd.yaml already).
pub(crate) fn world_in(ws: Ws, extra: &[(&str, &str, &str)]) -> World {
    let reg = Registry::start();
    let mut all = vec![
        ("acme/kit", "0.1.0", "acme/kit"),
        ("acme/kit", "0.2.0", "acme/kit"),
    ];
    all.extend_from_slice(extra);
    for (id, v, hello) in &all {
        push(
            &ws,
            &kit(ws.dir(), id, v, hello),
            &reg.reference(&format!("{id}:{v}")),
        );
    }
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    for (id, v, _) in &all {
        let body = json!({"source": reg.reference(&format!("{id}:{v}"))}).to_string();
        let r = call(
            &serve,
            &serve.token,
            "POST",
            "/v1/plugin-packages",
            Some(&body),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    World {
        _reg: reg,
        ws,
        serve,
    }
}

impl World {
    /// A token bound to `org` (and `projects`).
    pub(crate) fn token(&self, role: &str, org: &str, projects: &[&str]) -> String {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!("bc-{org}-{role}-{}", N.fetch_add(1, Ordering::Relaxed));
        let mut args = vec![
            "token", "create", "--name", &name, "--role", role, "--org", org, "--json",
        ];
        for p in projects {
            args.extend(["--project", p]);
        }
        json_out(&self.ws.plugd(&args))["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub(crate) fn secret(&self, org: &str, value: &str) {
        let body = json!({ "value": value }).to_string();
        let r = call(
            &self.serve,
            &self.serve.token,
            "PUT",
            &format!("/v1/secrets/{org}/api_token"),
            Some(&body),
        );
        assert_eq!(r.status, 204, "{}", r.text());
    }

    /// Binds `export` of `acme/kit@version` in `org` (and `project`) with
    /// `percent` of the traffic; its record.
    pub(crate) fn bind(
        &self,
        org: &str,
        project: Option<&str>,
        version: &str,
        percent: u8,
    ) -> Binding {
        self.bind_package("acme/kit", "whoami", org, project, version, percent)
    }

    /// Binds hook export `notify` (no config, no secrets) org-wide.
    fn bind_hook(&self, org: &str) {
        let body = json!({
            "package_id": "acme/kit", "package_version": "0.1.0",
            "export_id": "notify", "scope": {"org_id": org},
        });
        let r = call(
            &self.serve,
            &self.serve.token,
            "POST",
            "/v1/plugin-bindings",
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }

    pub(crate) fn bind_package(
        &self,
        package: &str,
        export: &str,
        org: &str,
        project: Option<&str>,
        version: &str,
        percent: u8,
    ) -> Binding {
        let mut scope = json!({ "org_id": org });
        if let Some(p) = project {
            scope["project_id"] = json!(p);
        }
        let body = json!({
            "package_id": package,
            "package_version": version,
            "export_id": export,
            "scope": scope,
            "config": {"greeting": format!("hi from {org}")},
            "secrets": {"api_token": format!("secret://{org}/api_token")},
            "rollout": {"traffic_percent": percent},
        });
        let r = call(
            &self.serve,
            &self.serve.token,
            "POST",
            "/v1/plugin-bindings",
            Some(&body.to_string()),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        serde_json::from_value(r.json()).unwrap()
    }

    pub(crate) fn patch(&self, id: &str, patch: &Value) -> Binding {
        let r = call(
            &self.serve,
            &self.serve.token,
            "PATCH",
            &format!("/v1/plugin-bindings/{id}"),
            Some(&patch.to_string()),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        serde_json::from_value(r.json()).unwrap()
    }

    /// `POST /v1/plugin-tools/{export}:invoke` with `body`.
    pub(crate) fn invoke(&self, token: &str, export: &str, body: &Value) -> Resp {
        call(
            &self.serve,
            token,
            "POST",
            &format!("/v1/plugin-tools/{export}:invoke"),
            Some(&body.to_string()),
        )
    }

    /// `whoami` in `session`; its structured output.
    fn whoami(&self, token: &str, session: &str) -> Value {
        let r = self.invoke(
            token,
            "whoami",
            &json!({"input": {}, "session_id": session}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["structured_output"].clone()
    }
}

pub(crate) fn call(
    serve: &Serve,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Resp {
    let headers: &[(&str, &str)] = if body.is_some() {
        &[("Content-Type", "application/json")]
    } else {
        &[]
    };
    request_as(serve, token, method, path, headers, body.map(str::as_bytes))
}

#[test]
fn rollout_follows_the_sha256_rule_per_session_at_100_0_and_50_50() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    let a = w.bind("org_a", None, "0.1.0", 100);
    let b = w.bind("org_a", None, "0.2.0", 0);
    let agent = w.token("agent", "org_a", &[]);

    // 100/0: every session lands on 0.1.0.
    for i in 0..30 {
        assert_eq!(w.whoami(&agent, &format!("s{i}"))["version"], "0.1.0");
    }

    // 50/50 over 200 sessions: each call goes where the SHA-256 rule says,
    // the shares are 50 % ± 10 points, and a session keeps its version.
    let a = w.patch(&a.binding_id, &json!({"rollout": {"traffic_percent": 50}}));
    let b = w.patch(&b.binding_id, &json!({"rollout": {"traffic_percent": 50}}));
    let both = [a.clone(), b.clone()];
    let version_of: BTreeMap<&str, &str> = [
        (a.binding_id.as_str(), "0.1.0"),
        (b.binding_id.as_str(), "0.2.0"),
    ]
    .into();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut pids: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut first = Vec::new();
    for i in 0..200 {
        let session = format!("sess-{i}");
        let out = w.whoami(&agent, &session);
        let got = out["version"].as_str().unwrap().to_owned();
        pids.entry(got.clone())
            .or_default()
            .insert(out["instance"].as_str().unwrap().to_owned());
        let want = plugd_control::bindings::select(&both, &session).unwrap();
        assert_eq!(
            got,
            version_of[want.binding_id.as_str()],
            "session {session}"
        );
        *counts.entry(got.clone()).or_default() += 1;
        first.push(got);
    }
    for v in ["0.1.0", "0.2.0"] {
        let n = counts.get(v).copied().unwrap_or(0);
        assert!((80..=120).contains(&n), "{v}: {n} of 200 ({counts:?})");
    }
    for (i, v) in first.iter().enumerate().take(40) {
        assert_eq!(&w.whoami(&agent, &format!("sess-{i}"))["version"], v);
    }

    // Without a session, each call draws a fresh key: both versions serve.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
        assert_eq!(r.status, 200, "{}", r.text());
        let out = &r.json()["structured_output"];
        assert_eq!(out["session_id"], Value::Null);
        seen.insert(out["version"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");

    // One process per installed version, shared by every call of it.
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.values().all(|p| p.len() == 1), "{pids:?}");
    assert_ne!(pids["0.1.0"], pids["0.2.0"]);
}

#[test]
fn the_plugin_sees_config_and_secret_and_nothing_else_does() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    let bound = w.bind("org_a", Some("web"), "0.1.0", 100);
    let agent = w.token("agent", "org_a", &["web"]);

    let r = w.invoke(
        &agent,
        "whoami",
        &json!({"input": {}, "session_id": "chat-1"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains(SECRET), "{}", r.text());
    let v = r.json();
    let out = &v["structured_output"];
    assert_eq!(out["config"], json!({"greeting": "hi from org_a"}));
    let reversed: String = SECRET.chars().rev().collect();
    assert_eq!(out["reversed"], reversed, "the plugin got the secret");
    assert_eq!(out["echo"], "••••", "an echoed secret is masked");
    assert_eq!(v["content"][0]["text"], "token ••••");
    assert_eq!(out["slots"], json!(["api_token"]));
    assert_eq!(out["org_id"], "org_a");
    assert_eq!(out["project_id"], "web");
    assert_eq!(out["session_id"], "chat-1");
    let invocation = out["invocation_id"].as_str().unwrap().to_owned();

    // A PATCH counts at the next call, without a restart.
    w.patch(
        &bound.binding_id,
        &json!({"config": {"greeting": "hello again"}}),
    );
    assert_eq!(
        w.whoami(&agent, "chat-1")["config"],
        json!({"greeting": "hello again"})
    );

    // A tool failure carrying the secret keeps its class, not the secret.
    let r = w.invoke(
        &agent,
        "leak",
        &json!({"input": {}, "session_id": "chat-1"}),
    );
    assert!(!r.text().contains(SECRET), "{}", r.text());
    r.error(404, "not_found"); // `leak` is not bound: it does not exist here.
    let leak = w.bind_package("acme/kit", "leak", "org_a", None, "0.1.0", 100);
    let r = w.invoke(
        &agent,
        "leak",
        &json!({"input": {}, "session_id": "chat-1"}),
    );
    assert!(!r.text().contains(SECRET), "{}", r.text());
    let e = r.error(502, "tool_failed");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("refused token ••••"),
        "{e}"
    );

    // The record: binding, package, version, class, scope, session, status.
    let viewer = w.token("viewer", "org_a", &[]);
    let r = call(
        &w.serve,
        &viewer,
        "GET",
        &format!("/v1/invocations/{invocation}"),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = r.json();
    for (field, want) in [
        ("binding_id", json!(bound.binding_id)),
        ("package_id", json!("acme/kit")),
        ("package_version", json!("0.1.0")),
        ("execution_class", json!("isolated")),
        ("org_id", json!("org_a")),
        ("project_id", json!("web")),
        ("session_id", json!("chat-1")),
        ("status", json!("succeeded")),
        ("export_id", json!("whoami")),
        ("plugin_id", json!("acme/kit")),
        ("dialect", json!("vai")),
    ] {
        assert_eq!(rec[field], want, "{field} in {rec}");
    }
    let r = call(&w.serve, &viewer, "GET", "/v1/invocations?limit=50", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains(SECRET), "{}", r.text());
    let page = r.json();
    let failed: Vec<&Value> = page["invocations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["export_id"] == "leak" && r["binding_id"] == json!(leak.binding_id))
        .collect();
    assert_eq!(failed.len(), 1, "{page}");
    assert_eq!(failed[0]["status"], "failed");
    assert_eq!(failed[0]["execution_class"], "inline");
    assert_eq!(failed[0]["project_id"], "web");

    // A deleted secret: a clear 422 naming the slot, and serve stays up.
    ok(&w.ws.plugd(&["secret", "delete", "org_a/api_token"]));
    let r = w.invoke(
        &agent,
        "whoami",
        &json!({"input": {}, "session_id": "chat-2"}),
    );
    let e = r.error(422, "invalid_binding");
    assert_eq!(e["error"]["details"]["binding_id"], json!(bound.binding_id));
    assert_eq!(
        e["error"]["details"]["problems"][0]["path"],
        "/secrets/api_token"
    );
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"api_token\"") && msg.contains("org_a/api_token"),
        "{msg}"
    );
    assert_eq!(w.serve.get("/healthz").status, 200);
    // Its record says why (records are written off the call's path).
    assert!(
        eventually_blocking(Duration::from_secs(5), || {
            let r = call(
                &w.serve,
                &viewer,
                "GET",
                "/v1/invocations?status=failed",
                None,
            );
            r.json()["invocations"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["error_code"] == "invalid_binding" && r["session_id"] == "chat-2")
        }),
        "no failed record with error_code invalid_binding"
    );

    // The CLI through serve (as the socket's user, naming the org).
    w.secret("org_a", SECRET);
    let out = ok(&w.ws.plugd(&[
        "tool",
        "call",
        "whoami",
        "--org",
        "org_a",
        "--project",
        "web",
        "--session",
        "cli-1",
        "--args",
        "{}",
    ]));
    assert!(!out.contains(SECRET), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["structured_output"]["session_id"], "cli-1");
    assert_eq!(v["structured_output"]["reversed"], reversed);

    // Serve's log shows the plugin's stderr only masked.
    let (_, log) = w.serve.stop();
    assert!(!log.contains(SECRET), "the secret is in serve's log");
    assert!(log.contains("the token is ••••"), "{log}");

    // Without serve, the CLI calls in its own process, the same way.
    let cli = |args: &[&str]| {
        plugd_cmd(w.ws.dir())
            .env("PLUGD_MASTER_KEY", MASTER_KEY)
            .args(args)
            .output()
            .unwrap()
    };
    let out = ok(&cli(&[
        "tool",
        "call",
        "whoami",
        "--org",
        "org_a",
        "--project",
        "web",
        "--session",
        "cli-2",
        "--args",
        r#"{"x": 1}"#,
    ]));
    assert!(!out.contains(SECRET), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["structured_output"]["reversed"], reversed);
    assert_eq!(
        v["structured_output"]["config"],
        json!({"greeting": "hello again"})
    );
    let nope = cli(&["tool", "call", "whoami", "--org", "org_z", "--json"]);
    assert_eq!(nope.status.code(), Some(4), "{}", stderr(&nope));
    let e: Value = serde_json::from_str(stderr(&nope).trim()).unwrap();
    assert_eq!(e["code"], "not_found");
    assert_eq!(e["http_status"], 404);
}

#[test]
fn orgs_and_projects_see_only_their_bindings_and_records() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    w.secret("org_b", "tok-of-org-b");
    let org_wide = w.bind("org_a", None, "0.1.0", 100);
    let p1 = w.bind("org_a", Some("p1"), "0.2.0", 100);
    let a = w.token("agent", "org_a", &[]);
    let a_p1 = w.token("agent", "org_a", &["p1"]);
    let a_p2 = w.token("agent", "org_a", &["p2"]);
    let b = w.token("agent", "org_b", &[]);
    let b_view = w.token("viewer", "org_b", &[]);
    let a_view = w.token("viewer", "org_a", &[]);

    // Project bindings before org-wide ones.
    assert_eq!(w.whoami(&a, "s")["version"], "0.1.0");
    let r = w.invoke(
        &a,
        "whoami",
        &json!({"input": {}, "session_id": "s", "project_id": "p1"}),
    );
    assert_eq!(
        r.json()["structured_output"]["version"],
        "0.2.0",
        "{}",
        r.text()
    );
    assert_eq!(w.whoami(&a_p1, "s")["version"], "0.2.0");
    assert_eq!(w.whoami(&a_p2, "s")["version"], "0.1.0");
    // A project token cannot call for another project.
    w.invoke(&a_p2, "whoami", &json!({"input": {}, "project_id": "p1"}))
        .error(404, "not_found");

    // Org B does not see org A's export, whichever way it asks.
    let before = w.invoke(&b, "whoami", &json!({"input": {}}));
    let unknown_body = before.error(404, "not_found");
    let r = w.invoke(&b, "whoami", &json!({"input": {}, "org_id": "org_a"}));
    assert_eq!(r.error(404, "not_found"), unknown_body);
    // A disabled binding is no binding: the very same answer.
    let b_bind = w.bind("org_b", None, "0.1.0", 100);
    assert_eq!(w.whoami(&b, "s")["org_id"], "org_b");
    w.patch(&b_bind.binding_id, &json!({"status": "disabled"}));
    assert_eq!(
        w.invoke(&b, "whoami", &json!({"input": {}}))
            .error(404, "not_found"),
        unknown_body
    );
    // A viewer may not call at all.
    w.invoke(&a_view, "whoami", &json!({"input": {}}))
        .error(403, "forbidden");

    // Records: each org its own; another org's id is unknown.
    let list = |token: &str| -> Vec<Value> {
        let r = call(&w.serve, token, "GET", "/v1/invocations?limit=500", None);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["invocations"].as_array().unwrap().clone()
    };
    // Five calls answered (four of org A, one of org B); the 404s leave no
    // record. Records are written off the call's path: wait for them.
    assert!(eventually_blocking(Duration::from_secs(5), || list(
        &w.serve.token
    )
    .len()
        == 5));
    let of_a = list(&a_view);
    let of_b = list(&b_view);
    assert_eq!(of_a.len(), 4, "{of_a:?}");
    assert!(of_a.iter().all(|r| r["org_id"] == "org_a"), "{of_a:?}");
    assert_eq!(of_b.len(), 1, "{of_b:?}");
    assert_eq!(of_b[0]["org_id"], "org_b");
    let r = call(&w.serve, &b_view, "GET", "/v1/invocations?org=org_a", None);
    assert_eq!(r.json()["invocations"], json!([]), "{}", r.text());
    let a_id = of_a[0]["invocation_id"].as_str().unwrap();
    call(
        &w.serve,
        &b_view,
        "GET",
        &format!("/v1/invocations/{a_id}"),
        None,
    )
    .error(404, "unknown_invocation");
    let b_id = of_b[0]["invocation_id"].as_str().unwrap();
    call(
        &w.serve,
        &a_view,
        "GET",
        &format!("/v1/invocations/{b_id}"),
        None,
    )
    .error(404, "unknown_invocation");
    // A token limited to p2 sees org-wide records and p2's, not p1's.
    let p2_view = w.token("viewer", "org_a", &["p2"]);
    let of_p2 = list(&p2_view);
    assert!(!of_p2.is_empty());
    assert!(
        of_p2
            .iter()
            .all(|r| r["project_id"].is_null() || r["project_id"] == "p2"),
        "{of_p2:?}"
    );

    // Disabling p1's binding leaves p1 on the org-wide one; disabling that
    // too, the export is gone for org A.
    w.patch(&p1.binding_id, &json!({"status": "disabled"}));
    assert_eq!(w.whoami(&a_p1, "s")["version"], "0.1.0");
    w.patch(&org_wide.binding_id, &json!({"status": "disabled"}));
    w.invoke(&a_p1, "whoami", &json!({"input": {}}))
        .error(404, "not_found");

    // A workspace token names the org.
    w.patch(&org_wide.binding_id, &json!({"status": "active"}));
    w.invoke(&w.serve.token, "whoami", &json!({"input": {}}))
        .error(400, "bad_request");
    let r = w.invoke(
        &w.serve.token,
        "whoami",
        &json!({"input": {}, "org_id": "org_a"}),
    );
    assert_eq!(
        r.json()["structured_output"]["org_id"],
        "org_a",
        "{}",
        r.text()
    );
}

#[test]
fn hostile_packages_and_bodies_get_clear_refusals() {
    let w = world(&[("acme/liar", "0.1.0", "evil/kit")]);
    w.secret("org_a", SECRET);
    w.bind_package("acme/liar", "whoami", "org_a", Some("liars"), "0.1.0", 100);
    w.bind("org_a", None, "0.1.0", 100);
    let a = w.token("agent", "org_a", &[]);

    // A plugin that claims another package in its hello is refused, named;
    // the org's other binding of the export keeps working.
    let liar = w.token("agent", "org_a", &["liars"]);
    let r = w.invoke(&liar, "whoami", &json!({"input": {}}));
    let e = r.error(503, "plugin_unavailable");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("acme/liar") && msg.contains("evil/kit"),
        "{msg}"
    );
    assert!(
        msg.contains("sha256:") && !msg.contains("plugd plugin restart"),
        "{msg}"
    );
    // Asked again, it is refused again (never served, never a hang).
    let again = w.invoke(&liar, "whoami", &json!({"input": {}}));
    assert_eq!(again.status, 503, "{}", again.text());
    assert_eq!(w.serve.get("/healthz").status, 200);
    assert_eq!(w.whoami(&a, "s")["version"], "0.1.0");

    // Bodies: malformed JSON, unknown fields, a non-object input, an
    // oversized body, an oversized or spaced session id, a bad org id.
    let raw = |body: &[u8]| {
        request_as(
            &w.serve,
            &a,
            "POST",
            "/v1/plugin-tools/whoami:invoke",
            &[("Content-Type", "application/json")],
            Some(body),
        )
    };
    raw(b"{\"input\": {").error(400, "malformed_json");
    raw(br#"{"input": {}, "by": "root"}"#).error(422, "invalid_body");
    raw(br#"{"input": [1]}"#).error(422, "invalid_arguments");
    // Over the 1 MiB default: refused from the declared length, before the
    // body is read (no bytes sent, so the close is clean).
    request_as(
        &w.serve,
        &a,
        "POST",
        "/v1/plugin-tools/whoami:invoke",
        &[
            ("Content-Type", "application/json"),
            ("Content-Length", "2097152"),
        ],
        None,
    )
    .error(413, "payload_too_large");
    let long = json!({"input": {}, "session_id": "s".repeat(1000)}).to_string();
    raw(long.as_bytes()).error(400, "bad_request");
    raw(br#"{"input": {}, "session_id": "two words"}"#).error(400, "bad_request");
    raw(br#"{"input": {}, "project_id": "../etc"}"#).error(400, "bad_request");
    // A hook export is not a tool: it does not exist here.
    w.bind_hook("org_a");
    request_as(
        &w.serve,
        &a,
        "POST",
        "/v1/plugin-tools/notify:invoke",
        &[("Content-Type", "application/json")],
        Some(b"{}"),
    )
    .error(404, "not_found");
    request_as(
        &w.serve,
        &a,
        "POST",
        "/v1/plugin-tools/whoami",
        &[("Content-Type", "application/json")],
        Some(b"{}"),
    )
    .error(404, "not_found");
}

#[test]
fn a_native_package_runs_through_its_binding_too() {
    let reg = Registry::start();
    let ws = Ws::new();
    let src = crate::support::repo().join("examples/workspace/.plugins/hello-python");
    push(&ws, &src, &reg.reference("hello/python:0.1.0"));
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    let body = json!({"source": reg.reference("hello/python:0.1.0")}).to_string();
    let r = call(
        &serve,
        &serve.token,
        "POST",
        "/v1/plugin-packages",
        Some(&body),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let bind = json!({
        "package_id": "hello_python", "export_id": "hello_python_greet",
        "scope": {"org_id": "org_n"},
    })
    .to_string();
    let r = call(
        &serve,
        &serve.token,
        "POST",
        "/v1/plugin-bindings",
        Some(&bind),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let binding_id = r.json()["binding_id"].as_str().unwrap().to_owned();
    let w = World {
        _reg: reg,
        ws,
        serve,
    };
    let agent = w.token("agent", "org_n", &[]);
    let r = w.invoke(
        &agent,
        "hello_python_greet",
        &json!({"input": {"name": "Ada"}, "session_id": "n1"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("Hello, Ada!"), "{}", r.text());
    // The export's schema holds as for any tool call.
    w.invoke(&agent, "hello_python_greet", &json!({"input": {"name": 7}}))
        .error(422, "invalid_arguments");
    let view = w.token("viewer", "org_n", &[]);
    assert!(eventually_blocking(Duration::from_secs(5), || {
        let r = call(
            &w.serve,
            &view,
            "GET",
            "/v1/invocations?status=succeeded",
            None,
        );
        r.json()["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|rec| {
                rec["binding_id"] == json!(binding_id)
                    && rec["dialect"] == "native"
                    && rec["package_id"] == "hello_python"
                    && rec["package_version"] == "0.1.0"
                    && rec["session_id"] == "n1"
            })
    }));
}

/// `plugd package show ID --json`.
fn package_record(ws: &Ws, id: &str) -> Value {
    json_out(&ws.plugd(&["package", "show", id, "--json"]))
}

/// Makes `path` (a file or directory of an installed package) writable by
/// its owner, as someone tampering with it would.
fn writable(path: &Path) {
    let mode = std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o200)).unwrap();
}

/// `ws/markers/NAME`: the directory is made before serve starts, so a
/// package process outside a sandbox may write there (plugd's baseline
/// keeps plugins from creating entries directly in the workspace, an
/// ancestor of `.plugd/`).
fn marker_in(ws: &Ws, name: &str) -> PathBuf {
    let dir = ws.dir().join("markers");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The plugin with a first line that writes `marker` when it runs.
fn marking_plugin(marker: &Path) -> String {
    format!(
        "open({:?}, 'w').write('ran')\n{PLUGIN}",
        marker.to_str().unwrap()
    )
}

/// Asserts `r` is the refusal of a package whose files changed: 503,
/// naming the package, its digest, the expected tree digest and the way
/// back.
fn assert_tampered(r: &Resp, record: &Value) {
    let e = r.error(503, "plugin_unavailable");
    let msg = e["error"]["message"].as_str().unwrap();
    let tree = record["tree_digest"].as_str().unwrap();
    for part in [
        "acme/kit@0.1.0",
        record["digest"].as_str().unwrap(),
        "changed since its install",
        tree,
        "expected",
        "found",
        "plugd package pull",
        "plugd package restart",
    ] {
        assert!(msg.contains(part), "{part:?} missing from {msg}");
    }
}

/// `POST /v1/plugin-packages/{id}:restart` as `token`.
fn restart(w: &World, token: &str, id: &str) -> Resp {
    call(
        &w.serve,
        token,
        "POST",
        &format!("/v1/plugin-packages/{id}:restart"),
        Some("{}"),
    )
}

/// Pulls `acme/kit:0.1.0` again through serve: installed already (200).
fn pull_again(w: &World) -> Value {
    let body = json!({"source": w._reg.reference("acme/kit:0.1.0")}).to_string();
    let r = call(
        &w.serve,
        &w.serve.token,
        "POST",
        "/v1/plugin-packages",
        Some(&body),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["new"], false);
    assert_eq!(r.json()["restored"], true, "{}", r.text());
    r.json()
}

#[test]
fn a_package_changed_before_its_first_call_never_runs_and_a_pull_restores_it() {
    let ws = Ws::new();
    ws.unsandbox(
        &["acme/kit"],
        "a tampered plugin.py would write its marker in the workspace",
    );
    let marker = marker_in(&ws, "tampered-ran");
    let w = world_in(ws, &[]);
    w.secret("org_a", SECRET);
    w.bind("org_a", None, "0.1.0", 100);
    let agent = w.token("agent", "org_a", &[]);
    let record = package_record(&w.ws, "acme/kit@0.1.0");
    let tree = record["tree_digest"].as_str().unwrap().to_owned();
    assert!(tree.starts_with("sha256:") && tree.len() == 71, "{record}");
    // The install recorded the tree of the read-only directory it made.
    let dir = PathBuf::from(record["path"].as_str().unwrap());
    assert_eq!(
        std::fs::metadata(dir.join("plugin.py"))
            .unwrap()
            .permissions()
            .mode()
            & 0o222,
        0
    );

    // Changed while no serve runs, then a fresh serve: its first call is
    // refused before anything of the package starts.
    let World { _reg, ws, serve } = w;
    serve.stop();
    writable(&dir.join("plugin.py"));
    std::fs::write(dir.join("plugin.py"), marking_plugin(&marker)).unwrap();
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    let w = World { _reg, ws, serve };
    for _ in 0..2 {
        let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
        assert_tampered(&r, &record);
    }
    assert!(!marker.exists(), "the changed plugin.py ran");
    // The marker would be there had it run: the changed file does write it.
    #[allow(clippy::disallowed_methods)] // the control run of the changed file, outside plugd
    let out = std::process::Command::new("python3")
        .arg(dir.join("plugin.py"))
        .args(["acme/kit", "0.1.0"])
        .current_dir(&dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(marker.exists(), "control run: {}", stderr(&out));
    std::fs::remove_file(&marker).unwrap();

    // Pulling the installed digest again, by the source the refusal names,
    // restores its files (the record is the same); the next call runs the
    // package as installed. Pulled once more, nothing changes.
    let source = record["source"].as_str().unwrap();
    let out = ok(&w.ws.plugd(&["package", "pull", source]));
    assert!(out.contains("are restored"), "{out}");
    let pulled = json_out(&w.ws.plugd(&["package", "pull", source, "--json"]));
    assert_eq!(pulled["restored"], false);
    assert_eq!(pulled["tree_digest"], json!(tree));
    assert_eq!(pulled["installed_at"], record["installed_at"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("plugin.py")).unwrap(),
        PLUGIN
    );
    assert_eq!(w.whoami(&agent, "s1")["version"], "0.1.0");
    assert!(!marker.exists());
}

#[test]
fn a_package_changed_after_a_call_stops_at_its_next_start_whatever_the_change() {
    let ws = Ws::new();
    ws.unsandbox(
        &["acme/kit"],
        "a tampered plugin.py would write its marker in the workspace",
    );
    let marker = marker_in(&ws, "tampered-ran");
    let w = world_in(ws, &[]);
    w.secret("org_a", SECRET);
    w.bind("org_a", None, "0.1.0", 100);
    let agent = w.token("agent", "org_a", &[]);
    let record = package_record(&w.ws, "acme/kit@0.1.0");
    let dir = PathBuf::from(record["path"].as_str().unwrap());
    let first = w.whoami(&agent, "s1")["instance"].clone();

    type Tamper<'a> = Box<dyn Fn(&Path) + 'a>;
    let changes: Vec<(&str, Tamper)> = vec![
        (
            "an edited file",
            Box::new(|dir: &Path| {
                writable(&dir.join("plugin.py"));
                std::fs::write(dir.join("plugin.py"), marking_plugin(&marker)).unwrap();
            }),
        ),
        (
            "an added file",
            Box::new(|dir: &Path| {
                writable(dir);
                std::fs::write(dir.join("sitecustomize.py"), "import os\n").unwrap();
            }),
        ),
        (
            "a file replaced by a symlink to the same bytes",
            Box::new(|dir: &Path| {
                let schemas = dir.join("schemas");
                writable(&schemas);
                let copy = dir
                    .parent()
                    .unwrap()
                    .parent()
                    .unwrap()
                    .join("any-copy.json");
                std::fs::copy(schemas.join("any.json"), &copy).unwrap();
                std::fs::remove_file(schemas.join("any.json")).unwrap();
                std::os::unix::fs::symlink(&copy, schemas.join("any.json")).unwrap();
            }),
        ),
    ];
    let mut last = first;
    for (what, tamper) in &changes {
        tamper(&dir);
        // The running process keeps serving the files it started with;
        // the next start (here, an operator's restart) checks the tree.
        let r = restart(&w, &w.serve.token, "acme/kit@0.1.0");
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        assert_eq!(r.json()["had_process"], true, "{what}");
        assert_eq!(r.json()["digest"], record["digest"], "{what}");
        let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
        assert_tampered(&r, &record);
        assert!(!marker.exists(), "{what}: the changed plugin.py ran");
        // Restored by a pull, it stays failed until an operator restarts it.
        pull_again(&w);
        let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
        let e = r.error(503, "plugin_unavailable");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("stays failed until `plugd package restart"),
            "{what}: {msg}"
        );
        let r = restart(&w, &w.serve.token, record["digest"].as_str().unwrap());
        assert_eq!(r.status, 200, "{what}: {}", r.text());
        let out = w.whoami(&agent, "s1");
        assert_eq!(out["version"], "0.1.0", "{what}");
        assert_ne!(out["instance"], last, "{what}: a new process serves");
        last = out["instance"].clone();
    }
    assert!(!marker.exists());
}

#[test]
fn package_restart_recovers_a_failed_package_without_restarting_serve() {
    let ws = Ws::new();
    ws.unsandbox(
        &["acme/flaky"],
        "the flaky plugin reads its flag file in the workspace",
    );
    let flag = marker_in(&ws, "flaky-ready");
    // Written at every start: shows that a package process here can write
    // where the tamper tests look for their markers.
    let started = marker_in(&ws, "flaky-started");
    // Says hello as another package (a lie plugd gives up on at once)
    // until the flag file exists.
    let src = kit(ws.dir(), "acme/flaky", "0.1.0", "acme/flaky");
    let entry = r#"entrypoint = ["python3", "plugin.py", "acme/flaky", "0.1.0"]"#;
    let text = manifest("acme/flaky", "0.1.0", "acme/flaky");
    assert!(text.contains(entry));
    let text = text.replace(
        entry,
        &format!(
            r#"entrypoint = ["python3", "plugin.py", "acme/flaky", "0.1.0", {:?}]"#,
            flag.to_str().unwrap()
        ),
    );
    std::fs::write(src.join("vai-plugin.toml"), text).unwrap();
    let plugin = PLUGIN.replace(
        "PKG, VER = sys.argv[1], sys.argv[2]",
        "PKG, VER = (sys.argv[1] if os.path.exists(sys.argv[3]) else \"evil/kit\"), sys.argv[2]",
    );
    assert_ne!(plugin, PLUGIN);
    std::fs::write(
        src.join("plugin.py"),
        marking_plugin(&started).replace(PLUGIN, &plugin),
    )
    .unwrap();
    let w = world_in(ws, &[]);
    push(&w.ws, &src, &w._reg.reference("acme/flaky:0.1.0"));
    let body = json!({"source": w._reg.reference("acme/flaky:0.1.0")}).to_string();
    let r = call(
        &w.serve,
        &w.serve.token,
        "POST",
        "/v1/plugin-packages",
        Some(&body),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    w.secret("org_a", SECRET);
    w.bind_package("acme/flaky", "whoami", "org_a", None, "0.1.0", 100);
    let agent = w.token("agent", "org_a", &[]);

    let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
    let msg = r.error(503, "plugin_unavailable")["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("acme/flaky") && msg.contains("evil/kit"),
        "{msg}"
    );
    // Fixed now, but failed for good: it stays failed until restarted.
    std::fs::write(&flag, "").unwrap();
    let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
    let msg = r.error(503, "plugin_unavailable")["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(msg.contains("plugd package restart sha256:"), "{msg}");

    // Org tokens may not restart a package process (it serves every org):
    // 403 for one its org uses, 404 for one it does not.
    let org_op = w.token("operator", "org_a", &[]);
    restart(&w, &org_op, "acme/flaky@0.1.0").error(403, "forbidden");
    let other_op = w.token("operator", "org_b", &[]);
    restart(&w, &other_op, "acme/flaky@0.1.0").error(404, "unknown_package");
    // Only operators restart; bad and unknown ids are told apart.
    let unbound_agent = crate::http::make_token(&w.ws, "agent");
    assert_eq!(restart(&w, &unbound_agent, "acme/flaky").status, 403);
    restart(&w, &w.serve.token, "sha256:abc").error(400, "invalid_package_id");
    restart(&w, &w.serve.token, "acme/none").error(404, "unknown_package");
    assert_eq!(
        call(
            &w.serve,
            &w.serve.token,
            "POST",
            "/v1/plugin-packages/acme/flaky:frobnicate",
            Some("{}"),
        )
        .status,
        404
    );
    // A package without a process yet: nothing to clear, said so.
    let r = restart(&w, &w.serve.token, "acme/kit@0.2.0");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["had_process"], false);
    let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
    assert_eq!(r.status, 503, "{}", r.text());

    // The CLI goes through the running serve; the next call starts it.
    let out = ok(&w.ws.plugd(&["package", "restart", "acme/flaky@0.1.0"]));
    assert!(
        out.contains("restarted acme/flaky 0.1.0") && out.contains("via plugd serve pid"),
        "{out}"
    );
    let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["structured_output"]["version"], "0.1.0");
    assert!(
        started.exists(),
        "the flaky plugin could not write its marker"
    );

    // Without a serve there is no process to clear.
    let World { _reg, ws, serve } = w;
    serve.stop();
    let out = ok(&ws.plugd(&["package", "restart", "acme/flaky"]));
    assert!(out.contains("not running"), "{out}");
    let out = ws.plugd(&["package", "restart", "acme/none"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no installed package"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_record_without_a_tree_digest_is_pinned_at_first_load_with_a_warning() {
    let w = world(&[]);
    w.secret("org_a", SECRET);
    w.bind("org_a", None, "0.1.0", 100);
    let agent = w.token("agent", "org_a", &[]);
    let record = package_record(&w.ws, "acme/kit@0.1.0");
    let dir = PathBuf::from(record["path"].as_str().unwrap());
    // A record as a development build wrote it: no tree digest.
    let World { _reg, ws, serve } = w;
    serve.stop();
    if crate::support::sqlite_only("python's sqlite3 edits the package record") {
        return;
    }
    let db = ws.dir().join(".plugd/state.db");
    #[allow(clippy::disallowed_methods)] // python's sqlite3 edits the test's database
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('UPDATE packages SET tree_digest = NULL'); c.commit()")
        .arg(&db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(package_record(&ws, "acme/kit@0.1.0")["tree_digest"].is_null());
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    let w = World { _reg, ws, serve };
    assert_eq!(w.whoami(&agent, "s1")["version"], "0.1.0");
    let log = w.serve.log_text();
    assert!(
        log.contains("has no tree digest") && log.contains("acme/kit@0.1.0"),
        "{log}"
    );
    // Pinned as first loaded: a change after that stops its next start.
    writable(&dir);
    std::fs::write(dir.join("extra.txt"), "x").unwrap();
    let r = restart(&w, &w.serve.token, "acme/kit@0.1.0");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = w.invoke(&agent, "whoami", &json!({"input": {}}));
    let msg = r.error(503, "plugin_unavailable")["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("acme/kit@0.1.0") && msg.contains("changed since plugd first loaded them"),
        "{msg}"
    );
}

#[test]
fn a_binding_narrows_the_delegated_scopes_of_its_export() {
    let w = world(&[]);
    w.secret("acme", "s3cret-acme");
    let b = w.bind("acme", None, "0.1.0", 100);
    assert_eq!(b.gateway_api_scopes, None);
    let acme = w.token("agent", "acme", &[]);
    // By default: what the export asks for, with a token for this call.
    let out = w.whoami(&acme, "s1");
    assert_eq!(
        out["scopes"],
        json!(["sessions:read", "runs:read"]),
        "{out}"
    );
    assert_eq!(out["has_token"], true);
    // The binding narrows; it never widens.
    let narrowed = w.patch(
        &b.binding_id,
        &json!({"gateway_api_scopes": ["runs:read", "chains:write"]}),
    );
    assert_eq!(
        narrowed.gateway_api_scopes,
        Some(vec!["runs:read".to_owned(), "chains:write".to_owned()])
    );
    let out = w.whoami(&acme, "s1");
    assert_eq!(out["scopes"], json!(["runs:read"]), "{out}");
    // Nothing in common: no token at all.
    w.patch(&b.binding_id, &json!({"gateway_api_scopes": []}));
    let out = w.whoami(&acme, "s1");
    assert_eq!(out["scopes"], json!([]), "{out}");
    assert_eq!(out["has_token"], false);
    // A scope plugd does not know is a problem of the binding.
    let r = call(
        &w.serve,
        &w.serve.token,
        "PATCH",
        &format!("/v1/plugin-bindings/{}", b.binding_id),
        Some(&json!({"gateway_api_scopes": ["admin:everything"]}).to_string()),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("/gateway_api_scopes/0"), "{}", r.text());
}

#[test]
fn a_call_through_a_binding_passes_the_hooks_of_plugd_yaml() {
    let ws = Ws::new();
    let log = ws.dir().join("guard.log");
    std::fs::write(&log, "").unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "plugins:\n  custom:\n    - {{name: guard, module: \"{}\", priority: 10, blocking: true, config: {{log: \"{}\"}}}}\n",
            crate::support::repo()
                .join("tests/plugins/onepath/guard.mjs")
                .display(),
            log.display()
        ),
    )
    .unwrap();
    let w = world_in(ws, &[]);
    w.secret("org_a", SECRET);
    w.bind("org_a", None, "0.1.0", 100);
    let agent = w.token("agent", "org_a", &[]);
    let r = w.invoke(
        &agent,
        "whoami",
        &json!({"input": {"deny": true}, "session_id": "s1"}),
    );
    let v = r.error(403, "blocked_by_hook");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("one-path guard refused"), "{v}");
    // The refused call never reached the package: its record says so.
    let whoami = w.whoami(&agent, "s1");
    assert_eq!(whoami["session_id"], "s1", "{whoami}");
    let decisions = std::fs::read_to_string(w.ws.dir().join("guard.log")).unwrap();
    let befores = decisions
        .lines()
        .filter(|l| l.contains("\"before_tool_call\""))
        .count();
    let afters = decisions
        .lines()
        .filter(|l| l.contains("\"after_tool_result\""))
        .count();
    assert_eq!((befores, afters), (2, 1), "{decisions}");
}
