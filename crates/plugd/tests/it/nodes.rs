//! Three `plugd serve` nodes as one service on a real PostgreSQL 15 (`TestPg`) and a real nats-server with JetStream (`TestNats`), each node in its own workspace, the test as the load balancer: consent, MCP sessions and tokens hold on every node whichever node a request reaches.
//!
//! Only node A has the plugin's directory: B and C list its tools from the
//! approval and start it from the approval's pin taken from NATS, verified
//! by its digest.

use std::path::Path;
use std::time::Duration;

use plugd_nats::test_nats::TestNats;
use plugd_store_pg::test_pg::TestPg;
use serde_json::{Value, json};

use crate::gateway::{initialize, mcp_post};
use crate::http::{Resp, Serve, request_as};
use crate::support::{
    Stopped, TEST_MASTER_KEY, copy_dir, eventually_blocking, plugd_cmd, repo, sqlite_only, stderr,
    stdout,
};

/// One cluster: its database, its NATS, three workspaces and their nodes.
struct Cluster {
    url: String,
    nats: TestNats,
    dirs: Vec<tempfile::TempDir>,
    nodes: Vec<Serve>,
    /// The cluster's own PostgreSQL server, when it has one (dropped
    /// after the nodes).
    pg: Option<TestPg>,
}

impl Cluster {
    /// A fresh cluster database, `plugd cluster init`, and three nodes
    /// `a`, `b`, `c`; `setup` prepares each node's workspace first.
    fn start(setup: impl Fn(char, &Path)) -> Cluster {
        Cluster::start_env(setup, &[])
    }

    /// [`Cluster::start`] with extra environment for every node.
    fn start_env(setup: impl Fn(char, &Path), env: &[(&str, &str)]) -> Cluster {
        Cluster::start_with(setup, env, |_, url| url.to_owned())
    }

    /// [`Cluster::start_env`], each node reaching the database at
    /// `url_for(node, the cluster's url)` (a proxy, say).
    fn start_with(
        setup: impl Fn(char, &Path),
        env: &[(&str, &str)],
        url_for: impl Fn(char, &str) -> String,
    ) -> Cluster {
        let nats = TestNats::start();
        let nats_url = nats.url();
        let env = |_: char| {
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let url = TestPg::shared().fresh_database();
        Cluster::start_on(nats, &nats_url, url, setup, &env, url_for)
    }

    /// [`Cluster::start`] on a PostgreSQL server of its own (which the
    /// test may restart: the shared one serves other tests meanwhile).
    fn start_own_pg(setup: impl Fn(char, &Path)) -> Cluster {
        let pg = TestPg::start().unwrap();
        let url = pg.fresh_database();
        let nats = TestNats::start();
        let nats_url = nats.url();
        let mut cl = Cluster::start_on(nats, &nats_url, url, setup, &|_| Vec::new(), |_, u| {
            u.to_owned()
        });
        cl.pg = Some(pg);
        cl
    }

    /// [`Cluster::start_with`] on `nats`, which the nodes reach at
    /// `nats_url` (credentials included, say).
    fn start_on(
        nats: TestNats,
        nats_url: &str,
        url: String,
        setup: impl Fn(char, &Path),
        env: &dyn Fn(char) -> Vec<(String, String)>,
        url_for: impl Fn(char, &str) -> String,
    ) -> Cluster {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        for (dir, n) in dirs.iter().zip("abc".chars()) {
            setup(n, dir.path());
        }
        let init = plugd_cmd(dirs[0].path())
            .env("PLUGD_MASTER_KEY", TEST_MASTER_KEY)
            .args(["cluster", "init", "--state", &url])
            .output()
            .unwrap();
        assert!(init.status.success(), "cluster init: {}", stderr(&init));
        let mut cluster = Cluster {
            url,
            nats,
            dirs,
            nodes: Vec::new(),
            pg: None,
        };
        let token = cluster.token("admin", "ops");
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            let dir = cluster.dirs[i].path();
            let mut cmd = cluster.plugd(dir);
            cmd.env(
                "PLUGD_STATE",
                url_for(id.chars().next().unwrap(), &cluster.url),
            )
            .env("PLUGD_NATS", nats_url)
            .envs(env(id.chars().next().unwrap()))
            .args(["serve", "--listen", "127.0.0.1:0"]);
            // A node whose plugd.yaml names it (`cluster: node_id:`) is
            // left to that.
            let yaml = std::fs::read_to_string(dir.join("plugd.yaml")).unwrap_or_default();
            if !yaml.contains("node_id:") {
                cmd.env("PLUGD_NODE_ID", id);
            }
            let log = dir.join("serve.log");
            cluster.nodes.push(Serve::spawn(cmd, log, token.clone()));
        }
        cluster
    }

    /// plugd on `dir` with the cluster's state and key.
    fn plugd(&self, dir: &Path) -> std::process::Command {
        let mut cmd = plugd_cmd(dir);
        cmd.env("PLUGD_STATE", &self.url)
            .env("PLUGD_MASTER_KEY", TEST_MASTER_KEY);
        cmd
    }

    /// A token of `role` named `name`, made on node A's workspace.
    fn token(&self, role: &str, name: &str) -> String {
        let out = self
            .plugd(self.dirs[0].path())
            .args(["token", "create", "--name", name, "--role", role, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "token create: {}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token"].as_str().unwrap().to_owned()
    }

    /// Whether every node of `nodes` lists every plugin of `ids` approved.
    fn approved_on(&self, nodes: &[char], ids: &[&str]) -> bool {
        nodes.iter().all(|n| {
            let list = self.node(*n).get("/v1/plugins").json();
            let ps = list.as_array().cloned().unwrap_or_default();
            ids.iter()
                .all(|id| ps.iter().any(|p| p["id"] == *id && p["approved"] == true))
        })
    }

    fn node(&self, name: char) -> &Serve {
        &self.nodes[(name as u8 - b'a') as usize]
    }

    fn tools(&self, name: char) -> Vec<String> {
        let r = self.node(name).get("/v1/tools");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn invoke(&self, name: char, token: &str) -> Resp {
        request_as(
            self.node(name),
            token,
            "POST",
            "/v1/tools/hello_bash_greet:invoke",
            &[("Content-Type", "application/json")],
            Some(json!({"args": {"name": "nodes"}}).to_string().as_bytes()),
        )
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .zip("abc".chars())
            .map(|(n, c)| format!("--- node {c}:\n{}", n.log_text()))
            .collect()
    }
}

fn copy_example(dir: &Path, name: &str) {
    let from = repo().join("examples/workspace/.plugins").join(name);
    let to = dir.join(".plugins").join(name);
    std::fs::create_dir_all(&to).unwrap();
    for e in std::fs::read_dir(&from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

const TOOL: &str = "hello_bash_greet";

#[test]
fn consent_sessions_and_tokens_hold_on_every_node() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // Every node declares the same MCP server (for progress below).
    let cl = Cluster::start(|n, dir| {
        if n == 'a' {
            copy_example(dir, "hello-bash");
        }
        let servers = json!({"mcpServers": {"everything": crate::mcp::everything()}});
        std::fs::write(dir.join(".mcp.json"), servers.to_string()).unwrap();
    });
    let admin = cl.node('a').token.clone();

    // Only A has the plugin's directory; nobody has approved it.
    let r = cl.node('b').get("/v1/plugins");
    assert!(!r.text().contains("hello_bash"), "{}", r.text());

    // Approve on A: within 2 s B and C list its tools without a copy.
    let r = cl
        .node('a')
        .post("/v1/plugins/hello_bash:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = eventually_blocking(Duration::from_secs(2), || {
        cl.tools('b').contains(&TOOL.to_owned()) && cl.tools('c').contains(&TOOL.to_owned())
    });
    assert!(listed, "B and C list the tool within 2 s\n{}", cl.logs());

    // The first call on C takes the pin from NATS, verifies it, runs it.
    let r = cl.invoke('c', &admin);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), cl.logs());
    assert!(r.text().contains("nodes"), "{}", r.text());
    assert!(
        cl.node('c')
            .log_text()
            .contains("took the approval's pin from the cluster"),
        "{}",
        cl.logs()
    );
    // C runs it from a read-only pin, not from a directory of its own.
    let show = cl.node('c').get("/v1/plugins/hello_bash").json();
    let dir = show["dir"].as_str().unwrap_or_default();
    assert!(dir.contains("/.plugd/pins/"), "{show}");

    // Disable on A: refused on B at the next request; enabled again, it runs.
    let r = cl
        .node('a')
        .post(&format!("/v1/tools/{TOOL}:disable"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = cl.invoke('b', &admin);
    assert_ne!(r.status, 200, "a tool disabled on A ran on B: {}", r.text());
    let r = cl
        .node('a')
        .post(&format!("/v1/tools/{TOOL}:enable"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = cl.invoke('b', &admin);
    assert_eq!(r.status, 200, "{}\n{}", r.text(), cl.logs());

    // An MCP session initialized on A continues on B and C; another
    // identity gets 404 on every node; DELETE on C ends it everywhere.
    let alice = cl.token("agent", "alice");
    let bob = cl.token("agent", "bob");
    let r = mcp_post(cl.node('a'), &alice, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let session = r.header("mcp-session-id").unwrap().to_owned();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": TOOL, "arguments": {"name": "mcp"}}});
    for n in ['b', 'c'] {
        let r = mcp_post(cl.node(n), &alice, "/mcp", Some(&session), &call);
        assert_eq!(r.status, 200, "node {n}: {}", r.text());
        assert!(r.text().contains("mcp"), "node {n}: {}", r.text());
        let r = mcp_post(cl.node(n), &bob, "/mcp", Some(&session), &call);
        assert_eq!(
            r.status,
            404,
            "node {n} served another identity: {}",
            r.text()
        );
    }
    // Progress over SSE on the continued session: a call with a progress
    // token on B streams each step's progress, then the result.
    let r = cl
        .node('a')
        .post("/v1/plugins/everything:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    const LONG: &str = "everything__trigger-long-running-operation";
    let listed = eventually_blocking(Duration::from_secs(10), || {
        cl.tools('b')
            .contains(&"everything/trigger-long-running-operation".to_owned())
    });
    assert!(listed, "B lists {:?}\n{}", cl.tools('b'), cl.logs());
    let long = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": LONG, "arguments": {"duration": 1, "steps": 2},
        "_meta": {"progressToken": "p"}}});
    let r = mcp_post(cl.node('b'), &alice, "/mcp", Some(&session), &long);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        r.header("content-type")
    );
    let text = r.text();
    let progress = text
        .find("notifications/progress")
        .expect("progress events");
    let result = text.find("\"result\"").expect("the result");
    assert!(
        progress < result && text.matches("notifications/progress").count() >= 2,
        "{text}"
    );
    assert!(text.contains("\"progressToken\":\"p\""), "{text}");

    let r = request_as(
        cl.node('c'),
        &alice,
        "DELETE",
        "/mcp",
        &[("Mcp-Session-Id", &session)],
        None,
    );
    assert_eq!(r.status, 204, "{}", r.text());
    for n in ['a', 'b'] {
        let r = mcp_post(cl.node(n), &alice, "/mcp", Some(&session), &call);
        assert_eq!(
            r.status,
            404,
            "node {n} kept an ended session: {}",
            r.text()
        );
    }

    // Revoke on B: the next call on every node is refused, every node
    // drops its tools and stops its process within 2 s, and C (which had
    // no copy) forgets the plugin.
    let r = cl
        .node('b')
        .post("/v1/plugins/hello_bash:revoke", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    for n in ['a', 'b', 'c'] {
        let r = cl.invoke(n, &admin);
        assert_ne!(r.status, 200, "node {n} ran a revoked plugin: {}", r.text());
    }
    let gone = eventually_blocking(Duration::from_secs(2), || {
        ['a', 'b', 'c']
            .iter()
            .all(|n| !cl.tools(*n).contains(&TOOL.to_owned()))
            && !cl
                .node('c')
                .get("/v1/plugins")
                .text()
                .contains("hello_bash")
            && cl.node('a').get("/v1/plugins/hello_bash").json()["status"]["pid"].is_null()
    });
    assert!(
        gone,
        "revocation reached every node within 2 s\n{}",
        cl.logs()
    );

    // A token revoked through one node is refused by all at the next request.
    let out = cl
        .plugd(cl.dirs[2].path())
        .args(["token", "revoke", "alice"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for n in ['a', 'b', 'c'] {
        let r = request_as(cl.node(n), &alice, "GET", "/v1/tools", &[], None);
        assert_eq!(
            r.status,
            401,
            "node {n} accepted a revoked token: {}",
            r.text()
        );
    }
}

#[test]
fn every_node_lists_the_cluster_and_one_with_another_config_is_not_ready() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // C starts with another plugd.yaml than A and B.
    let cl = Cluster::start(|n, dir| {
        // C also takes its id from plugd.yaml's `cluster:`.
        let text = if n == 'c' {
            "# node c differs\ncluster:\n  node_id: c\n"
        } else {
            "# the cluster's\n"
        };
        std::fs::write(dir.join("plugd.yaml"), text).unwrap();
    });
    let listed = eventually_blocking(Duration::from_secs(3), || {
        cl.node('b').get("/v1/cluster").json()["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 3)
    });
    assert!(listed, "{}", cl.node('b').get("/v1/cluster").text());
    let view = cl.node('b').get("/v1/cluster").json();
    assert_eq!(view["this_node"], "b", "{view}");
    let nodes = view["nodes"].as_array().unwrap();
    let key_id = plugd_store::secrets::MasterKey::from_hex(TEST_MASTER_KEY, "test")
        .unwrap()
        .id()
        .to_owned();
    let ids: Vec<_> = nodes
        .iter()
        .map(|n| n["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b", "c"], "{view}");
    for n in nodes {
        assert_eq!(n["schema_version"], nodes[0]["schema_version"], "{view}");
        assert_eq!(n["key_id"], key_id, "{view}");
        assert!(
            n["addr"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{view}"
        );
        assert_eq!(n["config_current"], n["node_id"] != "c", "{view}");
    }
    assert_eq!(view["config_digest"], nodes[0]["config_digest"], "{view}");
    assert_ne!(nodes[2]["config_digest"], view["config_digest"], "{view}");

    // Ready without credentials on A and B; C says why it is not.
    for n in ['a', 'b'] {
        let r = request_as(cl.node(n), "", "GET", "/readyz", &[], None);
        assert_eq!(r.status, 200, "node {n}: {}", r.text());
    }
    let r = request_as(cl.node('c'), "", "GET", "/readyz", &[], None);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text());
    assert!(r.text().contains("plugd.yaml"), "{}", r.text());

    // `plugd cluster status` shows the same from any workspace.
    let out = cl
        .plugd(cl.dirs[1].path())
        .args(["cluster", "status"])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for id in ["a ", "b ", "c "] {
        assert!(text.lines().any(|l| l.starts_with(id)), "{text}");
    }
    assert_eq!(text.matches("(differs)").count(), 1, "{text}");

    // A node that stops leaves the list at once.
    let mut nodes = cl.nodes;
    let c = nodes.pop().unwrap();
    let (status, log) = c.stop();
    assert!(status.success(), "{log}");
    let v = nodes[0].get("/v1/cluster").json();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn a_call_waits_on_one_node_for_another_and_a_killed_node_loses_no_session() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    let cl = Cluster::start(|n, dir| {
        std::fs::write(
            dir.join("plugd.yaml"),
            "risk:\n  tools:\n    hello_python_add: high\n",
        )
        .unwrap();
        if n == 'a' {
            copy_example(dir, "hello-python");
        }
    });
    let admin = cl.node('a').token.clone();
    let r = cl
        .node('a')
        .post("/v1/plugins/hello_python:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = eventually_blocking(Duration::from_secs(2), || {
        cl.tools('b').contains(&"hello_python_add".to_owned())
    });
    assert!(listed, "{}", cl.logs());

    // A `high` call waiting on B is approved through C and proceeds.
    std::thread::scope(|s| {
        let b = cl.node('b');
        let call = s.spawn(|| {
            b.post(
                "/v1/tools/hello_python_add:invoke",
                &json!({"args": {"a": 2, "b": 3}}),
            )
        });
        let mut id = None;
        let seen = eventually_blocking(Duration::from_secs(10), || {
            id = cl
                .node('c')
                .get("/v1/approvals")
                .json()
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .find(|p| p["state"] == "pending")
                        .and_then(|p| p["id"].as_str().map(str::to_owned))
                });
            id.is_some()
        });
        assert!(seen, "C sees the call waiting on B\n{}", cl.logs());
        let id = id.unwrap();
        let r = cl
            .node('c')
            .post(&format!("/v1/approvals/{id}:approve"), &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
        let done = call.join().unwrap();
        assert_eq!(done.status, 200, "{}\n{}", done.text(), cl.logs());
        assert!(done.text().contains('5'), "{}", done.text());
    });

    // An elicitation raised by a call on A (an MCP client that can answer
    // approves the `high` call itself) answered by a POST that lands on B:
    // B hands the answer to A, and the call completes on A's stream.
    elicit_across(&cl, 'a', 'b', &admin);

    // A one-time console code tried on the three nodes at once logs in once.
    let out = cl.plugd(cl.dirs[1].path()).arg("console").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let link = stdout(&out);
    let code = link.trim().rsplit_once("#code=").unwrap().1.to_owned();
    let body = json!({"code": code}).to_string();
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let tries: Vec<_> = cl
            .nodes
            .iter()
            .map(|n| {
                let body = body.clone();
                s.spawn(move || {
                    request_as(
                        n,
                        "",
                        "POST",
                        "/console/login",
                        &[("Content-Type", "application/json")],
                        Some(body.as_bytes()),
                    )
                    .status
                })
            })
            .collect();
        tries.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 204).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        2,
        "{statuses:?}"
    );

    // An MCP session on A; A is killed (-9); the next call on B continues
    // the session without initializing again.
    let r = mcp_post(cl.node('a'), &admin, "/mcp", None, &initialize());
    assert_eq!(r.status, 200, "{}", r.text());
    let session = r.header("mcp-session-id").unwrap().to_owned();
    let mut nodes = cl.nodes;
    let mut a = nodes.remove(0);
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "hello_python_greet", "arguments": {"name": "after"}}});
    let r = mcp_post(&nodes[0], &admin, "/mcp", Some(&session), &call);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("after"), "{}", r.text());
}

/// A `high` call of `hello_python_add` on node `ask` by an MCP client that
/// can answer elicitations: the approval question comes on `ask`'s stream,
/// the client's answer is POSTed to node `answering`, and the call completes.
fn elicit_across(cl: &Cluster, ask: char, answering: char, admin: &str) {
    let mut init = initialize();
    init["params"]["capabilities"] = json!({"elicitation": {}});
    let r = mcp_post(cl.node(ask), admin, "/mcp", None, &init);
    assert_eq!(r.status, 200, "{}", r.text());
    let asking = r.header("mcp-session-id").unwrap().to_owned();
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                      "params": {"name": "hello_python_add", "arguments": {"a": 20, "b": 22}}});
    let mut stream = crate::http::connect(cl.node(ask).addr);
    let body = call.to_string();
    let len = body.len().to_string();
    crate::http::write_head_as(
        &mut stream,
        "POST",
        "/mcp",
        cl.node(ask),
        admin,
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", &asking),
            ("Content-Length", &len),
        ],
    );
    std::io::Write::write_all(&mut stream, body.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let (status, _) = crate::http::read_head(&mut reader);
    assert_eq!(status, 200);
    // Each SSE message of A's stream, as it comes.
    let mut pending = String::new();
    let mut next_message = || -> Value {
        loop {
            if let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: "))
                    && let Ok(v) = serde_json::from_str::<Value>(data)
                {
                    return v;
                }
                continue;
            }
            let chunk = crate::http::read_chunk(&mut reader).expect("the stream ended early");
            pending.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    let question = loop {
        let m = next_message();
        if m["method"] == "elicitation/create" {
            break m;
        }
    };
    let answer = json!({"jsonrpc": "2.0", "id": question["id"],
                        "result": {"action": "accept", "content": {"approve": true}}});
    let r = mcp_post(cl.node(answering), admin, "/mcp", Some(&asking), &answer);
    assert_eq!(r.status, 202, "{}", r.text());
    let result = loop {
        let m = next_message();
        if m["id"] == 9 {
            break m;
        }
    };
    assert_eq!(
        result["result"]["isError"],
        false,
        "{result}\n{}",
        cl.logs()
    );
    assert!(result.to_string().contains("42"), "{result}");
}

/// The pids of plugin `id`'s processes on `node`.
fn plugin_pids(node: &Serve, id: &str) -> Vec<u64> {
    let show = node
        .get(&format!("/v1/plugins/{}", id.replace('/', "%2F")))
        .json();
    show["processes"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .flat_map(|p| p["pids"].as_array().cloned().unwrap_or_default())
                .filter_map(|p| p.as_u64())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn hook_deliveries_are_shared_by_every_node_and_applied_once() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    const EVENTS: usize = 2_000;
    const PACKAGE: &str = "test/outbox";
    let ledger_dir = tempfile::tempdir().unwrap();
    let ledger = ledger_dir.path().join("ledger.jsonl");
    std::fs::write(&ledger, "").unwrap();
    let yaml = format!(
        "# the test's ledger is outside every workspace\nsandbox:\n  plugins:\n    \"{PACKAGE}\": {{enabled: false}}\n"
    );
    // A also has a harness (acme/threads/triage): its runs end with their
    // `run.completed` in one transaction, which the recorder hears too.
    let setup = |n: char, dir: &Path| {
        std::fs::write(dir.join("plugd.yaml"), &yaml).unwrap();
        if n == 'a' {
            outbox_package(dir, &ledger);
            copy_dir(
                &repo().join("examples/workspace/.plugins/acme-threads"),
                &dir.join(".plugins/acme-threads"),
            );
        }
    };
    // Leases of 3 s, so a dead node's deliveries come back quickly.
    let env = [
        ("PLUGD_OUTBOX_LEASE_MS", "3000"),
        ("PLUGD_OUTBOX_POLL_MS", "100"),
    ];
    let mut cl = Cluster::start_env(setup, &env);
    for id in ["test%2Foutbox", "acme%2Fthreads"] {
        let r = cl
            .node('a')
            .post(&format!("/v1/plugins/{id}:approve"), &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // (How soon is the consent test's; here it is only the start.)
    let known = eventually_blocking(Duration::from_secs(10), || {
        cl.approved_on(&['b', 'c'], &[PACKAGE, "acme/threads"])
    });
    assert!(known, "B and C know the approved package\n{}", cl.logs());

    // The events, straight into the cluster's outbox.
    let enqueue = |from: usize, to: usize| enqueue(&cl.url, from, to);
    let enqueued = enqueue(0, EVENTS);
    assert_eq!(enqueued.len(), EVENTS);

    // Applied exactly once each: the ledger keeps the first of each id
    // (its UNIQUE constraint) and counts the rest as duplicates.
    let read = || -> (std::collections::BTreeMap<String, u64>, usize) {
        let mut first = std::collections::BTreeMap::new();
        let mut dups = 0;
        for line in std::fs::read_to_string(&ledger).unwrap().lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let id = v["delivery_id"].as_str().unwrap_or_default().to_owned();
            // Who applied it first: the plugin's parent is the node's serve.
            match first.entry(id) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(v["ppid"].as_u64().unwrap_or(0));
                }
                std::collections::btree_map::Entry::Occupied(_) => dups += 1,
            }
        }
        (first, dups)
    };
    let drained = eventually_blocking(Duration::from_secs(90), || read().0.len() >= EVENTS);
    let (applied, dups) = read();
    assert!(
        drained,
        "{} of {EVENTS} applied\n{}",
        applied.len(),
        cl.logs()
    );
    let want: std::collections::BTreeSet<&String> = enqueued.iter().collect();
    let got: std::collections::BTreeSet<&String> = applied.keys().collect();
    assert_eq!(want, got, "the applied set is the enqueued set");
    assert_eq!(dups, 0, "no delivery applied twice without a crash");

    // Every node took its share, counted by the serve process that
    // started the plugin (its parent), whichever plugin process it was.
    let serve_pid = |n: char| u64::from(cl.node(n).child.id());
    for n in ['a', 'b', 'c'] {
        let handled = applied.values().filter(|p| **p == serve_pid(n)).count();
        assert!(
            handled * 5 >= EVENTS,
            "node {n} (serve pid {}) handled {handled} of {EVENTS}, under 20 %",
            serve_pid(n)
        );
    }

    // 1,000 more; `kill -9` of the node holding the most leases mid-load.
    // Everything is applied; only what it held when it died is attempted
    // again (after its 3 s lease).
    let more = enqueue(EVENTS, EVENTS + 1_000);
    let started = eventually_blocking(Duration::from_secs(30), || read().0.len() >= EVENTS + 100);
    assert!(started, "{}", cl.logs());
    let victim = busiest(&cl.url);
    let vi = (victim as u8 - b'a') as usize;
    let victim_pids = plugin_pids(cl.node(victim), PACKAGE);
    let others: Vec<u64> = "abc"
        .chars()
        .filter(|n| *n != victim)
        .map(serve_pid)
        .collect();
    let mut dead = cl.nodes.remove(vi);
    // Harness runs on it until it dies, one likely under way then.
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    let killed_at = std::thread::scope(|s| {
        let (dead, sessions) = (&dead, &sessions);
        s.spawn(move || {
            loop {
                let i = sessions.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = json!({"session_id": format!("kr-{i}"), "harness": "acme/threads/triage", "input": "go"});
                let posted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    dead.post("/v1/runs", &body)
                }));
                if posted.is_err() {
                    break;
                }
            }
        });
        std::thread::sleep(Duration::from_millis(1500));
        let pid = rustix::process::Pid::from_raw(dead.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        std::time::SystemTime::now()
    });
    dead.child.wait().unwrap();
    let want: std::collections::BTreeSet<&String> = enqueued.iter().chain(&more).collect();
    let drained = eventually_blocking(Duration::from_secs(60), || {
        let (applied, _) = read();
        want.iter().all(|id| applied.contains_key(*id))
    });
    let (applied, dups) = read();
    assert!(
        drained,
        "{} of {} applied after the kill\n{}",
        applied.len(),
        EVENTS + 1_000,
        cl.logs()
    );
    let got: std::collections::BTreeSet<&String> = applied.keys().collect();
    assert!(got.is_superset(&want), "every enqueued delivery applied");
    // No run completed without its event: each harness run that
    // succeeded on the dead node reached the recorder with its
    // `run.completed`, and every other delivery is such an event.
    let text = std::fs::read_to_string(&ledger).unwrap();
    let run_events: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"]["summary"].get("n").is_none())
        .filter_map(|v| v["event"]["subject"]["id"].as_str().map(str::to_owned))
        .collect();
    let mut completed = 0;
    for i in 0..sessions.load(std::sync::atomic::Ordering::SeqCst) {
        let runs = cl
            .node(if victim == 'a' { 'b' } else { 'a' })
            .get(&format!("/v1/runs?session_id=kr-{i}"))
            .json();
        for run in runs["runs"].as_array().into_iter().flatten() {
            if run["kind"] == "harness" && run["status"] == "succeeded" {
                completed += 1;
                let id = run["id"].as_str().unwrap();
                let heard = eventually_blocking(Duration::from_secs(10), || {
                    std::fs::read_to_string(&ledger)
                        .unwrap()
                        .contains(&format!("\"id\": \"{id}\""))
                });
                assert!(
                    heard,
                    "run {id} completed without its event reaching the hook"
                );
            }
        }
    }
    assert!(completed > 0, "no harness run completed on node {victim}");
    for id in got.difference(&want) {
        let line = text.lines().find(|l| l.contains(id.as_str())).unwrap();
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["event"]["type"], "run.completed", "{line}");
        assert!(
            v["event"]["subject"]["id"]
                .as_str()
                .is_some_and(|r| run_events.contains(r)),
            "{line}"
        );
    }
    // The dead node's deliveries were attempted again within the lease
    // (3 s) and a second of its death.
    let deadline = killed_at + Duration::from_secs(4);
    let deadline = deadline
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v["attempt"].as_u64() > Some(1)
            && want.contains(&v["delivery_id"].as_str().unwrap().to_owned())
        {
            assert!(
                v["t"].as_f64().unwrap() <= deadline,
                "re-attempted {:.2} s after the kill: {line}",
                v["t"].as_f64().unwrap() - (deadline - 4.0)
            );
        }
    }
    // A re-attempt only for a delivery the dead node held (at most its 16
    // in flight): its first application was not by another node (by the
    // dead node's plugin, or by that plugin orphaned, finishing what it had
    // read, its parent now init).
    assert!(dups <= 16, "{dups} deliveries applied twice");
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["delivery_id"].as_str().unwrap().to_owned();
        if !seen.insert(id.clone()) {
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(&id)).collect();
            let lost: Vec<String> = cl
                .logs()
                .lines()
                .filter(|l| l.contains("lease") || l.contains("restart") || l.contains("exited"))
                .map(str::to_owned)
                .collect();
            assert!(
                !others.contains(&applied[&id]),
                "{id} was re-attempted but node {victim} never held it (the others are {others:?})\n{}\n{}",
                lines.join("\n"),
                lost.join("\n")
            );
        }
    }
    // It restarts and leaves no orphan of its killed plugin behind.
    let mut cmd = cl.plugd(cl.dirs[vi].path());
    cmd.env("PLUGD_NATS", cl.nats.url())
        .env("PLUGD_NODE_ID", victim.to_string())
        .envs(env.iter().copied())
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let token = dead.token.clone();
    let _again = Serve::spawn(cmd, cl.dirs[vi].path().join("serve-2.log"), token);
    for pid in &victim_pids {
        let gone = eventually_blocking(Duration::from_secs(5), || {
            !Path::new(&format!("/proc/{pid}")).exists()
        });
        assert!(
            gone,
            "plugin process {pid} of the killed node is still alive"
        );
    }
}

/// A TCP proxy on loopback in front of the test PostgreSQL's Unix socket
/// that can cut the node using it off: while cut, what either side sends is
/// swallowed (the connections stay open, as across a partition that drops
/// packets) and new connections get nothing; healing closes the swallowed
/// ones and forwards again.
struct PgProxy {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    victims: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl PgProxy {
    /// A proxy to the socket of the database at `url` (a `TestPg` URL).
    fn start(url: &str) -> PgProxy {
        use std::sync::atomic::Ordering;
        let param = |k: &str| {
            url.split(['?', '&'])
                .find_map(|p| p.strip_prefix(&format!("{k}=")))
                .unwrap()
                .to_owned()
        };
        let socket = Path::new(&param("host")).join(format!(".s.PGSQL.{}", param("port")));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let victims = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, v) = (cut.clone(), victims.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                v.lock().unwrap().push(conn.try_clone().unwrap());
                let Ok(db) = std::os::unix::net::UnixStream::connect(&socket) else {
                    continue;
                };
                let pump =
                    |mut from: Box<dyn std::io::Read + Send>,
                     mut to: Box<dyn std::io::Write + Send>,
                     cut: std::sync::Arc<std::sync::atomic::AtomicBool>| {
                        std::thread::spawn(move || {
                            let mut buf = [0u8; 16384];
                            loop {
                                match from.read(&mut buf) {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) if !cut.load(Ordering::SeqCst) => {
                                        if to.write_all(&buf[..n]).is_err() {
                                            return;
                                        }
                                    }
                                    Ok(_) => {}
                                }
                            }
                        });
                    };
                pump(
                    Box::new(conn.try_clone().unwrap()),
                    Box::new(db.try_clone().unwrap()),
                    c.clone(),
                );
                pump(Box::new(db), Box::new(conn), c.clone());
            }
        });
        PgProxy { port, cut, victims }
    }

    /// `url` through this proxy.
    fn url(&self, url: &str) -> String {
        let db = url.split('?').next().unwrap().rsplit('/').next().unwrap();
        format!("postgres://plugd@127.0.0.1:{}/{db}", self.port)
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn heal(&self) {
        for c in self.victims.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_node_cut_off_from_postgres_answers_503_and_never_accepts_a_revoked_token() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    let proxy = std::sync::OnceLock::<PgProxy>::new();
    let cl = Cluster::start_with(
        |_, _| {},
        &[],
        |n, url| {
            if n == 'a' {
                proxy.get_or_init(|| PgProxy::start(url)).url(url)
            } else {
                url.to_owned()
            }
        },
    );
    let proxy = proxy.get().unwrap();
    let agent = cl.token("agent", "agent-1");
    let tools = |n: char| request_as(cl.node(n), &agent, "GET", "/v1/tools", &[], None);
    let ready = |n: char| request_as(cl.node(n), "", "GET", "/readyz", &[], None).status;
    for n in ['a', 'b', 'c'] {
        assert_eq!(tools(n).status, 200);
        assert_eq!(ready(n), 200);
    }

    // Cut A off: within 3 s it answers 503 (and says so to its load
    // balancer); the others go on.
    proxy.cut();
    let started = std::time::Instant::now();
    let unready = eventually_blocking(Duration::from_secs(3), || ready('a') == 503);
    assert!(unready, "A still ready 3 s after the cut\n{}", cl.logs());
    let t = std::time::Instant::now();
    let r = tools('a');
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(9));
    assert_eq!(ready('b'), 200);

    // The token is revoked meanwhile (through C's workspace); A, cut off,
    // never accepts it.
    let out = cl
        .plugd(cl.dirs[2].path())
        .args(["token", "revoke", "agent-1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(tools('b').status, 401);
    for _ in 0..3 {
        let s = tools('a').status;
        assert!(
            s == 503 || s == 401,
            "A answered {s} to a revoked token while cut off"
        );
    }

    // Healed: A is ready again within 5 s and refuses the token.
    proxy.heal();
    let back = eventually_blocking(Duration::from_secs(5), || ready('a') == 200);
    assert!(back, "A not ready 5 s after healing\n{}", cl.logs());
    assert_eq!(tools('a').status, 401);
}

/// Counter `name` of `node`'s `GET /metrics`.
fn metric(node: &Serve, name: &str) -> u64 {
    let text = node.get("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn while_nats_is_frozen_or_away_the_nodes_serve_and_count_what_they_cannot_share() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // A hook package (its ledger outside every workspace), approved and
    // known on every node before NATS goes.
    let ledger_dir = tempfile::tempdir().unwrap();
    let ledger = ledger_dir.path().join("ledger.jsonl");
    std::fs::write(&ledger, "").unwrap();
    let mut cl = Cluster::start_env(
        |n, dir| {
            std::fs::write(
                dir.join("plugd.yaml"),
                "sandbox:\n  plugins:\n    \"test/outbox\": {enabled: false}\n",
            )
            .unwrap();
            if n == 'a' {
                outbox_package(dir, &ledger);
            }
        },
        &[("PLUGD_OUTBOX_POLL_MS", "100")],
    );
    let r = cl
        .node('a')
        .post("/v1/plugins/test%2Foutbox:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let known = eventually_blocking(Duration::from_secs(10), || {
        cl.approved_on(&['b', 'c'], &["test/outbox"])
    });
    assert!(known, "{}", cl.logs());
    let publish = |cl: &Cluster, n: char| {
        let r = cl.node(n).post(
            "/v1/bus/publish",
            &json!({"subject": "plugin.test.nodes", "payload": {"n": 1}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    };
    const RECEIVED: &str = "plugd_cluster_bus_received_total";
    const DROPPED: &str = "plugd_cluster_bus_dropped_total";
    let before = metric(cl.node('b'), RECEIVED);
    publish(&cl, 'a');
    let got = eventually_blocking(Duration::from_secs(2), || {
        metric(cl.node('b'), RECEIVED) > before
    });
    assert!(got, "B received A's event\n{}", cl.logs());
    // A session on B, and an answer to a question B never asked (another
    // node's, as far as B can tell): handed off, nobody takes it, 202.
    let r = mcp_post(
        cl.node('b'),
        &cl.node('b').token,
        "/mcp",
        None,
        &initialize(),
    );
    let session = r.header("mcp-session-id").unwrap().to_owned();
    let stray = json!({"jsonrpc": "2.0", "id": "plugd-00000000-1", "result": {}});
    let answer = |cl: &Cluster| {
        mcp_post(
            cl.node('b'),
            &cl.node('b').token,
            "/mcp",
            Some(&session),
            &stray,
        )
    };
    assert_eq!(answer(&cl).status, 202);

    // NATS frozen for 10 s (SIGSTOP: connections open, nothing answers).
    // Every request is answered in bounded time: what PostgreSQL carries
    // goes on, a publish never waits, a hand-off is 503 (NATS did not even
    // bring the offer back to its own node).
    cl.nats.freeze();
    let frozen = std::time::Instant::now();
    let r = answer(&cl);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "nodes_unavailable");
    assert_eq!(r.header("retry-after"), Some("1"));
    while frozen.elapsed() < Duration::from_secs(10) {
        for n in ['a', 'b', 'c'] {
            let asked = std::time::Instant::now();
            let r = cl.node(n).get("/v1/tools");
            assert_eq!(r.status, 200, "node {n}: {}", r.text());
            publish(&cl, n);
            assert!(
                asked.elapsed() < Duration::from_secs(3),
                "node {n} took {:?} while NATS was frozen",
                asked.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    // Then NATS is killed (SIGKILL), and stays away.
    cl.nats.kill();
    // Deliveries go on through PostgreSQL, on every node.
    let ids = enqueue(&cl.url, 0, 90);
    let applied = eventually_blocking(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&ledger).unwrap();
        ids.iter().all(|id| text.contains(id.as_str()))
    });
    assert!(applied, "deliveries stopped with NATS\n{}", cl.logs());
    let dropped = metric(cl.node('a'), DROPPED);
    let counted = eventually_blocking(Duration::from_secs(5), || {
        publish(&cl, 'a');
        metric(cl.node('a'), DROPPED) > dropped
    });
    assert!(
        counted,
        "A counts the events the others miss\n{}",
        cl.logs()
    );
    let refused = eventually_blocking(Duration::from_secs(5), || {
        let r = answer(&cl);
        r.status == 503
            && r.header("retry-after") == Some("1")
            && r.json()["error"]["code"] == "nodes_unavailable"
    });
    assert!(
        refused,
        "a hand-off while NATS is away is 503 nodes_unavailable"
    );
    // What PostgreSQL carries goes on: a new token works on every node.
    let token = cl.token("viewer", "while-nats-is-away");
    for n in ['a', 'b', 'c'] {
        let r = request_as(cl.node(n), &token, "GET", "/v1/tools", &[], None);
        assert_eq!(r.status, 200, "node {n}: {}", r.text());
        assert_eq!(
            request_as(cl.node(n), "", "GET", "/readyz", &[], None).status,
            200
        );
    }

    // NATS returns: within 2 s events cross again and hand-offs work.
    cl.nats.restart();
    let back = std::time::Instant::now();
    let resumed = eventually_blocking(Duration::from_secs(2), || {
        let before = metric(cl.node('c'), RECEIVED);
        publish(&cl, 'a');
        std::thread::sleep(Duration::from_millis(100));
        metric(cl.node('c'), RECEIVED) > before && answer(&cl).status == 202
    });
    assert!(
        resumed,
        "not resumed {:?} after NATS returned\n{}",
        back.elapsed(),
        cl.logs()
    );
}

#[test]
fn racing_approvals_and_a_revoked_token_under_flood_agree_on_every_node() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // Every node has the plugin's directory: any node may approve it.
    let cl = Cluster::start(|_, dir| copy_example(dir, "hello-bash"));

    // 100 approve/revoke pairs, each pair racing on two nodes, four pairs
    // at a time.
    let approvals = std::sync::atomic::AtomicUsize::new(0);
    let withdrawals = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for lane in 0..4usize {
            let (cl, approvals, withdrawals) = (&cl, &approvals, &withdrawals);
            s.spawn(move || {
                for round in 0..25usize {
                    let i = lane * 25 + round;
                    let (x, y) = (i % 3, (i + 1 + lane % 2) % 3);
                    std::thread::scope(|s| {
                        s.spawn(|| {
                            let r = cl.nodes[x].post("/v1/plugins/hello_bash:approve", &json!({}));
                            if r.status == 200 {
                                approvals.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                        });
                        s.spawn(|| {
                            let r = cl.nodes[y].post("/v1/plugins/hello_bash:revoke", &json!({}));
                            if r.status == 200 && r.json()["was_approved"] == true {
                                withdrawals.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            }
                        });
                    });
                }
            });
        }
    });
    let (approvals, withdrawals) = (approvals.into_inner(), withdrawals.into_inner());
    assert!(
        approvals >= 10 && withdrawals >= 10,
        "{approvals} approvals, {withdrawals} withdrawals"
    );
    let approved = crate::support::block_on(async {
        let key = plugd_store::secrets::MasterKey::from_hex(TEST_MASTER_KEY, "test").unwrap();
        let store = plugd_store_pg::PgStore::open_node(
            &cl.url,
            &plugd_store_pg::PgOptions::default(),
            key.id(),
        )
        .await
        .unwrap();
        store.approval("hello_bash").await.unwrap().is_some()
    });
    let agree = eventually_blocking(Duration::from_secs(2), || {
        ['a', 'b', 'c']
            .iter()
            .all(|n| cl.tools(*n).contains(&TOOL.to_owned()) == approved)
    });
    let views: Vec<_> = ['a', 'b', 'c'].iter().map(|n| cl.tools(*n)).collect();
    assert!(
        agree,
        "the database says approved={approved}, the nodes list {views:?}\n{}",
        cl.logs()
    );

    // A token revoked while all three nodes are flooded with its requests:
    // not one request sent after the revoke returned succeeds.
    let token = cl.token("viewer", "flooded");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let revoked_at = std::sync::OnceLock::<std::time::Instant>::new();
    let late_successes = std::sync::atomic::AtomicUsize::new(0);
    let early_successes = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for n in 0..3usize {
            for _ in 0..2 {
                let (cl, token, stop, revoked_at, late, early) = (
                    &cl,
                    &token,
                    &stop,
                    &revoked_at,
                    &late_successes,
                    &early_successes,
                );
                s.spawn(move || {
                    use std::sync::atomic::Ordering;
                    while !stop.load(Ordering::SeqCst) {
                        let sent = std::time::Instant::now();
                        let r = request_as(&cl.nodes[n], token, "GET", "/v1/tools", &[], None);
                        if r.status == 200 {
                            match revoked_at.get() {
                                Some(at) if sent > *at => late.fetch_add(1, Ordering::SeqCst),
                                _ => early.fetch_add(1, Ordering::SeqCst),
                            };
                        }
                    }
                });
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let out = cl
            .plugd(cl.dirs[1].path())
            .args(["token", "revoke", "flooded"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        revoked_at.set(std::time::Instant::now()).unwrap();
        std::thread::sleep(Duration::from_millis(1_000));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    use std::sync::atomic::Ordering;
    assert!(
        early_successes.load(Ordering::SeqCst) > 0,
        "the flood reached the nodes"
    );
    assert_eq!(
        late_successes.load(Ordering::SeqCst),
        0,
        "requests after the revoke succeeded"
    );
}

#[test]
fn only_the_clusters_nats_user_can_publish_on_plugds_subjects() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // The operator's NATS: plugd's user gets plugd's subjects, JetStream's
    // (the pins) and its inboxes; another user gets everything else.
    let nats = TestNats::start_with(
        r#"
authorization {
  users = [
    { user: plugd, password: "n4ts-s3cret",
      permissions: { publish: ["plugd.>", "$JS.>", "$O.>", "_INBOX.>"],
                     subscribe: ["plugd.>", "$JS.>", "$O.>", "_INBOX.>"] } }
    { user: other, password: "other",
      permissions: { publish: { deny: ["plugd.>", "$JS.>", "$O.>"] },
                     subscribe: { deny: ["plugd.>", "$JS.>", "$O.>"] } } }
  ]
}
"#,
    );
    let port = nats.url().rsplit(':').next().unwrap().to_owned();
    let with = |user: &str, pass: &str| format!("nats://{user}:{pass}@127.0.0.1:{port}");
    let plugd_url = with("plugd", "n4ts-s3cret");
    let cl = Cluster::start_on(
        nats,
        &plugd_url,
        TestPg::shared().fresh_database(),
        |n, dir| {
            if n == 'a' {
                copy_example(dir, "hello-bash");
            }
        },
        &|_| Vec::new(),
        |_, url| url.to_owned(),
    );
    // The nodes work with those permissions: approval pins travel.
    let r = cl
        .node('a')
        .post("/v1/plugins/hello_bash:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let listed = eventually_blocking(Duration::from_secs(2), || {
        cl.tools('c').contains(&TOOL.to_owned())
    });
    assert!(listed, "{}", cl.logs());
    let admin = cl.node('a').token.clone();
    assert_eq!(cl.invoke('c', &admin).status, 200, "{}", cl.logs());

    const RECEIVED: &str = "plugd_cluster_bus_received_total";
    const REFUSED: &str = "plugd_cluster_bus_refused_total";
    let before = (
        metric(cl.node('b'), RECEIVED),
        metric(cl.node('b'), REFUSED),
    );
    let event =
        serde_json::to_vec(&json!({"topic": "plugin.inbound.slack", "source": "x", "payload": {}}))
            .unwrap();
    crate::support::block_on(async {
        // No credentials: the server refuses the connection.
        let anon = async_nats::ConnectOptions::new()
            .max_reconnects(Some(1))
            .connect(format!("nats://127.0.0.1:{port}"));
        let anon = tokio::time::timeout(Duration::from_secs(3), anon).await;
        assert!(!matches!(anon, Ok(Ok(_))), "an anonymous client connected");
        // Another user: its publishes on plugd's subjects are refused.
        let other =
            async_nats::ConnectOptions::with_user_and_password("other".into(), "other".into())
                .connect(format!("nats://127.0.0.1:{port}"))
                .await
                .unwrap();
        for _ in 0..5 {
            let _ = other
                .publish("plugd.bus.plugin.inbound.slack", event.clone().into())
                .await;
        }
        let _ = other.flush().await;
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        (
            metric(cl.node('b'), RECEIVED),
            metric(cl.node('b'), REFUSED)
        ),
        before,
        "another user's message reached a node"
    );
    // The password reaches no log line.
    assert!(!cl.logs().contains("n4ts-s3cret"), "{}", cl.logs());
}

/// Debian's libfaketime: a node started with it sees another wall clock.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

#[test]
fn postgres_restarted_under_three_nodes_gives_503_then_every_node_writes_again() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    let cl = Cluster::start_own_pg(|_, _| {});
    let pg = cl.pg.as_ref().unwrap();
    // Writes (org secrets, one name each) to the three nodes in turn while
    // the database restarts (fast), then stops at once and starts again.
    let (seen, back) = crate::state_pg::writes_across_restarts(pg, |i| {
        let n = (b'a' + (i % 3) as u8) as char;
        let name = format!("w{i}");
        let node = cl.node(n);
        let r = request_as(
            node,
            &node.token,
            "PUT",
            &format!("/v1/secrets/acme/{name}"),
            &[("Content-Type", "application/json")],
            Some(br#"{"value": "s3cret"}"#),
        );
        (n, name, r.status, r.text())
    });
    let seen: Vec<_> = seen
        .into_iter()
        .map(|((n, name, status, body), at)| (n, name, status, body, at))
        .collect();
    let down: Vec<_> = seen.iter().filter(|s| s.2 >= 500).collect();
    assert!(!down.is_empty(), "no request saw the database down");
    for (n, name, status, body, _) in &down {
        assert_eq!(*status, 503, "node {n}, {name}: {body}");
        assert!(
            body.contains("store_unavailable"),
            "node {n}, {name}: {body}"
        );
    }
    // Every node writes again within 5 s of the database's return.
    for n in ['a', 'b', 'c'] {
        let first = seen
            .iter()
            .find(|s| s.0 == n && (200..300).contains(&s.2) && s.4 > back)
            .map(|s| s.4.duration_since(back));
        assert!(
            first.is_some_and(|d| d <= Duration::from_secs(5)),
            "node {n} wrote nothing within 5 s of the database's return: {first:?}\n{}",
            cl.logs()
        );
    }
    // Every 2xx write is in the database, as every node reads it.
    for n in ['a', 'b', 'c'] {
        let node = cl.node(n);
        let list = request_as(node, &node.token, "GET", "/v1/secrets/acme", &[], None);
        assert_eq!(list.status, 200, "{}", list.text());
        let names = list.json()["names"].clone();
        for (_, name, status, _, _) in &seen {
            if (200..300).contains(status) {
                assert!(
                    names.as_array().unwrap().iter().any(|v| v == name.as_str()),
                    "{name} was answered {status} but node {n} does not list it"
                );
            }
        }
    }
    // And the three are one cluster again.
    let listed = eventually_blocking(Duration::from_secs(5), || {
        cl.node('a').get("/v1/cluster").json()["nodes"]
            .as_array()
            .is_some_and(|ns| ns.len() == 3)
    });
    assert!(listed, "{}", cl.logs());
}

/// The nodes holding lease `name`, as node `from` lists the live nodes.
fn holders(cl: &Cluster, from: char, name: &str) -> Vec<char> {
    let view = cl.node(from).get("/v1/cluster").json();
    view["nodes"]
        .as_array()
        .map(|ns| {
            ns.iter()
                .filter(|n| {
                    n["leases"]
                        .as_array()
                        .is_some_and(|ls| ls.iter().any(|l| l == name))
                })
                .filter_map(|n| n["node_id"].as_str()?.chars().next())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_channel_runs_on_one_node_and_a_frozen_holder_is_replaced_and_stays_out() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    const LEASE: &str = "channel:loop";
    let ttl = plugd_agent::channels::CHANNEL_LEASE_TTL;
    // The channel plugin (`loop`: it echoes outbound messages inbound) in
    // every node's workspace, approved once for all.
    let mut cl = Cluster::start(|_, dir: &Path| {
        std::fs::write(dir.join("plugd.yaml"), "# a channel\n").unwrap();
        let plugin = dir.join(".plugins/chan");
        crate::broker::services_plugin_in(&plugin, "chan", &["broker"]);
        let manifest = plugin.join("nexo-plugin.toml");
        let text = std::fs::read_to_string(&manifest).unwrap().replace(
            "[plugin.extends]\n",
            "[plugin.extends]\nchannels = [\"loop\"]\n",
        );
        std::fs::write(&manifest, text).unwrap();
    });
    let r = cl.node('a').post("/v1/plugins/chan:approve", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let one = eventually_blocking(Duration::from_secs(15), || {
        holders(&cl, 'a', LEASE).len() == 1
    });
    assert!(one, "one node holds {LEASE}\n{}", cl.logs());
    let h = holders(&cl, 'a', LEASE)[0];
    let others: Vec<char> = "abc".chars().filter(|n| *n != h).collect();
    let inbound = |n: char| metric(cl.node(n), "plugd_channel_inbound_total{kind=\"loop\"}");
    let publish = |n: char, subject: &str, text: &str| {
        let r = cl.node(n).post(
            "/v1/bus/publish",
            &json!({"subject": subject, "payload": {"text": text, "from": "u1"}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    };
    // An inbound message published on another node reaches every node's
    // bus; only the holder takes it.
    publish(others[0], "plugin.inbound.loop", "hello");
    let taken = eventually_blocking(Duration::from_secs(5), || inbound(h) == 1);
    assert!(taken, "the holder took the message\n{}", cl.logs());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((inbound(others[0]), inbound(others[1])), (0, 0));

    // Freeze the holder past its lease: another node takes over within the
    // time to live and a second.
    let frozen = Stopped::stop(cl.nodes[(h as u8 - b'a') as usize].child.id());
    let stopped = std::time::Instant::now();
    let mut next = None;
    while stopped.elapsed() < ttl + Duration::from_secs(4) {
        if let Some(n) = holders(&cl, others[0], LEASE).into_iter().find(|n| *n != h) {
            next = Some(n);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = stopped.elapsed();
    let Some(next) = next else {
        drop(frozen);
        panic!("no node took {LEASE} over\n{}", cl.logs());
    };
    assert!(
        took <= ttl + Duration::from_secs(1),
        "taken over after {took:?}, over the lease's {ttl:?} and a second"
    );
    // The new holder runs the channel: its adapter echoes an outbound message.
    let before = inbound(next);
    let echoed = eventually_blocking(Duration::from_secs(20), || {
        publish(next, "plugin.outbound.loop", "ping");
        std::thread::sleep(Duration::from_millis(300));
        inbound(next) > before
    });
    assert!(echoed, "the new holder's channel echoed\n{}", cl.logs());
    // A message published while the old holder is frozen reaches it when it
    // wakes (NATS kept it), and it no longer takes it.
    let third = *others.iter().find(|n| **n != next).unwrap();
    let taken_next = inbound(next);
    publish(third, "plugin.inbound.loop", "while frozen");
    let moved = eventually_blocking(Duration::from_secs(5), || inbound(next) > taken_next);
    assert!(moved, "{}", cl.logs());
    drop(frozen);
    let stepped_down = eventually_blocking(Duration::from_secs(10), || {
        cl.node(h)
            .log_text()
            .contains("lost the channel's lease to another node")
    });
    assert!(stepped_down, "{}", cl.logs());
    // It never holds the lease again while the new holder lives, and took
    // nothing since it woke.
    for _ in 0..10 {
        assert_eq!(holders(&cl, h, LEASE), vec![next], "{}", cl.logs());
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(inbound(h), 1, "the woken node took a message");
    cl.nodes.clear();
}

#[test]
fn compaction_jobs_started_on_any_node_run_once_on_some_node() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    const SESSIONS: usize = 9;
    let yaml = "agent:\n  compactor:\n    export: acme/threads/sliding_window\n    max_input_tokens: 200\n";
    let cl = Cluster::start(|_, dir: &Path| std::fs::write(dir.join("plugd.yaml"), yaml).unwrap());
    // The compactor is an installed package (installed through A's
    // workspace): A shares its files with the cluster, then they leave A's
    // disk, so every node runs it from the copy it takes from the cluster.
    let src = repo().join("examples/workspace/.plugins/acme-threads");
    let out = cl
        .plugd(cl.dirs[0].path())
        .args(["package", "install", src.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "install: {}", stderr(&out));
    let shared = eventually_blocking(Duration::from_secs(10), || {
        cl.node('a')
            .log_text()
            .contains("shared the package's files with the cluster")
    });
    assert!(shared, "{}", cl.logs());
    let listed = cl
        .plugd(cl.dirs[0].path())
        .args(["package", "list", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let installed = std::path::PathBuf::from(listed[0]["path"].as_str().unwrap());
    std::fs::rename(&installed, installed.with_extension("gone")).unwrap();
    let node = |i: usize| cl.node((b'a' + (i % 3) as u8) as char);

    // Sessions with something to compact, each made on some node.
    let mut jobs = Vec::new();
    for i in 0..SESSIONS {
        let session = format!("cs-{i}");
        let r = node(i).post(
            "/v1/runs",
            &json!({"session_id": session, "input": "by hand"}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        let chain = r.json()["chain_id"].as_str().unwrap().to_owned();
        let blocks: Vec<Value> = (0..12)
            .map(|n| json!({"kind": "input", "content": format!("message {n}: the quick brown fox jumps over the lazy dog, again and again")}))
            .collect();
        let r = node(i + 1).post(
            &format!("/v1/chains/{chain}/blocks"),
            &json!({"blocks": blocks}),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        // Asked on a third node: answered at once with the job.
        let r = node(i + 2).post(
            "/v1/compactions",
            &json!({"session_id": session, "async": true}),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        let job = r.json();
        assert_eq!(job["status"], "pending");
        let id = job["job_id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("del_"), "{job}");
        assert_eq!(
            r.header("location"),
            Some(format!("/v1/compactions/jobs/{id}").as_str())
        );
        jobs.push((session, id));
    }
    // Each job succeeds, seen from any node, and compacted its session once.
    for (i, (session, id)) in jobs.iter().enumerate() {
        let path = format!("/v1/compactions/jobs/{id}");
        let done = eventually_blocking(Duration::from_secs(30), || {
            node(i).get(&path).json()["status"] == "succeeded"
        });
        let job = node(i).get(&path).json();
        assert!(done, "job {id}: {job}\n{}", cl.logs());
        assert_eq!(job["session_id"], session.as_str());
        let list = node(i + 1)
            .get(&format!("/v1/sessions/{session}/compactions"))
            .json();
        let list = list["compactions"].as_array().unwrap().clone();
        assert_eq!(list.len(), 1, "{session}: {list:?}");
        assert_eq!(list[0]["status"], "succeeded");
        assert_eq!(job["compaction"]["id"], list[0]["id"]);
        let head = node(i + 2).get(&format!("/v1/sessions/{session}")).json();
        assert_eq!(head["head_chain_id"], list[0]["derived_chain_id"]);
    }
    // The jobs ran on more than one node: the worker of any node takes them.
    let logs: Vec<String> = cl.nodes.iter().map(|n| n.log_text()).collect();
    let ran: Vec<usize> = logs
        .iter()
        .map(|log| {
            jobs.iter()
                .filter(|(_, id)| {
                    log.lines()
                        .any(|l| l.contains("compaction job done") && l.contains(id.as_str()))
                })
                .count()
        })
        .collect();
    assert_eq!(
        ran.iter().sum::<usize>(),
        SESSIONS,
        "each job ran once: {ran:?}"
    );
    assert!(
        ran.iter().filter(|n| **n > 0).count() >= 2,
        "the jobs ran on one node only: {ran:?}"
    );
    // Each node that ran one took the package's files from the cluster.
    for (log, n) in logs.iter().zip(&ran) {
        assert!(
            *n == 0 || log.contains("took the package's files from the cluster"),
            "{log}"
        );
    }
    // What is not a compaction job is no job.
    assert_eq!(
        cl.node('b')
            .get("/v1/compactions/jobs/del_0000000000000000")
            .status,
        404
    );
}

/// Writes the outbox test package (`test/outbox`, one hook `recorder` on
/// `run.completed` that appends to `ledger`, waits 20 ms and acks) into
/// `dir`.
fn outbox_package(dir: &Path, ledger: &Path) {
    let p = dir.join(".plugins/outbox");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/outbox/outbox_plugin.py"),
        p.join("plugin.py"),
    )
    .unwrap();
    // Each delivery waits 20 ms: how the nodes share them then depends on
    // their delivery slots, not on which process the loaded machine runs.
    let entry = json!([
        "python3",
        "plugin.py",
        "ack_after_20ms",
        ledger.display().to_string()
    ]);
    std::fs::write(
        p.join("vai-plugin.toml"),
        format!(
            "api_version = \"vai.plugin.v1\"\npackage_id = \"test/outbox\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = {entry}\n\n[[exports]]\nid = \"recorder\"\nkind = \"hook\"\n[exports.hook]\nsubscribes_to = [\"run.completed\"]\n"
        ),
    )
    .unwrap();
}

/// The node whose outbox workers hold the most leases now in the cluster
/// at `url` (a worker is named `NODE/outbox-…`).
fn busiest(url: &str) -> char {
    crate::support::block_on(async {
        let key = plugd_store::secrets::MasterKey::from_hex(TEST_MASTER_KEY, "test").unwrap();
        let store = plugd_store_pg::PgStore::open_node(
            url,
            &plugd_store_pg::PgOptions::default(),
            key.id(),
        )
        .await
        .unwrap();
        let pending = store
            .outbox_list(Some(plugd_control::store::outbox::DeliveryStatus::Pending))
            .await
            .unwrap();
        let mut held = std::collections::BTreeMap::new();
        for d in pending {
            if let Some(node) = d.leased_by.as_deref().and_then(|w| w.split('/').next()) {
                *held.entry(node.to_owned()).or_insert(0usize) += 1;
            }
        }
        held.into_iter()
            .max_by_key(|(_, n)| *n)
            .and_then(|(node, _)| node.chars().next())
            .unwrap_or('a')
    })
}

/// `run.completed` events `from..to` written straight into the outbox of
/// the cluster at `url`, one delivery each to `test/outbox`'s `recorder`;
/// the delivery ids.
fn enqueue(url: &str, from: usize, to: usize) -> Vec<String> {
    crate::support::block_on(async {
        use plugd_control::store::outbox::{NewEvent, Subscriber};
        let key = plugd_store::secrets::MasterKey::from_hex(TEST_MASTER_KEY, "test").unwrap();
        let store = plugd_store_pg::PgStore::open_node(
            url,
            &plugd_store_pg::PgOptions::default(),
            key.id(),
        )
        .await
        .unwrap();
        let subs = [Subscriber {
            plugin_id: "test/outbox".into(),
            export_id: "recorder".into(),
        }];
        let mut ids = Vec::new();
        for i in from..to {
            let q = store
                .outbox_enqueue(
                    &NewEvent {
                        event_type: "run.completed".into(),
                        subject: json!({"kind": "run", "id": format!("run_{i}")}),
                        summary: json!({"n": i}),
                    },
                    &subs,
                )
                .await
                .unwrap();
            ids.extend(q.deliveries.into_iter().map(|d| d.to_string()));
        }
        ids
    })
}

#[test]
fn nodes_whose_clocks_are_two_minutes_off_agree_on_time() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's faketime package (scripts/test does)"
    );
    let ledger_dir = tempfile::tempdir().unwrap();
    let ledger = ledger_dir.path().join("ledger.jsonl");
    std::fs::write(&ledger, "").unwrap();
    let nats = TestNats::start();
    let nats_url = nats.url();
    // B's clock is 2 minutes ahead, C's 2 minutes behind (wall clock only:
    // timers run on the monotonic clock, as on a real machine).
    let env = |n: char| {
        // Leases of 10 s: a node judging them by its own clock (two
        // minutes off) would still take them at once or never, and a
        // delivery slowed by a loaded machine does not outlive its lease.
        let mut e: Vec<(String, String)> = vec![
            ("PLUGD_OUTBOX_LEASE_MS".into(), "10000".into()),
            ("PLUGD_OUTBOX_POLL_MS".into(), "100".into()),
        ];
        let off = match n {
            'b' => "+120s",
            'c' => "-120s",
            _ => return e,
        };
        e.push(("LD_PRELOAD".into(), LIBFAKETIME.into()));
        e.push(("FAKETIME".into(), off.into()));
        e.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
        e
    };
    let cl = Cluster::start_on(
        nats,
        &nats_url,
        TestPg::shared().fresh_database(),
        |n, dir| {
            std::fs::write(
                dir.join("plugd.yaml"),
                "risk:\n  tools:\n    hello_python_add: high\nsandbox:\n  plugins:\n    \"test/outbox\": {enabled: false}\n",
            )
            .unwrap();
            if n == 'a' {
                copy_example(dir, "hello-python");
                outbox_package(dir, &ledger);
            }
        },
        &env,
        |_, url| url.to_owned(),
    );
    let admin = cl.node('a').token.clone();
    // The skew is real: each node's log lines carry its own clock.
    let first_time = |n: char| -> i64 {
        let log = cl.node(n).log_text();
        // The first `YYYY-MM-DDTHH:MM:SS` in the log.
        let shape = b"dddd-dd-ddTdd:dd:dd";
        let t = log
            .as_bytes()
            .windows(shape.len())
            .find(|w| {
                w.iter().zip(shape).all(|(c, s)| {
                    if *s == b'd' {
                        c.is_ascii_digit()
                    } else {
                        c == s
                    }
                })
            })
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .unwrap_or_else(|| panic!("no time in node {n}'s log:\n{log}"));
        let num = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
        num(8..10) * 86_400 + num(11..13) * 3_600 + num(14..16) * 60 + num(17..19)
    };
    let (a, b, c) = (first_time('a'), first_time('b'), first_time('c'));
    assert!(
        (b - a - 120).abs() <= 15,
        "B is not 2 minutes ahead: {a} {b}"
    );
    assert!(
        (a - c - 120).abs() <= 15,
        "C is not 2 minutes behind: {a} {c}"
    );
    // Each node is live for the others: rows stamped by the database.
    let view = cl.node('a').get("/v1/cluster").json();
    assert_eq!(view["nodes"].as_array().unwrap().len(), 3, "{view}");

    for id in ["hello_python", "test%2Foutbox"] {
        let r = cl
            .node('a')
            .post(&format!("/v1/plugins/{id}:approve"), &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let listed = eventually_blocking(Duration::from_secs(2), || {
        ['b', 'c']
            .iter()
            .all(|n| cl.tools(*n).contains(&"hello_python_greet".to_owned()))
    });
    assert!(listed, "{}", cl.logs());
    // Hand-offs between nodes 4 minutes apart: asked on C, answered on B.
    elicit_across(&cl, 'c', 'b', &admin);

    // Deliveries with 10 s leases: a node that judged leases by its own
    // clock would take the others' at once (duplicates) or never; none.
    const EVENTS: usize = 300;
    enqueue(&cl.url, 0, EVENTS);
    let lines = || -> Vec<Value> {
        std::fs::read_to_string(&ledger)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let ids = |v: &[Value]| -> std::collections::BTreeSet<String> {
        v.iter()
            .map(|l| l["delivery_id"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    let drained = eventually_blocking(Duration::from_secs(60), || ids(&lines()).len() >= EVENTS);
    let all = lines();
    assert!(
        drained,
        "{} of {EVENTS} delivered\n{}",
        ids(&all).len(),
        cl.logs()
    );
    assert_eq!(all.len(), EVENTS, "no delivery applied twice");
    // Every attempt was a first one: nothing was re-leased early.
    assert!(
        all.iter().all(|l| l["attempt"] == 1),
        "a delivery was attempted again"
    );
}

#[test]
fn a_console_login_holds_on_every_node_and_a_logout_anywhere_ends_it() {
    if sqlite_only("the cluster harness makes its own database; it runs once") {
        return;
    }
    // The nodes accept the balancer's name as their Host (plugd.yaml).
    let cl = Cluster::start(|_, dir| {
        std::fs::write(
            dir.join("plugd.yaml"),
            "http:\n  allowed_hosts: [\"plugd.test\"]\n",
        )
        .unwrap();
    });
    let operator = cl.token("operator", "console-user");
    // The browser sees one address, the load balancer's (`plugd.test`, on
    // port 80), and sends that `Host` to whichever node it reaches.
    let front = "plugd.test";
    let browser =
        |n: char, method: &str, path: &str, headers: &[(&str, &str)], body: Option<Value>| {
            let text = body.map(|b| b.to_string());
            let mut all = headers.to_vec();
            all.push(("Host", front));
            if text.is_some() {
                all.push(("Content-Type", "application/json"));
            }
            request_as(
                cl.node(n),
                "",
                method,
                path,
                &all,
                text.as_deref().map(str::as_bytes),
            )
        };
    let r = browser(
        'a',
        "POST",
        "/console/login",
        &[],
        Some(json!({"token": operator})),
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let csrf = browser('a', "GET", "/console/session", &[("Cookie", &cookie)], None).json()["csrf"]
        .as_str()
        .unwrap()
        .to_owned();
    for n in ['b', 'c'] {
        let s = browser(n, "GET", "/console/session", &[("Cookie", &cookie)], None);
        assert_eq!(s.status, 200, "node {n}: {}", s.text());
        assert_eq!(s.json()["csrf"], csrf.as_str(), "node {n}");
        assert_eq!(
            browser(n, "GET", "/v1/plugins", &[("Cookie", &cookie)], None).status,
            200,
            "node {n}"
        );
    }
    let out = browser(
        'c',
        "POST",
        "/console/logout",
        &[("Cookie", &cookie), ("X-Plugd-CSRF", &csrf)],
        Some(json!({})),
    );
    assert_eq!(out.status, 204, "{}", out.text());
    for n in ['a', 'b', 'c'] {
        browser(n, "GET", "/v1/plugins", &[("Cookie", &cookie)], None)
            .error(401, "unauthenticated");
    }
}
