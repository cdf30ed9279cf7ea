//! Upgrading from the previous release: today's plugd on a copy of the
//! workspace an earlier plugd left behind (`tests/fixtures/upgrade`, made by
//! its `make.sh` with the binary of the commit in its `VERSION`), so every
//! migration since is run on real data, not on an empty database.

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::{Value, json};

use crate::http::{Serve, request_as};
use crate::support::{Ws, plugd_cmd, repo, stderr, stdout};

/// The fixture copied into a fresh workspace, with its key file beside it.
struct Upgraded {
    ws: Ws,
    keys: tempfile::TempDir,
    tokens: Value,
}

impl Upgraded {
    fn new() -> Upgraded {
        let fixture = repo().join("tests/fixtures/upgrade/made");
        let ws = Ws::new();
        copy_tree(&fixture.join("workspace"), ws.dir());
        let keys = tempfile::tempdir().unwrap();
        std::fs::copy(fixture.join("master.key"), keys.path().join("master.key")).unwrap();
        // Git keeps only the executable bit: the modes plugd made come back here.
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&keys.path().join("master.key"), 0o600);
        mode(&ws.dir().join(".plugd"), 0o700);
        mode(&ws.dir().join(".plugd/state.db"), 0o600);
        let tokens: Value =
            serde_json::from_slice(&std::fs::read(fixture.join("tokens.json")).unwrap()).unwrap();
        Upgraded { ws, keys, tokens }
    }

    fn env(&self) -> [(&'static str, String); 2] {
        [
            ("HOME", self.keys.path().join("home").display().to_string()),
            (
                "PLUGD_KEY_FILE",
                self.keys.path().join("master.key").display().to_string(),
            ),
        ]
    }

    fn plugd(&self, args: &[&str]) -> Output {
        plugd_cmd(self.ws.dir())
            .args(args)
            .envs(self.env())
            .env_remove("PLUGD_MASTER_KEY")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    #[track_caller]
    fn ok(&self, args: &[&str]) -> String {
        let o = self.plugd(args);
        assert!(
            o.status.success(),
            "plugd {args:?} failed on the upgraded workspace: {}\n{}",
            stderr(&o),
            stdout(&o)
        );
        stdout(&o)
    }
}

/// Copies `from` into `to`: files, directories with their modes, links as links.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ty = entry.file_type().unwrap();
        if ty.is_symlink() {
            // The pins' by-plugin links, relative: copied as links.
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if ty.is_dir() {
            copy_tree(&src, &dst);
            let mode = std::fs::metadata(&src).unwrap().permissions();
            std::fs::set_permissions(&dst, mode).unwrap();
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

#[test]
fn the_previous_release_workspace_keeps_its_approvals_settings_and_tools() {
    if crate::support::sqlite_only("the previous release's SQLite state file is upgraded") {
        return;
    }
    let up = Upgraded::new();
    let version = std::fs::read_to_string(repo().join("tests/fixtures/upgrade/VERSION")).unwrap();
    assert!(version.contains("schema 11"), "{version}");

    // Approvals survive: both plugins approved, unchanged, and they run.
    let list: Value = serde_json::from_str(&up.ok(&["plugin", "list", "--json"])).unwrap();
    for id in ["hello_bash", "keyed"] {
        let row = list
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap_or_else(|| panic!("{id} missing: {list}"));
        assert_eq!(row["approved"], true, "{row}");
    }
    let out = up.ok(&[
        "tool",
        "call",
        "hello_bash_greet",
        "--args",
        r#"{"name": "upgrade"}"#,
    ]);
    assert!(out.contains("upgrade"), "{out}");

    // The secret sealed by the old release opens with the same key: the
    // plugin gets it (it answers its SHA-256, never the value).
    let key = up.tokens["api_key"].as_str().unwrap();
    let digest = sha256_hex(key.as_bytes());
    let out = up.ok(&["tool", "call", "keyed/key_digest", "--args", "{}"]);
    assert!(out.contains(&digest), "{out}");

    // The tool disabled then is still disabled; the one enabled again is not.
    let o = up.plugd(&["tool", "call", "keyed/unused", "--args", "{}"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("disabled"), "{}", stderr(&o));
}

#[test]
fn the_previous_release_tokens_work_as_workspace_tokens_and_reach_the_new_routes() {
    if crate::support::sqlite_only("the previous release's SQLite state file is upgraded") {
        return;
    }
    let up = Upgraded::new();
    let list: Value = serde_json::from_str(&up.ok(&["token", "list", "--json"])).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"fixture-operator"), "{list}");
    assert!(names.contains(&"fixture-agent"), "{list}");
    for t in list.as_array().unwrap() {
        if t["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("fixture-"))
        {
            // Made before tokens had an org: workspace tokens, no org.
            assert!(t["org_id"].is_null(), "{t}");
            let profiles = if t["name"] == "fixture-agent" {
                json!(["readers"])
            } else {
                Value::Null
            };
            assert_eq!(t["mcp_profiles"], profiles, "{t}");
        }
    }

    let env = up.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let serve = Serve::start_with_env(&up.ws, &env);
    let operator = up.tokens["operator"].as_str().unwrap();
    let agent = up.tokens["agent"].as_str().unwrap();

    // The old operator token reads the routes that came after it.
    for path in [
        "/v1/plugins",
        "/v1/plugin-packages",
        "/v1/plugin-bindings",
        "/v1/invocations",
    ] {
        let r = request_as(&serve, operator, "GET", path, &[], None);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    // The agent token keeps its MCP profile limit: it reads, but calls only
    // through /mcp/readers.
    let body = json!({"args": {"name": "after-upgrade"}}).to_string();
    let r = request_as(&serve, agent, "GET", "/v1/tools", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request_as(
        &serve,
        agent,
        "POST",
        "/v1/tools/hello_bash_greet:invoke",
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("readers"), "{}", r.text());

    // A call through serve is recorded with the new invocation records.
    let r = request_as(
        &serve,
        &serve.token,
        "POST",
        "/v1/tools/hello_bash_greet:invoke",
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut found = false;
    for _ in 0..100 {
        let r = request_as(
            &serve,
            operator,
            "GET",
            "/v1/invocations?tool=hello_bash_greet",
            &[],
            None,
        );
        if r.json()["invocations"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            found = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(found, "no invocation record for the call after the upgrade");
    serve.stop();
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}
