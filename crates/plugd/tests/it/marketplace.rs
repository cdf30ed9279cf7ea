//! The marketplace and package signatures end to end: a real
//! `docker-registry` on loopback, Ed25519 keys made by `plugd plugin
//! keygen`, packages signed by `plugd plugin sign`, an index signed by
//! `plugd marketplace sign`, and `plugd serve` over HTTP. Lists, shows and
//! installs by CLI and API; a tampered, untrusted or oversized index; an
//! unsigned, a contract-ready, a forged and a tampered-digest entry; the
//! production and development modes; org and role boundaries.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http::{Resp, Serve, make_token, request_as};
use crate::packages::{Registry, json_out, push};
use crate::support::{Ws, ok, stderr, stdout};

/// A key made by `plugd plugin keygen`.
pub(crate) struct Key {
    pub(crate) path: PathBuf,
    pub(crate) public: String,
    pub(crate) id: String,
}

pub(crate) fn keygen(ws: &Ws, name: &str) -> Key {
    let path = ws.dir().join(format!("{name}.pem"));
    let text = ok(&ws.plugd(&["plugin", "keygen", "--out", path.to_str().unwrap()]));
    let field = |label: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(label))
            .unwrap_or_else(|| panic!("no {label:?} in {text}"))
            .trim()
            .to_owned()
    };
    Key {
        public: field("public key:"),
        id: field("key id:"),
        path,
    }
}

/// A VAI package `acme/NAME` 1.0.0 with one tool export `search` whose
/// config needs `base_url`, in `parent/NAME`.
fn package(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::write(
        dir.join("vai-plugin.toml"),
        format!(
            r#"api_version = "vai.plugin.v1"
package_id = "acme/{name}"
version = "1.0.0"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["./bin/plugin"]

[[exports]]
id = "search"
kind = "tool"
config_schema = "schemas/config.json"

[exports.tool]
effect_class = "read_only"
"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("schemas/config.json"),
        r#"{"type": "object", "required": ["base_url"], "properties": {"base_url": {"type": "string"}}}"#,
    )
    .unwrap();
    std::fs::write(dir.join("bin/plugin"), "#!/bin/sh\nexit 0\n").unwrap();
    dir
}

pub(crate) fn sign_dir(ws: &Ws, dir: &Path, key: &Key) {
    ok(&ws.plugd(&[
        "plugin",
        "sign",
        dir.to_str().unwrap(),
        "--key",
        key.path.to_str().unwrap(),
    ]));
}

/// Pushes `acme/NAME:1.0.0`; its pinned reference.
fn publish(ws: &Ws, reg: &Registry, dir: &Path, name: &str) -> String {
    let digest = push(ws, dir, &reg.reference(&format!("acme/{name}:1.0.0")));
    reg.reference(&format!("acme/{name}@{digest}"))
}

fn entry(id: &str, oci: &str, signed_by: Option<&str>, review: &str) -> Value {
    let mut e = json!({
        "id": id,
        "name": format!("Acme {id}"),
        "publisher": "Acme",
        "review": review,
        "install_policy": "available",
        "oci": oci,
        "sources": [format!("https://git.example.com/acme/{id}")],
        "exports": [{"kind": "tool", "id": "search"}],
    });
    if let Some(k) = signed_by {
        e["signed_by"] = json!(k);
    }
    e
}

fn contract_ready() -> Value {
    json!({
        "id": "codex",
        "name": "OpenAI Codex Hosted Harness",
        "publisher": "Rhone",
        "review": "reviewed",
        "install_policy": "contract_ready",
        "contract": "vai harness adapter (Codex App Server)",
        "sources": ["https://git.example.com/rhone/codex-adapter"],
        "exports": [{"kind": "harness", "id": "codex"}],
    })
}

/// Writes the index `entries` to `ws/index.json` and signs it with `key`.
pub(crate) fn write_index(ws: &Ws, entries: &[Value], key: &Key) -> PathBuf {
    let path = ws.dir().join("index.json");
    let doc = json!({
        "format": "plugd-marketplace/1",
        "index": {"name": "Acme curated", "entries": entries},
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let out = ok(&ws.plugd(&[
        "marketplace",
        "sign",
        path.to_str().unwrap(),
        "--key",
        key.path.to_str().unwrap(),
    ]));
    assert!(out.contains(&key.id), "{out}");
    path
}

pub(crate) fn plugd_yaml(ws: &Ws, trusted: &[(&str, &Key)], marketplace: &str) {
    let mut y = String::from("trusted_publishers:\n");
    for (name, k) in trusted {
        y.push_str(&format!(
            "  - {{name: {name}, public_key: \"{}\"}}\n",
            k.public
        ));
    }
    y.push_str(marketplace);
    std::fs::write(ws.dir().join("plugd.yaml"), y).unwrap();
}

fn fails(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", stdout(out));
    stderr(out)
}

fn call(serve: &Serve, token: &str, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let text = body.map(Value::to_string);
    let headers: &[(&str, &str)] = if body.is_some() {
        &[("Content-Type", "application/json")]
    } else {
        &[]
    };
    request_as(
        serve,
        token,
        method,
        path,
        headers,
        text.as_deref().map(str::as_bytes),
    )
}

pub(crate) fn org_token(ws: &Ws, name: &str, role: &str, org: &str) -> String {
    let v = json_out(&ws.plugd(&[
        "token", "create", "--name", name, "--role", role, "--org", org, "--json",
    ]));
    v["token"].as_str().unwrap().to_owned()
}

fn installed_ids(ws: &Ws) -> Vec<String> {
    json_out(&ws.plugd(&["package", "list", "--json"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["package_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Production mode, the whole path: list, show and install by CLI and by
/// API; a second install updates; every refusal names its cause.
#[test]
fn production_installs_only_trusted_signed_entries_and_a_second_install_updates() {
    let reg = Registry::start();
    let ws = Ws::new();
    let curator = keygen(&ws, "curator");
    let publisher = keygen(&ws, "publisher");
    let stranger = keygen(&ws, "stranger");

    let weave = package(ws.dir(), "weave");
    sign_dir(&ws, &weave, &publisher);
    let weave_ref = publish(&ws, &reg, &weave, "weave");
    let loose_ref = publish(&ws, &reg, &package(ws.dir(), "loose"), "loose");
    // Signed, then a file changed: the signature no longer covers it.
    let forged = package(ws.dir(), "forged");
    sign_dir(&ws, &forged, &publisher);
    std::fs::write(forged.join("bin/plugin"), "#!/bin/sh\ncurl evil\n").unwrap();
    let forged_ref = publish(&ws, &reg, &forged, "forged");
    // The registry serves other bytes than the pinned digest names.
    let bent = package(ws.dir(), "bent");
    sign_dir(&ws, &bent, &publisher);
    let bent_ref = publish(&ws, &reg, &bent, "bent");
    let bent_digest = bent_ref.rsplit_once('@').unwrap().1;
    let blob = reg.blob_file(bent_digest);
    let stored = std::fs::read_to_string(&blob).unwrap();
    let lied = stored.replacen("vai-plugin.toml", "vai-plugin.tomm", 1);
    assert_ne!(stored, lied);
    std::fs::write(&blob, lied).unwrap();

    let entries = [
        entry("weave", &weave_ref, Some(&publisher.id), "reviewed"),
        entry("loose", &loose_ref, None, "reviewed"),
        entry("forged", &forged_ref, Some(&publisher.id), "reviewed"),
        entry("bent", &bent_ref, Some(&publisher.id), "reviewed"),
        // The right bytes, but the entry names another (trusted) signer.
        entry("misattributed", &weave_ref, Some(&curator.id), "reviewed"),
        contract_ready(),
    ];
    let index = write_index(&ws, &entries, &curator);
    plugd_yaml(
        &ws,
        &[("curator", &curator), ("acme", &publisher)],
        "marketplace: {index: index.json}\n",
    );

    // The catalog by CLI: each entry with its posture.
    let list = json_out(&ws.plugd(&["marketplace", "list", "--json"]));
    assert_eq!(
        (&list["mode"], &list["signed_by"], &list["key_id"]),
        (&json!("production"), &json!("curator"), &json!(curator.id))
    );
    let by_id = |id: &str| {
        list["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(by_id("weave")["installable"], true);
    assert_eq!(
        by_id("weave")["signature"],
        format!("signed by key {} (trusted publisher acme)", publisher.id)
    );
    let loose = by_id("loose");
    assert_eq!(
        (&loose["installable"], &loose["installability"]["state"]),
        (&json!(false), &json!("refused"))
    );
    assert_eq!(by_id("codex")["installability"]["state"], "contract_ready");
    let text = ok(&ws.plugd(&["marketplace", "show", "codex"]));
    assert!(
        text.contains("contract-ready, not installable")
            && text.contains("vai harness adapter (Codex App Server)")
            && text.contains("https://git.example.com/rhone/codex-adapter"),
        "{text}"
    );
    let text = ok(&ws.plugd(&["marketplace", "list"]));
    assert!(
        text.contains("weave") && text.contains("installable"),
        "{text}"
    );

    // Install by CLI: the package (verified) and one binding.
    let done = json_out(&ws.plugd(&[
        "marketplace",
        "install",
        "weave",
        "--org",
        "org_a",
        "--config",
        r#"{"base_url": "https://a.example.com"}"#,
        "--json",
    ]));
    assert_eq!(done["package_new"], true, "{done}");
    assert_eq!(done["package"]["signature"]["status"], "verified");
    assert_eq!(
        done["package"]["signature"]["key_id"],
        publisher.id.as_str()
    );
    let a_binding = done["bindings"][0].clone();
    assert_eq!(
        (
            &a_binding["action"],
            &a_binding["export_id"],
            &a_binding["scope"]
        ),
        (
            &json!("created"),
            &json!("search"),
            &json!({"org_id": "org_a"})
        )
    );
    let shown = ok(&ws.plugd(&["package", "show", "acme/weave"]));
    assert!(
        shown.contains(&format!("verified (key {}, publisher acme)", publisher.id)),
        "{shown}"
    );

    // Refusals by CLI, each naming why; nothing of them is installed.
    // Installed already, checked again: the entry's signer must match.
    let err = fails(&ws.plugd(&["marketplace", "install", "misattributed", "--org", "org_a"]));
    assert!(
        err.contains(&format!("says key {} signed it", curator.id)),
        "{err}"
    );
    let err = fails(&ws.plugd(&["marketplace", "install", "loose", "--org", "org_a"]));
    assert!(
        err.contains("not installable") && err.contains("declares none"),
        "{err}"
    );
    let err = fails(&ws.plugd(&["marketplace", "install", "codex", "--org", "org_a"]));
    assert!(err.contains("contract-ready, not installable"), "{err}");
    let err = fails(&ws.plugd(&["marketplace", "install", "forged", "--org", "org_a"]));
    assert!(
        err.contains("signature") && err.contains("bin/plugin changed"),
        "{err}"
    );
    let err = fails(&ws.plugd(&["marketplace", "install", "bent", "--org", "org_a"]));
    assert!(
        err.contains("does not match its digest") && err.contains(bent_digest),
        "{err}"
    );
    assert_eq!(installed_ids(&ws), ["acme/weave"]);

    // The API, for viewers (org tokens too) and operators.
    let serve = Serve::start_with_env(&ws, &[]);
    let viewer = make_token(&ws, "viewer");
    let operator = make_token(&ws, "operator");
    let a_viewer = org_token(&ws, "a-viewer", "viewer", "org_a");
    let a_operator = org_token(&ws, "a-operator", "operator", "org_a");
    let got = call(&serve, &viewer, "GET", "/v1/marketplace", None);
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["entries"], list["entries"]);
    let got = call(&serve, &a_viewer, "GET", "/v1/marketplace/weave", None);
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json(), by_id("weave"));
    call(&serve, &viewer, "GET", "/v1/marketplace/nothing", None).error(404, "unknown_entry");

    let install = |token: &str, id: &str, body: Value| {
        call(
            &serve,
            token,
            "POST",
            &format!("/v1/marketplace/{id}:install"),
            Some(&body),
        )
    };
    let cfg = |u: &str| json!({"base_url": u});
    install(
        &viewer,
        "weave",
        json!({"org_id": "org_b", "config": cfg("b")}),
    )
    .error(403, "forbidden");
    let r = install(
        &operator,
        "weave",
        json!({"org_id": "org_b", "config": cfg("b1")}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let first = r.json();
    assert_eq!(
        (&first["package_new"], &first["bindings"][0]["action"]),
        (&json!(false), &json!("created"))
    );
    // Again: the same binding, updated, never a second one.
    let r = install(
        &operator,
        "weave",
        json!({"org_id": "org_b", "config": cfg("b2")}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let again = r.json();
    assert_eq!(again["bindings"][0]["action"], "updated");
    assert_eq!(
        again["bindings"][0]["binding_id"],
        first["bindings"][0]["binding_id"]
    );
    let b_bindings = call(
        &serve,
        &operator,
        "GET",
        "/v1/plugin-bindings?org_id=org_b",
        None,
    )
    .json();
    assert_eq!(b_bindings.as_array().unwrap().len(), 1, "{b_bindings}");
    assert_eq!(b_bindings[0]["config"], cfg("b2"));
    // Binding checks are the ordinary ones: the config schema applies.
    install(
        &operator,
        "weave",
        json!({"org_id": "org_c", "config": {"x": 1}}),
    )
    .error(422, "invalid_binding");

    // Org A installs into its own org (updating the CLI's binding), never
    // into org B's, which does not exist for it.
    install(
        &a_operator,
        "weave",
        json!({"org_id": "org_b", "config": cfg("x")}),
    )
    .error(404, "not_found");
    let r = install(
        &a_operator,
        "weave",
        json!({"org_id": "org_a", "config": cfg("a2")}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["bindings"][0]["binding_id"],
        a_binding["binding_id"]
    );
    install(&operator, "codex", json!({"org_id": "org_b"})).error(409, "entry_not_installable");
    install(&operator, "loose", json!({"org_id": "org_b"})).error(409, "entry_not_installable");
    install(&operator, "forged", json!({"org_id": "org_b"})).error(422, "signature_refused");
    // A plain pull through the API runs the same check.
    let v = call(
        &serve,
        &operator,
        "POST",
        "/v1/plugin-packages",
        Some(&json!({"source": forged_ref})),
    )
    .error(422, "signature_refused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bin/plugin changed"),
        "{v}"
    );
    assert_eq!(installed_ids(&ws), ["acme/weave"]);

    // One byte of the index changed: the whole index is refused, by name.
    let signed = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, signed.replacen("Acme loose", "Acme lo0se", 1)).unwrap();
    let v = call(&serve, &viewer, "GET", "/v1/marketplace", None)
        .error(502, "marketplace_index_refused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not verify"),
        "{v}"
    );
    install(
        &operator,
        "weave",
        json!({"org_id": "org_b", "config": cfg("t")}),
    )
    .error(502, "marketplace_index_refused");
    // Signed by a key plugd.yaml does not trust.
    write_index(&ws, &entries, &stranger);
    let v = call(&serve, &viewer, "GET", "/v1/marketplace", None)
        .error(502, "marketplace_index_refused");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains(&stranger.id) && m.contains("trusted_publishers"),
        "{m}"
    );
    let err = fails(&ws.plugd(&["marketplace", "list"]));
    assert!(
        err.contains("not in plugd.yaml trusted_publishers"),
        "{err}"
    );
    // Over the size limit.
    std::fs::write(&index, vec![b' '; (1 << 20) + 1]).unwrap();
    let v = call(&serve, &viewer, "GET", "/v1/marketplace", None)
        .error(502, "marketplace_index_refused");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1048576-byte limit"),
        "{v}"
    );
    // Restored, it answers again.
    std::fs::write(&index, signed).unwrap();
    assert_eq!(
        call(&serve, &viewer, "GET", "/v1/marketplace", None).status,
        200
    );
}

/// `python3 -m http.server` on a loopback port, serving `dir`; killed on drop.
struct Files(Child, u16);

impl Files {
    fn start(dir: &Path) -> Files {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        #[allow(clippy::disallowed_methods)] // the index server under test
        let child = std::process::Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "http.server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Files(child, port)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Development mode (the index fetched over loopback HTTP): unsigned and
/// unreviewed entries install, an invalid signature is still refused; and
/// `plugd package pull` follows `require_signatures`.
#[test]
fn development_installs_unsigned_entries_but_never_a_bad_signature() {
    let reg = Registry::start();
    let ws = Ws::new();
    let curator = keygen(&ws, "curator");
    let publisher = keygen(&ws, "publisher");
    let loose_ref = publish(&ws, &reg, &package(ws.dir(), "loose"), "loose");
    let forged = package(ws.dir(), "forged");
    sign_dir(&ws, &forged, &publisher);
    std::fs::write(forged.join("schemas/extra.json"), "{}").unwrap();
    let forged_ref = publish(&ws, &reg, &forged, "forged");
    let entries = [
        entry("loose", &loose_ref, None, "unreviewed"),
        entry("forged", &forged_ref, None, "reviewed"),
    ];
    write_index(&ws, &entries, &curator);
    let files = Files::start(ws.dir());
    plugd_yaml(
        &ws,
        &[("curator", &curator)],
        &format!(
            "marketplace: {{index: \"http://127.0.0.1:{}/index.json\", mode: development}}\n",
            files.1
        ),
    );
    let list = json_out(&ws.plugd(&["marketplace", "list", "--json"]));
    assert_eq!(list["mode"], "development");
    assert_eq!(list["entries"][0]["installable"], true, "{list}");

    let done = json_out(&ws.plugd(&[
        "marketplace",
        "install",
        "loose",
        "--org",
        "org_a",
        "--project",
        "p1",
        "--config",
        r#"{"base_url": "u"}"#,
        "--json",
    ]));
    assert_eq!(done["package"]["signature"], json!({"status": "unsigned"}));
    assert_eq!(
        done["bindings"][0]["scope"],
        json!({"org_id": "org_a", "project_id": "p1"})
    );
    // Secret slots are checked as for any binding: this export has none.
    let err = fails(&ws.plugd(&[
        "marketplace",
        "install",
        "loose",
        "--org",
        "org_a",
        "--config",
        r#"{"base_url": "u"}"#,
        "--secret",
        "nope=secret://org_a/nope",
    ]));
    assert!(err.contains("nope"), "{err}");
    let err = fails(&ws.plugd(&["marketplace", "install", "forged", "--org", "org_a"]));
    assert!(
        err.contains("does not verify") && err.contains("schemas/extra.json added"),
        "{err}"
    );
    // A plain pull refuses it too, whatever the policy.
    let err = fails(&ws.plugd(&["package", "pull", &forged_ref]));
    assert!(err.contains("schemas/extra.json added"), "{err}");
    assert_eq!(installed_ids(&ws), ["acme/loose"]);

    // Production mode, same index: the unsigned entry is refused.
    plugd_yaml(
        &ws,
        &[("curator", &curator)],
        &format!(
            "marketplace: {{index: \"http://127.0.0.1:{}/index.json\"}}\n",
            files.1
        ),
    );
    let err = fails(&ws.plugd(&["marketplace", "install", "loose", "--org", "org_b"]));
    assert!(err.contains("production mode"), "{err}");

    // `package pull` and require_signatures: an unsigned package, and one
    // signed by an untrusted key, are refused only when it is true.
    let signed = package(ws.dir(), "signed");
    sign_dir(&ws, &signed, &publisher);
    let signed_ref = publish(&ws, &reg, &signed, "signed");
    let other_ref = publish(&ws, &reg, &package(ws.dir(), "other"), "other");
    std::fs::write(ws.dir().join("plugd.yaml"), "require_signatures: true\n").unwrap();
    let err = fails(&ws.plugd(&["package", "pull", &other_ref]));
    assert!(
        err.contains("unsigned") && err.contains("require_signatures"),
        "{err}"
    );
    let err = fails(&ws.plugd(&["package", "pull", &signed_ref]));
    assert!(
        err.contains(&publisher.id) && err.contains("trusted_publishers"),
        "{err}"
    );
    std::fs::remove_file(ws.dir().join("plugd.yaml")).unwrap();
    let p = json_out(&ws.plugd(&["package", "pull", &signed_ref, "--json"]));
    assert_eq!(p["signature"]["status"], "untrusted_key");
    let text = ok(&ws.plugd(&["package", "show", "acme/signed"]));
    assert!(
        text.contains(&format!("untrusted key {}", publisher.id)),
        "{text}"
    );
    // The installed digest under a stricter policy is refused again.
    std::fs::write(ws.dir().join("plugd.yaml"), "require_signatures: true\n").unwrap();
    let err = fails(&ws.plugd(&["package", "pull", &signed_ref]));
    assert!(err.contains("trusted_publishers"), "{err}");
}
