//! README "Running plugd for several teams", step by step: the example
//! package `examples/packages/acme-signer` signed and pushed to a real
//! `docker-registry`, listed in a signed marketplace index, installed for
//! two orgs with their own config and secret, called with each org's token
//! over real HTTP, and its invocation records read back by org. Each org
//! gets answers made with its own key and sees only its own calls.

use std::path::Path;
use std::process::{Output, Stdio};

use serde_json::{Value, json};

use crate::http::{Resp, Serve, request_as};
use crate::marketplace::{keygen, org_token, plugd_yaml, sign_dir, write_index};
use crate::packages::{Registry, json_out, push};
use crate::support::{Ws, plugd_cmd, repo, stderr, stdout};

const MASTER_KEY: &str = crate::support::TEST_MASTER_KEY;
const ACME_KEY: &str = "acme-signing-key-7f3a9c";
const GLOBEX_KEY: &str = "globex-signing-key-2b8e1d";

/// `plugd ARGS` with the test's master key and `stdin`.
fn plugd(ws: &Ws, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = plugd_cmd(ws.dir())
        .args(args)
        .env("PLUGD_MASTER_KEY", MASTER_KEY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        w.write_all(s.as_bytes()).unwrap();
    }
    drop(w);
    child.wait_with_output().unwrap()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "plugd failed: {}\n{}",
        stderr(o),
        stdout(o)
    );
    stdout(o)
}

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`, hex: what the plugin must answer.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    hex::encode(
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize(),
    )
}

/// Copies the example package (files and their executable bits).
fn copy_example(to: &Path) {
    let from = repo().join("examples/packages/acme-signer");
    for sub in ["", "bin", "schemas"] {
        std::fs::create_dir_all(to.join(sub)).unwrap();
        for e in std::fs::read_dir(from.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                std::fs::copy(e.path(), to.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
}

fn invoke(serve: &Serve, token: &str, text: &str, session: &str) -> Resp {
    let body = json!({"input": {"text": text}, "session_id": session}).to_string();
    request_as(
        serve,
        token,
        "POST",
        "/v1/plugin-tools/hmac_sign:invoke",
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )
}

#[test]
fn the_several_teams_walkthrough_works_as_written() {
    let reg = Registry::start();
    let ws = Ws::new();

    // 1. The publisher signs the package and pushes it.
    let publisher = keygen(&ws, "acme");
    let src = ws.dir().join("src/acme-signer");
    copy_example(&src);
    sign_dir(&ws, &src, &publisher);
    let digest = push(&ws, &src, &reg.reference("acme/signer:0.1.0"));

    // 2. The curator lists it, pinned by digest, in a signed index, and
    //    the operator trusts both keys and names the index.
    let curator = keygen(&ws, "curator");
    let entry = json!({
        "id": "signer",
        "name": "Acme Signer",
        "publisher": "Acme",
        "review": "reviewed",
        "install_policy": "available",
        "oci": reg.reference(&format!("acme/signer@{digest}")),
        "signed_by": publisher.id,
        "sources": ["https://git.example.com/acme/signer"],
        "exports": [{"kind": "tool", "id": "hmac_sign"}],
    });
    write_index(&ws, &[entry], &curator);
    plugd_yaml(
        &ws,
        &[("curator", &curator), ("acme", &publisher)],
        "marketplace: {index: index.json, mode: production}\n",
    );
    let list = ok(&plugd(&ws, &["marketplace", "list"], None));
    assert!(list.contains("signer"), "{list}");

    // 3. Each team's secret, then the install for each org with its config.
    for (org, key) in [("acme", ACME_KEY), ("globex", GLOBEX_KEY)] {
        ok(&plugd(
            &ws,
            &["secret", "set", &format!("{org}/signing_key")],
            Some(key),
        ));
        let out = ok(&plugd(
            &ws,
            &[
                "marketplace",
                "install",
                "signer",
                "--org",
                org,
                "--config",
                &json!({"label": format!("{org}-prod")}).to_string(),
                "--secret",
                &format!("signing_key=secret://{org}/signing_key"),
            ],
            None,
        ));
        assert!(out.contains("verified"), "{out}");
        assert!(out.contains("binding"), "{out}");
    }
    let bindings = json_out(&plugd(&ws, &["binding", "list", "--json"], None));
    let bindings = bindings.as_array().unwrap();
    assert_eq!(bindings.len(), 2, "{bindings:?}");
    let acme_binding = bindings
        .iter()
        .find(|b| b["scope"]["org_id"] == "acme")
        .unwrap()["binding_id"]
        .clone();

    // 4. Each team calls with its own token and gets its own key's answer.
    let acme = org_token(&ws, "acme-agent", "agent", "acme");
    let globex = org_token(&ws, "globex-agent", "agent", "globex");
    let serve = Serve::start_with_env(&ws, &[("PLUGD_MASTER_KEY", MASTER_KEY)]);
    for (tok, org, key) in [(&acme, "acme", ACME_KEY), (&globex, "globex", GLOBEX_KEY)] {
        let r = invoke(&serve, tok, "ship it", &format!("{org}-chat-1"));
        assert_eq!(r.status, 200, "{org}: {}", r.text());
        let out = &r.json()["structured_output"];
        assert_eq!(out["label"], format!("{org}-prod"), "{out}");
        assert_eq!(
            out["hmac_sha256"],
            hmac_sha256(key.as_bytes(), b"ship it"),
            "{out}"
        );
    }
    // The CLI makes the same call through serve.
    let out = ok(&plugd(
        &ws,
        &[
            "tool",
            "call",
            "hmac_sign",
            "--org",
            "acme",
            "--session",
            "acme-chat-2",
            "--args",
            r#"{"text": "ship it"}"#,
        ],
        None,
    ));
    assert!(
        out.contains(&hmac_sha256(ACME_KEY.as_bytes(), b"ship it")),
        "{out}"
    );

    // 5. Records by org: acme sees its two calls with binding, package and
    //    session; globex sees its one; no record or log holds a key.
    let records = |tok: &str| -> Vec<Value> {
        let r = request_as(
            &serve,
            tok,
            "GET",
            "/v1/invocations?tool=hmac_sign",
            &[],
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["invocations"].as_array().unwrap().clone()
    };
    let mut acme_records = Vec::new();
    for _ in 0..100 {
        acme_records = records(&acme);
        if acme_records.len() == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(acme_records.len(), 2, "{acme_records:?}");
    for r in &acme_records {
        assert_eq!(r["org_id"], "acme", "{r}");
        assert_eq!(r["binding_id"], acme_binding, "{r}");
        assert_eq!(r["package_id"], "acme/signer", "{r}");
        assert_eq!(r["package_version"], "0.1.0", "{r}");
        assert_eq!(r["status"], "succeeded", "{r}");
        assert!(
            r["session_id"].as_str().unwrap().starts_with("acme-chat-"),
            "{r}"
        );
    }
    let globex_records = records(&globex);
    assert_eq!(globex_records.len(), 1, "{globex_records:?}");
    assert_eq!(globex_records[0]["org_id"], "globex");
    let cli = json_out(&plugd(
        &ws,
        &["invocations", "list", "--org", "globex", "--json"],
        None,
    ));
    assert_eq!(cli["invocations"].as_array().unwrap().len(), 1, "{cli}");
    let (_, log) = serve.stop();
    let all = format!("{acme_records:?}{globex_records:?}{cli}{log}");
    for key in [ACME_KEY, GLOBEX_KEY] {
        assert!(!all.contains(key), "a signing key leaked: {all}");
    }
}
