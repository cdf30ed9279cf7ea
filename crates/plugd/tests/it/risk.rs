//! The risk policy with real processes: a Salmex plugin in Python whose tools
//! (one per risk level) append to a marker file in the workspace when they
//! actually run, so "never ran" is the marker's absence. Driven through the
//! CLI (stdin null, `--yes`, a real pseudo-terminal answering the prompt),
//! the agent turn, and a real `plugd serve` (pending approvals approved,
//! denied and timed out over HTTP and through `plugd approvals`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use plugd_runtime::risk::{ApprovalRequest, Approver, Decision, DecisionFuture};
use serde_json::{Value, json};

use crate::http::{Serve, request_as};
use crate::support::{Ws, eventually_blocking, path_with_venv, plugd_cmd, quick, stderr, stdout};

/// The plugin: `risky/<tool>` appends the tool name to `../../../ran-<tool>`
/// (from its pin `.plugd/pins/<digest>/`: the workspace, outside the plugin
/// directory so its digest is stable).
const PLUGIN: &str = r#"
import json, sys

out = sys.stdout.buffer

def send(msg):
    body = json.dumps(msg).encode()
    out.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out.flush()

def read_frame(inp):
    length = None
    while True:
        line = inp.readline()
        if not line:
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            if length is None:
                continue
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return inp.read(length)

while True:
    body = read_frame(sys.stdin.buffer)
    if body is None:
        break
    msg = json.loads(body)
    method = msg.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "1.0", "capabilities": {}}})
    elif method == "tools/call":
        name = msg["params"]["name"]
        with open("../../../ran-" + name, "a") as f:
            f.write(json.dumps(msg["params"].get("arguments")) + "\n")
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": "ran " + name}]}})
    elif method == "shutdown":
        break
    elif "id" in msg:
        send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no " + str(method)}})
"#;

/// An approver that approves every call, for tests of other behaviour that
/// call `high` or `critical` tools through a library `Runtime`.
pub(crate) struct ApproveAll;

impl Approver for ApproveAll {
    fn decide<'a>(&'a self, _: &'a ApprovalRequest) -> DecisionFuture<'a> {
        Box::pin(async { Decision::Approved { by: "test".into() } })
    }
}

/// Tool, declared risk.
const TOOLS: &[(&str, &str)] = &[
    ("lo", "low"),
    ("med", "medium"),
    ("hi", "high"),
    ("crit", "critical"),
    ("plain", "low"),
];

/// A workspace with the `risky` plugin, approved, and `yaml` as plugd.yaml.
pub(crate) fn workspace(yaml: &str) -> Ws {
    let ws = Ws::new();
    let dir = ws.plugin_dir("risky");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("main.py"), PLUGIN).unwrap();
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(n, r)| json!({"name": n, "risk_level": r, "description": format!("a {r} tool"), "parameters": {"type": "object"}}))
        .collect();
    let manifest = json!({
        "name": "risky", "version": "0.1.0", "protocolVersion": "1.0",
        "interpreter": "python3", "main": "main.py",
        "capabilities": {"tools": tools}
    });
    std::fs::write(dir.join("plugin.json"), manifest.to_string()).unwrap();
    // The containment baseline: the plugin cannot create new files in the
    // workspace root, only append to those that exist when it starts.
    for (tool, _) in TOOLS {
        std::fs::write(ws.dir().join(format!("ran-{tool}")), "").unwrap();
    }
    if !yaml.is_empty() {
        std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
    }
    let out = ws.plugd(&["plugin", "approve", "risky"]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
    ws
}

/// How many times `tool` actually ran.
pub(crate) fn runs(ws: &Ws, tool: &str) -> usize {
    std::fs::read_to_string(ws.dir().join(format!("ran-{tool}")))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn call(ws: &Ws, tool: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec!["tool", "call", tool, "--json"];
    args.extend(more);
    ws.plugd(&args)
}

#[track_caller]
fn refused(out: &std::process::Output, wants: &[&str]) {
    assert!(!out.status.success(), "ran: {}", stdout(out));
    let mut err = stderr(out);
    // `tool call --json` prints the error as a JSON object: its message.
    let last: Option<Value> = err
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok());
    if let Some(m) = last.as_ref().and_then(|v| v["message"].as_str()) {
        err = format!("{err}\n{m}");
    }
    for w in wants {
        assert!(err.contains(w), "{w:?} not in: {err}");
    }
}

#[test]
fn a_critical_tool_with_no_terminal_never_runs() {
    let ws = workspace("");
    let out = call(&ws, "risky/crit", &[]);
    refused(
        &out,
        &[
            "tool \"risky/crit\" (plugin \"risky\", risk critical) was denied",
            "standard input is not a terminal",
            "--yes never covers critical-risk tools",
        ],
    );
    assert_eq!(runs(&ws, "crit"), 0);
    // The low tool of the same plugin runs without asking.
    let out = call(&ws, "risky/lo", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(runs(&ws, "lo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_an_approver_denies_high_calls() {
    let ws = workspace("");
    let rt = ws.runtime(quick(10_000)).await;
    let err = rt
        .call_tool("risky/hi", json!({}), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"risky/hi\"") && err.contains("risk high") && err.contains("no approver"),
        "{err}"
    );
    assert_eq!(runs(&ws, "hi"), 0);
    rt.shutdown().await;
}

#[test]
fn yes_runs_a_high_tool_and_never_a_critical_one() {
    let ws = workspace("");
    let out = call(&ws, "risky/hi", &["--yes", "--args", r#"{"n":1}"#]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()["content"][0]["text"],
        "ran hi"
    );
    assert_eq!(runs(&ws, "hi"), 1);
    // Without --yes and without a terminal, high is denied too.
    refused(&call(&ws, "risky/hi", &[]), &["risk high", "pass --yes"]);
    assert_eq!(runs(&ws, "hi"), 1);
    refused(
        &call(&ws, "risky/crit", &["--yes"]),
        &["\"risky/crit\"", "risk critical"],
    );
    assert_eq!(runs(&ws, "crit"), 0);
}

/// Runs plugd with `args` under a real pseudo-terminal (python3 `pty`):
/// each time the output (after the previous match) shows `expect`, it types
/// `send`. The driver's report: exit code, steps done, everything printed.
pub(crate) fn on_a_terminal(ws: &Ws, args: &[&str], script: &[(&str, &str)]) -> Value {
    let driver = ws.dir().join("pty_driver.py");
    std::fs::write(
        &driver,
        r#"
import json, os, pty, select, signal, sys, time
argv, script = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
out, seen, done, deadline = b"", 0, 0, time.time() + 60
while time.time() < deadline:
    r, _, _ = select.select([fd], [], [], 0.5)
    if fd in r:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        out += data
    while done < len(script):
        at = out.find(script[done][0].encode(), seen)
        if at < 0:
            break
        seen = at + len(script[done][0])
        os.write(fd, script[done][1].encode())
        done += 1
# Past the deadline a plugd still waiting for input is killed (the test
# then fails on its output instead of hanging).
_, status = os.waitpid(pid, os.WNOHANG)
if _ == 0:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "steps": done, "output": out.decode("utf-8", "replace")}))
"#,
    )
    .unwrap();
    let mut argv = vec![
        json!(env!("CARGO_BIN_EXE_plugd")),
        json!("--workspace"),
        json!(ws.dir()),
    ];
    argv.extend(args.iter().map(|a| json!(a)));
    #[allow(clippy::disallowed_methods)] // the test drives a pty around plugd
    let out = std::process::Command::new("python3")
        .arg(&driver)
        .arg(Value::Array(argv).to_string())
        .arg(json!(script).to_string())
        .env("PATH", path_with_venv())
        .envs(crate::support::plugd_env(ws))
        .env_remove("PLUGD_LOG")
        .output()
        .unwrap();
    serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("driver said ({e}): {} {}", stdout(&out), stderr(&out)))
}

/// `plugd tool call TOOL` on a terminal, answering `answer` at the prompt.
fn call_on_a_terminal(ws: &Ws, tool: &str, answer: &str) -> Value {
    let answer = format!("{answer}\n");
    on_a_terminal(
        ws,
        &["tool", "call", tool, "--args", r#"{"path":"/etc/passwd"}"#],
        &[("[y/N]", &answer)],
    )
}

#[test]
fn an_interactive_prompt_runs_the_call_on_y_and_not_on_n() {
    let ws = workspace("");
    let v = call_on_a_terminal(&ws, "risky/crit", "n");
    let text = v["output"].as_str().unwrap();
    assert_eq!(v["steps"], 1, "{text}");
    assert!(
        text.contains("tool \"risky/crit\" of plugin \"risky\" is critical risk")
            && text.contains(r#"{"path":"/etc/passwd"}"#),
        "the prompt shows tool, plugin, risk and arguments: {text}"
    );
    assert_eq!(v["code"], 1, "{text}");
    assert!(
        text.contains("answered \"n\" at the approval prompt"),
        "{text}"
    );
    assert_eq!(runs(&ws, "crit"), 0);

    let v = call_on_a_terminal(&ws, "risky/crit", "y");
    let text = v["output"].as_str().unwrap();
    assert_eq!(v["code"], 0, "{text}");
    assert!(text.contains("ran crit"), "{text}");
    assert_eq!(runs(&ws, "crit"), 1);
}

#[test]
fn plugd_chat_asks_on_the_terminal_for_each_risky_call() {
    let ws = workspace("llm:\n  provider: scripted\n  script: \"${{workspace_dir}}/turns.yaml\"\n");
    std::fs::write(
        ws.dir().join("turns.yaml"),
        json!({"steps": [
            {"tool_calls": [{"name": "risky_hi", "arguments": {"n": 1}, "id": "c1"}]},
            {"text": "first done"},
            {"tool_calls": [{"name": "risky_hi", "arguments": {"n": 2}, "id": "c2"}]},
            {"text": "second done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let v = on_a_terminal(
        &ws,
        &["chat", "--session", "pty"],
        &[
            ("you> ", "one\n"),
            ("[y/N]", "y\n"),
            ("you> ", "two\n"),
            ("[y/N]", "no\n"),
            ("you> ", "/exit\n"),
        ],
    );
    let text = v["output"].as_str().unwrap();
    assert_eq!(
        (v["code"].clone(), v["steps"].clone()),
        (json!(0), json!(5)),
        "{text}"
    );
    assert!(
        text.contains(r#"arguments: {"n":1}"#) && text.contains(r#"arguments: {"n":2}"#),
        "{text}"
    );
    assert!(text.contains("[tool result] risky/hi ok"), "{text}");
    assert!(
        text.contains("[tool result] risky/hi failed") && text.contains("answered \"no\""),
        "{text}"
    );
    assert_eq!(runs(&ws, "hi"), 1, "only the approved call ran");
}

#[test]
fn a_medium_call_runs_and_records_a_notice_event() {
    let ws = workspace("");
    assert!(call(&ws, "risky/med", &[]).status.success());
    assert!(call(&ws, "risky/lo", &[]).status.success());
    assert_eq!((runs(&ws, "med"), runs(&ws, "lo")), (1, 1));
    let events = crate::support::block_on(async {
        ws.state().await.outbox_events("tool.risk_notice").await
    })
    .unwrap();
    assert_eq!(events.len(), 1, "only the medium call: {events:?}");
    let s = &events[0]["summary"];
    assert_eq!(
        (&s["tool"], &s["plugin"], &s["risk"]),
        (&json!("risky/med"), &json!("risky"), &json!("medium")),
        "{s}"
    );
}

#[test]
fn plugd_yaml_raises_a_low_tool_to_critical() {
    let ws = workspace("risk:\n  tools:\n    risky/plain: critical\n");
    let list: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    let row = |name: &str| crate::support::tool_row(&list, name);
    assert_eq!(row("risky/plain")["risk"], "critical");
    assert_eq!(row("risky/plain")["risk_source"], "config");
    assert_eq!(
        row("risky/plain")["risk_level"],
        "low",
        "the declaration stays visible"
    );
    assert_eq!(row("risky/hi")["risk_source"], "declared");
    refused(
        &call(&ws, "risky/plain", &["--yes"]),
        &["\"risky/plain\"", "risk critical"],
    );
    assert_eq!(runs(&ws, "plain"), 0);
    let show = stdout(&ws.plugd(&["plugin", "show", "risky"]));
    assert!(
        show.contains("risky/plain: critical (plugd.yaml)"),
        "{show}"
    );
    assert!(show.contains("risky/med: medium (declared)"), "{show}");
    let table = stdout(&ws.plugd(&["tool", "list"]));
    assert!(
        table.lines().any(|l| l.starts_with("risky/plain")
            && l.contains("critical")
            && l.contains("enabled")),
        "{table}"
    );
    // A bad level is refused with its field and line, and nothing runs.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "risk:\n  tools:\n    risky/lo: harmless\n",
    )
    .unwrap();
    refused(
        &call(&ws, "risky/lo", &[]),
        &["risk.tools.risky/lo", "\"harmless\"", "line 3"],
    );
    assert_eq!(runs(&ws, "lo"), 0);
}

#[tokio::test]
async fn disable_and_enable_a_tool_round_trip() {
    let ws = workspace("");
    let out = ws.plugd(&["tool", "disable", "risky/lo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("disabled tool risky/lo of plugin risky"));
    let list: Value =
        serde_json::from_str(&stdout(&ws.plugd(&["tool", "list", "--json"]))).unwrap();
    let lo = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "risky/lo")
        .unwrap();
    assert_eq!(lo["enabled"], false, "{lo}");
    refused(
        &call(&ws, "risky/lo", &[]),
        &["tool \"risky/lo\" of plugin \"risky\" is disabled; run `plugd tool enable risky/lo`"],
    );
    assert_eq!(runs(&ws, "lo"), 0);
    // The rest of the plugin is unaffected.
    assert!(call(&ws, "risky/med", &[]).status.success());
    // Again: already disabled; unknown names are refused clearly.
    assert!(stdout(&ws.plugd(&["tool", "disable", "risky/lo"])).contains("already disabled"));
    refused(
        &ws.plugd(&["tool", "disable", "risky/nope"]),
        &["no tool \"risky/nope\"", "plugd tool list"],
    );
    // The agent's tool list (Runtime::tools) leaves it out.
    let rt = ws.runtime(quick(10_000)).await;
    let names: Vec<String> = rt.tools().iter().map(|t| t.name.clone()).collect();
    assert!(!names.contains(&"risky/lo".to_owned()), "{names:?}");
    assert!(names.contains(&"risky/med".to_owned()), "{names:?}");
    drop(rt);
    let out = ws.plugd(&["tool", "enable", "risky/lo"]);
    assert_eq!(stdout(&out).trim(), "enabled tool risky/lo of plugin risky");
    assert!(call(&ws, "risky/lo", &[]).status.success());
    assert_eq!(runs(&ws, "lo"), 1);
}

#[test]
fn the_agent_turn_goes_through_the_gate() {
    let ws = workspace("llm:\n  provider: scripted\n  script: \"${{workspace_dir}}/turns.yaml\"\n");
    // risky/x is offered to the model as risky_x.
    std::fs::write(
        ws.dir().join("turns.yaml"),
        json!({"steps": [
            {"tool_calls": [
                {"name": "risky_med", "arguments": {}, "id": "c1"},
                {"name": "risky_crit", "arguments": {}, "id": "c2"}
            ]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    let out = ws.plugd(&["run", "--json", "go"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["ok"], true, "{v}");
    assert_eq!(calls[1]["ok"], false, "{v}");
    let err = calls[1]["result"].as_str().unwrap();
    assert!(
        err.contains("\"risky/crit\"") && err.contains("risk critical"),
        "{err}"
    );
    assert_eq!((runs(&ws, "med"), runs(&ws, "crit")), (1, 0));
    assert!(
        v["notices"].to_string().contains("MEDIUM_RISK_TOOL"),
        "the turn notes the medium call: {v}"
    );
}

/// A raw request with `body` as is (for malformed JSON); status and JSON body.
fn raw_post(serve: &Serve, path: &str, body: &str) -> (u16, Value) {
    let addr = serve.addr;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        serve.token,
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let json = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// Polls `GET /v1/approvals` until it lists one approval; returns it.
fn pending_one(serve: &Serve) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = serve.get("/v1/approvals").json();
        if let Some(a) = v.as_array().and_then(|a| a.first()) {
            assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
            return a.clone();
        }
        assert!(Instant::now() < end, "nothing pending: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A token named `demo` of role `agent` in `ws`; its secret.
fn demo_token(ws: &Ws) -> String {
    let out = plugd_cmd(ws.dir())
        .args([
            "token", "create", "--name", "demo", "--role", "agent", "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "token create: {}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["token"].as_str().unwrap().to_owned()
}

#[test]
fn http_calls_wait_for_an_operator() {
    let ws = workspace("");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let demo = demo_token(&ws);
    // A reason longer than any preview, on several lines.
    let long_reason = (0..60)
        .map(|i| format!("step {i} of the change freeze"))
        .collect::<Vec<_>>()
        .join(";\n");
    std::thread::scope(|scope| {
        // Approved: the waiting call completes.
        let call = scope.spawn(|| {
            request_as(
                &serve,
                &demo,
                "POST",
                "/v1/tools/risky/hi:invoke",
                &[("Content-Type", "application/json")],
                Some(&br#"{"args": {"n": 7}}"#[..]),
            )
        });
        let a = pending_one(&serve);
        assert_eq!(
            (&a["tool"], &a["plugin"], &a["risk"], &a["state"]),
            (
                &json!("risky/hi"),
                &json!("risky"),
                &json!("high"),
                &json!("pending")
            ),
            "{a}"
        );
        // Who asks: the token's identity and the door.
        assert_eq!(
            (&a["caller"], &a["surface"]),
            (&json!("token:demo"), &json!("http")),
            "{a}"
        );
        assert!(
            a.get("session_id").is_none() && a.get("agent_id").is_none(),
            "{a}"
        );
        assert_eq!(a["args_preview"], r#"{"n":7}"#);
        assert!(a["requested_at"].as_str().is_some_and(|s| !s.is_empty()));
        assert_eq!(runs(&ws, "hi"), 0, "nothing runs while it waits");
        let id = a["id"].as_str().unwrap().to_owned();
        let r = serve.post(
            &format!("/v1/approvals/{id}:approve"),
            &json!({"by": "ops"}),
        );
        assert_eq!(r.status, 200, "{:?}", r.json());
        // Who decided is the token's name, never the body's `by`.
        assert_eq!(r.json()["state"], json!("approved"));
        let by = r.json()["decided_by"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(by.starts_with("token:test-admin-"), "{by}");
        let done = call.join().unwrap();
        assert_eq!(done.status, 200, "{:?}", done.json());
        assert_eq!(done.json()["content"][0]["text"], "ran hi");
        assert_eq!(runs(&ws, "hi"), 1);
        // Approving twice, denying after approval: 409.
        let v = serve
            .post(&format!("/v1/approvals/{id}:approve"), &json!({}))
            .error(409, "approval_already_decided");
        assert_eq!(v["error"]["details"]["state"], "approved", "{v}");
        serve
            .post(&format!("/v1/approvals/{id}:deny"), &json!({}))
            .error(409, "approval_already_decided");
        // Unknown ids and actions, malformed bodies.
        let v = serve
            .post("/v1/approvals/apr_0000000000000000:approve", &json!({}))
            .error(404, "unknown_approval");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("apr_0000000000000000"),
            "{v}"
        );
        serve
            .post(&format!("/v1/approvals/{id}:frob"), &json!({}))
            .error(404, "not_found");
        let (status, v) = raw_post(&serve, &format!("/v1/approvals/{id}:approve"), "{\"by\": ");
        assert_eq!(
            (status, v["error"]["code"].clone()),
            (400, json!("malformed_json")),
            "{v}"
        );
        serve
            .post(
                &format!("/v1/approvals/{id}:approve"),
                &json!({"by": "x", "extra": 1}),
            )
            .error(422, "invalid_body");

        // Denied (through the CLI, on the same store): the typed error, no run.
        let call = scope.spawn(|| serve.post("/v1/tools/risky/crit:invoke", &json!({"args": {}})));
        let a = pending_one(&serve);
        let id = a["id"].as_str().unwrap().to_owned();
        let listed = stdout(&ws.plugd(&["approvals", "list"]));
        assert!(
            listed.contains(&id) && listed.contains("risky/crit"),
            "{listed}"
        );
        assert!(
            listed.contains("ASKED BY") && listed.contains("token:test-admin-"),
            "{listed}"
        );
        assert!(listed.contains(" via http"), "{listed}");
        let out = ws.plugd(&["approvals", "deny", &id, "--reason", "not today"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).starts_with(&format!("denied {id}")),
            "{}",
            stdout(&out)
        );
        let v = call.join().unwrap().error(403, "call_denied");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("\"risky/crit\"") && msg.contains("not today"),
            "{msg}"
        );
        assert_eq!(v["error"]["details"]["risk"], "critical", "{v}");
        assert_eq!(runs(&ws, "crit"), 0);
        assert_eq!(serve.get("/v1/approvals").json(), json!([]));

        // Denied over HTTP: the waiting caller gets the operator's whole reason.
        let call = scope.spawn(|| serve.post("/v1/tools/risky/crit:invoke", &json!({"args": {}})));
        let id = pending_one(&serve)["id"].as_str().unwrap().to_owned();
        let r = serve.post(
            &format!("/v1/approvals/{id}:deny"),
            &json!({"reason": long_reason}),
        );
        assert_eq!(r.status, 200, "{:?}", r.json());
        assert_eq!(r.json()["reason"], json!(long_reason));
        let v = call.join().unwrap().error(403, "call_denied");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.ends_with(&format!(": {long_reason}")), "{msg}");
        assert_eq!(runs(&ws, "crit"), 0);
    });
    // The records name the approvals' decisions.
    let mut rows = Vec::new();
    let written = eventually_blocking(Duration::from_secs(10), || {
        rows = serve.get("/v1/invocations?limit=100").json()["invocations"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        rows.iter()
            .filter(|r| r["tool"] == "risky/hi" || r["tool"] == "risky/crit")
            .count()
            == 3
    });
    assert!(written, "{rows:#?}");
    let hi = rows.iter().find(|r| r["tool"] == "risky/hi").unwrap();
    assert_eq!(hi["caller"], "token:demo", "{hi}");
    let d = &hi["payload"]["decisions"][0];
    assert_eq!(
        (&d["kind"], &d["risk"], &d["decision"]),
        (&json!("approval"), &json!("high"), &json!("approved")),
        "{hi}"
    );
    assert!(
        d["decided_by"]
            .as_str()
            .is_some_and(|b| b.starts_with("token:test-admin-")),
        "{hi}"
    );
    assert!(d["waited_ms"].as_u64().is_some(), "{hi}");
    let mut reasons: Vec<&str> = rows
        .iter()
        .filter(|r| r["tool"] == "risky/crit")
        .map(|r| {
            let d = &r["payload"]["decisions"][0];
            assert_eq!(
                (&d["kind"], &d["decision"]),
                (&json!("approval"), &json!("denied")),
                "{r}"
            );
            assert_eq!(r["payload"]["error"]["code"], "refused", "{r}");
            d["reason"].as_str().unwrap_or_default()
        })
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["not today", long_reason.as_str()]);
    // A disabled tool is gone from GET /v1/tools and refused by :invoke
    // (serve's runtime reads the control epoch at its next call, and every
    // CONSENT_POLL for listings).
    assert!(ws.plugd(&["tool", "disable", "risky/lo"]).status.success());
    let end = Instant::now() + Duration::from_secs(10);
    let tools = loop {
        let tools = serve.get("/v1/tools").json();
        if !tools.to_string().contains("risky/lo") || Instant::now() > end {
            break tools;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!tools.to_string().contains("risky/lo"), "{tools}");
    assert!(tools.to_string().contains("\"risk\":\"high\""), "{tools}");
    serve
        .post("/v1/tools/risky/lo:invoke", &json!({"args": {}}))
        .error(403, "tool_disabled");
    assert_eq!(runs(&ws, "lo"), 0);
}

#[test]
fn an_unanswered_http_call_times_out_denied() {
    let ws = workspace("risk:\n  approval_timeout_secs: 1\n");
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let started = Instant::now();
    let v = serve
        .post("/v1/tools/risky/hi:invoke", &json!({"args": {}}))
        .error(403, "approval_timed_out");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("\"risky/hi\"") && msg.contains("within 1 s"),
        "{msg}"
    );
    assert_eq!(runs(&ws, "hi"), 0);
    // The timed-out record cannot be approved afterwards.
    let id = v["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    serve
        .post(&format!("/v1/approvals/{id}:approve"), &json!({}))
        .error(409, "approval_already_decided");
    assert_eq!(runs(&ws, "hi"), 0);
}
