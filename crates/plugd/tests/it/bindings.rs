//! Bindings and tenancy over real HTTP: a VAI package with a
//! `config_schema` and a secret slot pushed to a real `docker-registry`,
//! pulled by serve, bound per org with tokens bound to orgs. Every config
//! problem comes back with its JSON Pointer; org A's tokens get 404 for
//! every binding, validate, discovery, secret and package route of org B,
//! and the other way round.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{Value, json};

use crate::http::{Resp, Serve, make_token, request_as};
use crate::packages::{Registry, json_out, push};
use crate::support::{Ws, ok, plugd_cmd, stderr};

const MASTER_KEY: &str = crate::support::TEST_MASTER_KEY;

fn manifest(version: &str) -> String {
    format!(
        r#"api_version = "vai.plugin.v1"
package_id = "acme/devkit"
version = "{version}"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["./bin/plugin"]

[[exports]]
id = "jira_search"
kind = "tool"
display_name = "Jira Search"
execution_class = "isolated"
config_schema = "schemas/jira_search_config.json"

[exports.permissions]
secret_slots = ["jira_token"]

[exports.tool]
effect_class = "read_only"

[[exports]]
id = "slack_notify"
kind = "hook"

[exports.hook]
subscribes_to = ["run.completed"]
"#
    )
}

const CONFIG_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["base_url"],
  "additionalProperties": false,
  "properties": {
    "base_url": {"type": "string", "pattern": "^https://"},
    "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
    "labels": {"type": "array", "items": {"type": "string"}}
  }
}"#;

fn package(parent: &Path, version: &str) -> PathBuf {
    let dir = parent.join(format!("src-{version}"));
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::write(dir.join("vai-plugin.toml"), manifest(version)).unwrap();
    let bin = dir.join("bin/plugin");
    std::fs::write(&bin, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("schemas/jira_search_config.json"), CONFIG_SCHEMA).unwrap();
    dir
}

/// A token bound to `org` (and `projects`).
fn org_token(ws: &Ws, name: &str, role: &str, org: &str, projects: &[&str]) -> String {
    let mut args = vec![
        "token", "create", "--name", name, "--role", role, "--org", org, "--json",
    ];
    for p in projects {
        args.extend(["--project", p]);
    }
    let v = json_out(&ws.plugd(&args));
    assert_eq!(v["org_id"], org, "{v}");
    v["token"].as_str().unwrap().to_owned()
}

/// Serve on loopback with both package versions pulled.
fn setup() -> (Registry, Ws, Serve) {
    let reg = Registry::start();
    let ws = Ws::new();
    for v in ["0.1.0", "0.2.0"] {
        push(
            &ws,
            &package(ws.dir(), v),
            &reg.reference(&format!("acme/devkit:{v}")),
        );
    }
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    for v in ["0.1.0", "0.2.0"] {
        let body = json!({"source": reg.reference(&format!("acme/devkit:{v}"))}).to_string();
        let r = call(
            &serve,
            &serve.token,
            "POST",
            "/v1/plugin-packages",
            Some(&body),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    (reg, ws, serve)
}

fn call(serve: &Serve, token: &str, method: &str, path: &str, body: Option<&str>) -> Resp {
    let headers: &[(&str, &str)] = if body.is_some() {
        &[("Content-Type", "application/json")]
    } else {
        &[]
    };
    request_as(serve, token, method, path, headers, body.map(str::as_bytes))
}

fn put_secret(serve: &Serve, token: &str, org: &str, name: &str, value: &str) -> Resp {
    let body = json!({ "value": value }).to_string();
    call(
        serve,
        token,
        "PUT",
        &format!("/v1/secrets/{org}/{name}"),
        Some(&body),
    )
}

fn new_binding(org: &str, version: &str) -> Value {
    json!({
        "package_id": "acme/devkit",
        "package_version": version,
        "export_id": "jira_search",
        "scope": {"org_id": org},
        "config": {"base_url": "https://acme.atlassian.net", "max_results": 10},
        "secrets": {"jira_token": format!("secret://{org}/jira_token")}
    })
}

/// Asserts `method path` with `body` is refused as `invalid_binding`; the
/// problems' paths, sorted.
fn refused(serve: &Serve, token: &str, method: &str, path: &str, body: &Value) -> Vec<String> {
    let v = call(serve, token, method, path, Some(&body.to_string())).error(422, "invalid_binding");
    paths(&v["error"]["details"]["problems"])
}

fn paths(problems: &Value) -> Vec<String> {
    let mut out: Vec<String> = problems
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["message"].as_str().is_some_and(|m| !m.is_empty()), "{p}");
            p["path"].as_str().unwrap().to_owned()
        })
        .collect();
    out.sort();
    out
}

#[test]
fn bindings_are_created_patched_and_validated_with_each_problem_at_its_path() {
    let (_reg, ws, serve) = setup();
    let op = org_token(&ws, "a-op", "operator", "org_a", &[]);
    let viewer = org_token(&ws, "a-view", "viewer", "org_a", &[]);
    assert_eq!(
        put_secret(&serve, &op, "org_a", "jira_token", "t-a").status,
        204
    );
    put_secret(&serve, &viewer, "org_a", "x", "v").error(403, "forbidden");

    // Created by an org operator, as the seed's record.
    let body = new_binding("org_a", "0.1.0").to_string();
    call(&serve, &viewer, "POST", "/v1/plugin-bindings", Some(&body)).error(403, "forbidden");
    let r = call(&serve, &op, "POST", "/v1/plugin-bindings", Some(&body));
    assert_eq!(r.status, 201, "{}", r.text());
    let b = r.json();
    let id = b["binding_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("bind_"), "{b}");
    assert_eq!(b["status"], "active");
    assert_eq!(b["rollout"], json!({"traffic_percent": 100}));
    assert_eq!(b["scope"], json!({"org_id": "org_a"}));

    // Every config problem at once, each with its path; nothing stored.
    let mut bad = new_binding("org_a", "0.1.0");
    bad["config"] = json!({"max_results": 99, "labels": ["x", 7], "extra": true});
    bad["secrets"] =
        json!({"jira_token": "secret://org_b/jira_token", "nope": "secret://org_a/jira_token"});
    assert_eq!(
        refused(&serve, &op, "POST", "/v1/plugin-bindings", &bad),
        [
            "/config",
            "/config",
            "/config/labels/1",
            "/config/max_results",
            "/secrets/jira_token",
            "/secrets/nope"
        ]
    );
    let mut unset = new_binding("org_a", "0.1.0");
    unset["secrets"] = json!({"jira_token": "secret://org_a/not_set"});
    assert_eq!(
        refused(&serve, &op, "POST", "/v1/plugin-bindings", &unset),
        ["/secrets/jira_token"]
    );
    let mut ghost = new_binding("org_a", "9.9.9");
    call(
        &serve,
        &op,
        "POST",
        "/v1/plugin-bindings",
        Some(&ghost.to_string()),
    )
    .error(404, "unknown_package");
    ghost["package_version"] = json!("0.1.0");
    ghost["export_id"] = json!("nope");
    call(
        &serve,
        &op,
        "POST",
        "/v1/plugin-bindings",
        Some(&ghost.to_string()),
    )
    .error(422, "unknown_export");
    let list = call(&serve, &viewer, "GET", "/v1/plugin-bindings", None).json();
    assert_eq!(list, json!([b]));

    // PATCH: a valid change is stored, an invalid one refused with paths.
    let path = format!("/v1/plugin-bindings/{id}");
    let patch = json!({"rollout": {"traffic_percent": 50}, "package_version": "0.2.0"}).to_string();
    call(&serve, &viewer, "PATCH", &path, Some(&patch)).error(403, "forbidden");
    let r = call(&serve, &op, "PATCH", &path, Some(&patch));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["rollout"]["traffic_percent"], 50);
    let bad_patch = json!({"config": {"base_url": "http://plain"}});
    assert_eq!(
        refused(&serve, &op, "PATCH", &path, &bad_patch),
        ["/config/base_url"]
    );
    call(
        &serve,
        &op,
        "PATCH",
        &path,
        Some(r#"{"scope": {"org_id": "org_b"}}"#),
    )
    .error(422, "invalid_body");
    let stored = call(&serve, &viewer, "GET", &path, None).json();
    assert_eq!(stored["package_version"], "0.2.0");
    assert_eq!(stored["config"]["base_url"], "https://acme.atlassian.net");

    // :validate, as stored and with a patch tried on it (viewers may).
    let validate = format!("{path}:validate");
    let v = call(&serve, &viewer, "POST", &validate, None).json();
    assert_eq!(v, json!({"binding_id": id, "valid": true, "problems": []}));
    let trial = json!({"config": {"max_results": 0, "labels": "x"}}).to_string();
    let v = call(&serve, &viewer, "POST", &validate, Some(&trial)).json();
    assert_eq!(v["valid"], false);
    assert_eq!(
        paths(&v["problems"]),
        ["/config", "/config/labels", "/config/max_results"],
        "{v}"
    );
    let odd = format!("{path}:frobnicate");
    call(&serve, &serve.token, "POST", &odd, None).error(404, "not_found");

    // Discovery: the bound tool export, not the unbound hook.
    let tools = call(&serve, &viewer, "GET", "/v1/plugin-tools", None).json();
    assert_eq!(tools.as_array().unwrap().len(), 1, "{tools}");
    assert_eq!(
        (
            &tools[0]["export_id"],
            &tools[0]["package_version"],
            &tools[0]["binding_ids"]
        ),
        (&json!("jira_search"), &json!("0.2.0"), &json!([id]))
    );
    for kind in ["hooks", "harnesses", "compactors"] {
        let r = call(&serve, &viewer, "GET", &format!("/v1/plugin-{kind}"), None);
        assert_eq!(r.json(), json!([]), "{kind}");
    }

    // The CLI reads and changes the same records.
    assert_eq!(
        json_out(&ws.plugd(&["binding", "show", &id, "--json"])),
        stored
    );
    let out = ws.plugd(&["binding", "update", &id, "--status", "disabled", "--json"]);
    assert_eq!(json_out(&out)["status"], "disabled");
    let tools = call(&serve, &viewer, "GET", "/v1/plugin-tools", None).json();
    assert_eq!(tools, json!([]), "a disabled binding offers nothing");
    let out = ws.plugd(&[
        "binding",
        "create",
        "--package",
        "acme/devkit",
        "--export",
        "jira_search",
        "--org",
        "org_a",
        "--config",
        r#"{"max_results": "ten"}"#,
        "--json",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("/config/max_results") && err.contains("/config: "),
        "{err}"
    );
    let v = json_out(&ws.plugd(&["binding", "validate", &id, "--json"]));
    assert_eq!(v["valid"], true, "{v}");
}

#[test]
fn org_tokens_get_404_for_everything_of_another_org_both_ways() {
    let (_reg, ws, serve) = setup();
    let orgs = ["org_a", "org_b"];
    let ops: Vec<String> = orgs
        .iter()
        .map(|o| org_token(&ws, &format!("{o}-op"), "operator", o, &[]))
        .collect();
    let viewers: Vec<String> = orgs
        .iter()
        .map(|o| org_token(&ws, &format!("{o}-view"), "viewer", o, &[]))
        .collect();
    // org_a binds 0.1.0, org_b binds 0.2.0; each sets its own secret.
    let mut ids = Vec::new();
    for (i, (org, version)) in orgs.iter().zip(["0.1.0", "0.2.0"]).enumerate() {
        assert_eq!(
            put_secret(&serve, &ops[i], org, "jira_token", "v").status,
            204
        );
        let body = new_binding(org, version).to_string();
        let r = call(&serve, &ops[i], "POST", "/v1/plugin-bindings", Some(&body));
        assert_eq!(r.status, 201, "{}", r.text());
        ids.push(r.json()["binding_id"].as_str().unwrap().to_owned());
    }
    let versions = ["0.1.0", "0.2.0"];
    for me in 0..2 {
        let other = 1 - me;
        let (other_org, other_id) = (orgs[other], &ids[other]);
        for token in [&ops[me], &viewers[me]] {
            // Bindings: read, patch, validate.
            let path = format!("/v1/plugin-bindings/{other_id}");
            call(&serve, token, "GET", &path, None).error(404, "unknown_binding");
            call(&serve, token, "POST", &format!("{path}:validate"), None)
                .error(404, "unknown_binding");
            let list = call(&serve, token, "GET", "/v1/plugin-bindings", None).json();
            let seen: Vec<&str> = list
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["binding_id"].as_str().unwrap())
                .collect();
            assert_eq!(seen, [ids[me].as_str()]);
            let q = format!("/v1/plugin-bindings?org_id={other_org}");
            assert_eq!(call(&serve, token, "GET", &q, None).json(), json!([]));
            // Discovery: only its own binding's export.
            let tools = call(&serve, token, "GET", "/v1/plugin-tools", None).json();
            assert_eq!(tools.as_array().unwrap().len(), 1, "{tools}");
            assert_eq!(tools[0]["binding_ids"], json!([ids[me]]));
            assert_eq!(tools[0]["package_version"], versions[me]);
            for kind in ["harnesses", "hooks", "compactors"] {
                let r = call(&serve, token, "GET", &format!("/v1/plugin-{kind}"), None);
                assert_eq!(r.json(), json!([]));
            }
            // Secrets.
            call(
                &serve,
                token,
                "GET",
                &format!("/v1/secrets/{other_org}"),
                None,
            )
            .error(404, "not_found");
            let mine = call(
                &serve,
                token,
                "GET",
                &format!("/v1/secrets/{}", orgs[me]),
                None,
            );
            assert_eq!(mine.json()["names"], json!(["jira_token"]));
            // Packages: only the version its org uses.
            let pkgs = call(&serve, token, "GET", "/v1/plugin-packages", None).json();
            assert_eq!(pkgs.as_array().unwrap().len(), 1, "{pkgs}");
            assert_eq!(pkgs[0]["version"], versions[me]);
            let p = format!("/v1/plugin-packages/acme/devkit@{}", versions[other]);
            call(&serve, token, "GET", &p, None).error(404, "unknown_package");
            // Workspace routes do not exist for an org token.
            call(&serve, token, "GET", "/v1/plugins", None).error(404, "not_found");
            // The tool list is its org's bound exports (the one catalog,
            // issue 28), never the other org's.
            let tools = call(&serve, token, "GET", "/v1/tools", None);
            assert_eq!(tools.status, 200, "{}", tools.text());
            let rows = tools.json();
            assert!(
                rows.as_array()
                    .unwrap()
                    .iter()
                    .all(|t| t["binding_id"] != json!(other_id)),
                "{rows}"
            );
            let invoke = "/v1/tools/x:invoke";
            call(&serve, token, "POST", invoke, Some("{}")).error(404, "not_found");
        }
        let op = &ops[me];
        let path = format!("/v1/plugin-bindings/{other_id}");
        let patch = json!({"status": "disabled"}).to_string();
        call(&serve, op, "PATCH", &path, Some(&patch)).error(404, "unknown_binding");
        put_secret(&serve, op, other_org, "jira_token", "stolen").error(404, "not_found");
        let body = new_binding(other_org, versions[me]).to_string();
        call(&serve, op, "POST", "/v1/plugin-bindings", Some(&body)).error(404, "not_found");
        // A reference into the other org is refused even in its own scope.
        let mut cross = new_binding(orgs[me], versions[me]);
        cross["secrets"] = json!({"jira_token": format!("secret://{other_org}/jira_token")});
        assert_eq!(
            refused(&serve, op, "POST", "/v1/plugin-bindings", &cross),
            ["/secrets/jira_token"]
        );
        let pull = json!({"source": "oci://127.0.0.1:1/x:1"}).to_string();
        call(&serve, op, "POST", "/v1/plugin-packages", Some(&pull)).error(403, "forbidden");
    }
    // The other org's binding is untouched; a workspace viewer sees both.
    let ws_viewer = make_token(&ws, "viewer");
    let all = call(&serve, &ws_viewer, "GET", "/v1/plugin-bindings", None).json();
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    assert!(
        all.as_array()
            .unwrap()
            .iter()
            .all(|b| b["status"] == "active")
    );
    let tools = call(&serve, &ws_viewer, "GET", "/v1/plugin-tools", None).json();
    assert_eq!(tools.as_array().unwrap().len(), 2, "{tools}");
    // token list shows each token's scope.
    let list = ok(&ws.plugd(&["token", "list"]));
    assert!(
        list.contains("org_a") && list.contains("workspace"),
        "{list}"
    );

    // `plugd secret set ORG/NAME` reads the value from standard input.
    let mut child = plugd_cmd(ws.dir())
        .args(["secret", "set", "org_b/deploy_key"])
        .env("PLUGD_MASTER_KEY", MASTER_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"k\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let names = json_out(&ws.plugd(&["secret", "list", "org_b", "--json"]));
    assert_eq!(names, json!(["deploy_key", "jira_token"]));
    call(&serve, &viewers[0], "GET", "/v1/secrets/org_b", None).error(404, "not_found");
}
