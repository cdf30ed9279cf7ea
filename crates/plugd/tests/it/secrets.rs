//! Plugin settings and encrypted secrets through the real CLI: a Python
//! Salmex plugin written by the test receives its decrypted configuration,
//! no file on disk ever holds a secret in clear, secrets print as `••••`,
//! a crash report never carries them, rotation keeps them readable, a
//! wrong key or a tampered ciphertext is refused by name, a running
//! `plugd serve` applies changes (Salmex `config/changed`, native restart),
//! and a VAI invocation sees only the called export's secret slots.
//!
//! Every plugd process gets its own HOME, XDG_CONFIG_HOME and PLUGD_KEY_FILE
//! under a temporary directory, so nothing touches the real home.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use plugd_store::Store;
use plugd_store::secrets::StoredValue;
use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, plugd_cmd, repo, stderr, stdout};

const MASK: &str = "••••";

/// A Salmex plugin (Python stdlib) whose tools report what it was given.
const PLUGIN_PY: &str = r#"
import json, os, sys, time
config = {}
changes = 0

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

def send(obj):
    data = json.dumps(obj).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n" % len(data) + data)
    sys.stdout.buffer.flush()

def text(s):
    return {"content": [{"type": "text", "text": s}]}

while True:
    body = read_frame(sys.stdin.buffer)
    if body is None:
        break
    msg = json.loads(body)
    m = msg.get("method")
    if m == "initialize":
        config = (msg.get("params") or {}).get("config") or {}
        if config.get("crash_at_init"):
            sys.stderr.write("[ERROR] login refused for key %s\n" % config.get("api_key"))
            sys.stderr.flush()
            os._exit(3)
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "1.0",
              "capabilities": {"tools": [{"name": "show_config"}, {"name": "leak"}]}}})
    elif m == "config/changed":
        config = (msg.get("params") or {}).get("config") or {}
        changes += 1
    elif m == "tools/call":
        name = msg["params"]["name"]
        if name == "show_config":
            send({"jsonrpc": "2.0", "id": msg["id"], "result": text(json.dumps(
                {"config": config, "changes": changes, "pid": os.getpid()}))})
        elif name == "leak":
            send({"jsonrpc": "2.0", "method": "log.error",
                  "params": {"message": "log says %s" % config.get("api_key")}})
            time.sleep(0.2)
            sys.stderr.write("[ERROR] upstream said 401 for token %s\n" % config.get("api_key"))
            sys.stderr.flush()
            os._exit(4)
    elif m == "shutdown":
        break
"#;

/// Per-test key location and home.
struct Keys {
    tmp: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let keys = Keys {
            tmp: tempfile::tempdir().unwrap(),
        };
        crate::support::test_key_file(&keys.key_file());
        keys
    }
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }
    fn key_file(&self) -> PathBuf {
        self.tmp.path().join("config/plugd/master.key")
    }
}

/// `plugd ARGS` on `ws` with the test's key location; `master` sets
/// PLUGD_MASTER_KEY; `stdin` is written to its standard input.
fn run(ws: &Ws, keys: &Keys, args: &[&str], master: Option<&str>, stdin: Option<&str>) -> Output {
    let mut cmd = plugd_cmd(ws.dir());
    cmd.args(args)
        .env("HOME", keys.home())
        .env("XDG_CONFIG_HOME", keys.tmp.path().join("config"))
        .env("PLUGD_KEY_FILE", keys.key_file())
        .env_remove("PLUGD_MASTER_KEY")
        .env_remove("PLUGD_NEW_MASTER_KEY");
    if let Some(m) = master {
        cmd.env("PLUGD_MASTER_KEY", m);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        let mut w = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            w.write_all(s.as_bytes()).unwrap();
        }
    }
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

#[track_caller]
fn fails(o: &Output) -> String {
    assert!(!o.status.success(), "plugd succeeded: {}", stdout(o));
    stderr(o)
}

/// Clears the failure mark a refused start leaves (`plugd plugin restart`).
fn restart(ws: &Ws, keys: &Keys, id: &str) {
    ok(&run(ws, keys, &["plugin", "restart", id], None, None));
}

/// A random secret that appears nowhere else.
fn fresh_secret() -> String {
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = (std::process::id() as u8)
            .wrapping_mul(31)
            .wrapping_add(i as u8)
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u8)
                .wrapping_mul(i as u8 + 7);
    }
    format!(
        "sk-test-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

/// The Salmex test plugin `id` in `ws`.
fn salmex_plugin(ws: &Ws, id: &str) -> PathBuf {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.py"), PLUGIN_PY).unwrap();
    let manifest = json!({
        "name": id,
        "version": "0.1.0",
        "protocolVersion": "1.0",
        "interpreter": "python3",
        "main": "plugin.py",
        "capabilities": {"tools": [
            {"name": "show_config", "risk_level": "low"},
            {"name": "leak", "risk_level": "low"}
        ]},
        "config": {"properties": [
            {"key": "api_key", "type": "secret", "required": true},
            {"key": "units", "type": "select", "default": "metric",
             "options": [{"value": "metric"}, {"value": "imperial"}]},
            {"key": "verbose", "type": "boolean", "default": false},
            {"key": "debug_url", "type": "string", "required": true,
             "show_when": {"verbose": true}},
            {"key": "retries", "type": "integer", "default": 3},
            {"key": "crash_at_init", "type": "boolean", "default": false}
        ]}
    });
    std::fs::write(
        dir.join("plugin.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    dir
}

/// `show_config`'s report through `plugd tool call`.
fn show_config(ws: &Ws, keys: &Keys, id: &str, master: Option<&str>) -> Value {
    let out = ok(&run(
        ws,
        keys,
        &["tool", "call", &format!("{id}/show_config"), "--json"],
        master,
        None,
    ));
    let v: Value = serde_json::from_str(&out).unwrap();
    serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap()
}

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut scanned = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file() {
                scanned += 1;
                let bytes = std::fs::read(&p).unwrap();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p);
                }
            }
        }
    }
    assert!(scanned > 0, "nothing scanned under {}", root.display());
    hits
}

#[test]
fn salmex_plugin_gets_its_decrypted_config_and_no_file_holds_the_secret() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    let secret = fresh_secret();

    // Typed values from the command line; the secret from stdin.
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "units", "imperial"],
        None,
        None,
    ));
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "retries", "42"],
        None,
        None,
    ));
    let out = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some(&format!("{secret}\n")),
    ));
    assert!(out.contains("set sec api_key"), "{out}");
    assert!(!out.contains(&secret), "{out}");

    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));
    let got = show_config(&ws, &keys, "sec", None);
    assert_eq!(got["config"]["api_key"], secret.as_str(), "{got}");
    assert_eq!(got["config"]["units"], "imperial");
    assert_eq!(got["config"]["retries"], 42);
    assert_eq!(got["config"]["verbose"], false, "defaults are filled in");

    // show / get / plugin show print the mask, never the value.
    let show = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "show"],
        None,
        None,
    ));
    assert!(show.contains(MASK) && !show.contains(&secret), "{show}");
    assert!(show.contains("imperial") && show.contains("42"), "{show}");
    let json: Value = serde_json::from_str(&ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "show", "--json"],
        None,
        None,
    )))
    .unwrap();
    let api = json
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == "api_key")
        .unwrap();
    assert_eq!(api["value"], MASK);
    assert_eq!(api["secret"], true);
    let get = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "get", "api_key"],
        None,
        None,
    ));
    assert_eq!(get.trim(), MASK);
    let info = ok(&run(
        &ws,
        &keys,
        &["plugin", "show", "sec", "--json"],
        None,
        None,
    ));
    assert!(info.contains(MASK) && !info.contains(&secret), "{info}");

    // The key file is private; no file anywhere holds the plaintext
    // (state.db and its -wal/-shm included).
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(keys.key_file())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let dmode = std::fs::metadata(keys.key_file().parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dmode, 0o700);
    // The state store holds only the sealed value (the SQLite file, or the
    // cluster's database in the PostgreSQL pass).
    assert!(crate::support::on_postgres() || ws.dir().join(".plugd/state.db").exists());
    assert!(
        !String::from_utf8_lossy(&ws.state_bytes()).contains(&secret),
        "the state store holds the plaintext"
    );
    assert_eq!(
        files_containing(ws.dir(), secret.as_bytes()),
        Vec::<PathBuf>::new()
    );
    assert_eq!(
        files_containing(keys.tmp.path(), secret.as_bytes()),
        Vec::<PathBuf>::new()
    );
}

/// With plugd.yaml's `records.keep_bodies` on, a record keeps the
/// call's arguments and result, but never a secret: the plugin's secret
/// setting (echoed in an argument and in the result) and a `password`
/// argument read `***`, in the record and in the state store.
#[test]
fn kept_bodies_of_invocation_records_mask_secrets() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    let secret = fresh_secret();
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some(&format!("{secret}\n")),
    ));
    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "records:\n  keep_bodies: true\n",
    )
    .unwrap();
    let args = json!({"password": "hunter2-pw", "note": format!("my key is {secret}")});
    let out = ok(&run(
        &ws,
        &keys,
        &[
            "tool",
            "call",
            "sec/show_config",
            "--args",
            &args.to_string(),
            "--json",
        ],
        None,
        None,
    ));
    assert!(
        out.contains(&secret),
        "the caller gets the result as is: {out}"
    );
    let listed: Value = serde_json::from_str(&ok(&run(
        &ws,
        &keys,
        &["invocations", "list", "--json"],
        None,
        None,
    )))
    .unwrap();
    let id = listed["invocations"][0]["invocation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let record: Value = serde_json::from_str(&ok(&run(
        &ws,
        &keys,
        &["invocations", "show", &id, "--json"],
        None,
        None,
    )))
    .unwrap();
    let payload = &record["payload"];
    assert_eq!(
        payload["args"],
        json!({"password": "***", "note": "my key is ***"}),
        "{record}"
    );
    let text = payload["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.contains(r#""api_key": "***""#), "{record}");
    assert!(
        payload.get("error").is_none() && payload.get("decisions").is_none(),
        "{record}"
    );
    let all = record.to_string();
    assert!(
        !all.contains(&secret) && !all.contains("hunter2-pw"),
        "{all}"
    );
    let stored = String::from_utf8_lossy(&ws.state_bytes()).into_owned();
    assert!(
        !stored.contains(&secret) && !stored.contains("hunter2-pw"),
        "the state store holds a secret of the record"
    );
}

#[test]
fn a_missing_required_setting_refuses_the_start_with_the_command_that_sets_it() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    // Seed 004: approval comes before configuration, so it succeeds; the
    // start (the first call) is what waits for the required settings.
    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));
    let call = ["tool", "call", "sec/show_config"];
    let e = fails(&run(&ws, &keys, &call, None, None));
    assert!(e.contains("\"sec\""), "{e}");
    assert!(e.contains("required setting \"api_key\" is not set"), "{e}");
    assert!(e.contains("`plugd plugin config sec set api_key -`"), "{e}");

    // show_when: debug_url is required only once verbose is true.
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some("k1"),
    ));
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "verbose", "true"],
        None,
        None,
    ));
    let e = fails(&run(&ws, &keys, &call, None, None));
    assert!(
        e.contains("required setting \"debug_url\" is not set"),
        "{e}"
    );
    assert!(
        e.contains("`plugd plugin config sec set debug_url VALUE`"),
        "{e}"
    );
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "unset", "verbose"],
        None,
        None,
    ));
    ok(&run(&ws, &keys, &call, None, None));
}

#[test]
fn bad_values_and_unknown_keys_are_refused_by_name() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    for (args, want) in [
        (
            vec!["retries", "many"],
            "plugin \"sec\" settings: \"retries\" must be an integer, got \"many\"",
        ),
        (vec!["verbose", "yes"], "\"verbose\" must be true or false"),
        (
            vec!["units", "kelvin"],
            "\"kelvin\" is not an option of \"units\"; use one of metric, imperial",
        ),
        (
            vec!["colour", "red"],
            "it has no setting \"colour\"; its settings are: api_key, units, verbose, debug_url, retries, crash_at_init",
        ),
    ] {
        let mut a = vec!["plugin", "config", "sec", "set"];
        a.extend(args);
        let e = fails(&run(&ws, &keys, &a, None, None));
        assert!(e.contains(want), "{a:?}: {e}");
    }
    let e = fails(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "get", "nope"],
        None,
        None,
    ));
    assert!(e.contains("has no setting \"nope\""), "{e}");
    // Nothing was stored by the refused commands.
    let show = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "show", "--json"],
        None,
        None,
    ));
    let v: Value = serde_json::from_str(&show).unwrap();
    assert!(
        v.as_array().unwrap().iter().all(|e| e["source"] != "set"),
        "{v}"
    );
}

#[test]
fn rotation_keeps_secrets_readable_and_the_old_key_stops_working() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    let secret = fresh_secret();
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some(&secret),
    ));
    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));
    let old_hex = std::fs::read_to_string(keys.key_file()).unwrap();
    let old_hex = old_hex.trim();

    let out = ok(&run(&ws, &keys, &["secrets", "rotate"], None, None));
    let (old_id, new_id) = {
        let l = out.split_whitespace().collect::<Vec<_>>();
        let i = l.iter().position(|w| *w == "->").unwrap();
        (
            l[i - 1].to_owned(),
            l[i + 1].trim_end_matches(':').to_owned(),
        )
    };
    assert_ne!(old_id, new_id, "{out}");
    assert!(out.contains("1 secret(s) re-encrypted"), "{out}");
    let new_hex = std::fs::read_to_string(keys.key_file()).unwrap();
    assert_ne!(new_hex.trim(), old_hex);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(keys.key_file())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    // Still readable with the new key file.
    let got = show_config(&ws, &keys, "sec", None);
    assert_eq!(got["config"]["api_key"], secret.as_str());

    // The old key no longer opens it: a clear error naming plugin, field and keys.
    let e = fails(&run(
        &ws,
        &keys,
        &["tool", "call", "sec/show_config"],
        Some(old_hex),
        None,
    ));
    if crate::support::on_postgres() {
        // A cluster's record names the new key: a node with the old one is
        // refused at open, naming both.
        assert!(
            e.contains(&format!(
                "whose master key is {new_id}, but this node's master key is {old_id}"
            )),
            "{e}"
        );
    } else {
        assert!(e.contains("secret \"api_key\" of plugin \"sec\""), "{e}");
        assert!(
            e.contains(&format!(
                "encrypted with master key {new_id} but the current key is {old_id}"
            )),
            "{e}"
        );
    }
    assert!(!e.contains(&secret), "{e}");
    restart(&ws, &keys, "sec");

    // PLUGD_MASTER_KEY rotation: the new key comes from PLUGD_NEW_MASTER_KEY.
    let env_new = "ab".repeat(32);
    let mut cmd = plugd_cmd(ws.dir());
    let o = cmd
        .args(["secrets", "rotate"])
        .env("HOME", keys.home())
        .env("PLUGD_KEY_FILE", keys.key_file())
        .env("PLUGD_MASTER_KEY", new_hex.trim())
        .env("PLUGD_NEW_MASTER_KEY", &env_new)
        .output()
        .unwrap();
    let out = ok(&o);
    assert!(out.contains("now set PLUGD_MASTER_KEY"), "{out}");
    let got = show_config(&ws, &keys, "sec", Some(&env_new));
    assert_eq!(got["config"]["api_key"], secret.as_str());
}

#[test]
fn a_wrong_master_key_or_a_tampered_ciphertext_is_a_clear_error() {
    if crate::support::sqlite_only(
        "it tampers sealed values through the SQLite file; a cluster refuses a node with another key at open (state_pg.rs)",
    ) {
        return;
    }
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    let right = "11".repeat(32);
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        Some(&right),
        Some("k-123"),
    ));
    ok(&run(
        &ws,
        &keys,
        &["plugin", "approve", "sec"],
        Some(&right),
        None,
    ));

    // Not a key at all.
    let e = fails(&run(
        &ws,
        &keys,
        &["tool", "call", "sec/show_config"],
        Some("short"),
        None,
    ));
    assert!(
        e.contains("PLUGD_MASTER_KEY") && e.contains("expected 64 hex characters"),
        "{e}"
    );
    // A valid key, but not the one used.
    assert!(
        e.contains("run `plugd plugin restart sec` after fixing it"),
        "{e}"
    );
    restart(&ws, &keys, "sec");
    let e = fails(&run(
        &ws,
        &keys,
        &["tool", "call", "sec/show_config"],
        Some(&"22".repeat(32)),
        None,
    ));
    assert!(
        e.contains("secret \"api_key\" of plugin \"sec\" was encrypted with master key"),
        "{e}"
    );
    assert!(e.contains("(PLUGD_MASTER_KEY)"), "{e}");

    restart(&ws, &keys, "sec");
    // Flip one bit of the stored ciphertext.
    {
        let store = Store::open(&ws.dir().join(".plugd")).unwrap();
        let Some(StoredValue::Secret(mut sealed)) = store.config_value("sec", "api_key").unwrap()
        else {
            panic!("api_key is not sealed");
        };
        sealed.ciphertext[2] ^= 0x40;
        store.put_sealed("sec", "api_key", &sealed).unwrap();
    }
    let e = fails(&run(
        &ws,
        &keys,
        &["tool", "call", "sec/show_config"],
        Some(&right),
        None,
    ));
    assert!(
        e.contains("secret \"api_key\" of plugin \"sec\" cannot be decrypted: its ciphertext fails authentication"),
        "{e}"
    );
    assert!(e.contains("plugd plugin config sec set api_key -"), "{e}");
    // Setting it again is the fix: the failure mark goes with it.
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        Some(&right),
        Some("k-fixed"),
    ));
    let got = show_config(&ws, &keys, "sec", Some(&right));
    assert_eq!(got["config"]["api_key"], "k-fixed");

    // A ciphertext moved to another field fails too (AAD binds the key).
    {
        let store = Store::open(&ws.dir().join(".plugd")).unwrap();
        ok(&run(
            &ws,
            &keys,
            &["plugin", "config", "sec", "set", "api_key", "-"],
            Some(&right),
            Some("k-456"),
        ));
        let Some(StoredValue::Secret(sealed)) = store.config_value("sec", "api_key").unwrap()
        else {
            panic!("api_key is not sealed");
        };
        store.put_sealed("other", "api_key", &sealed).unwrap();
        let plain = plugd_store::secrets::MasterKey::from_hex(&right, "t").unwrap();
        assert!(plain.open("sec", "api_key", &sealed).is_ok());
        assert!(plain.open("other", "api_key", &sealed).is_err());
        assert!(plain.open("sec", "units", &sealed).is_err());
    }
}

#[test]
fn a_secret_printed_to_stderr_never_reaches_crash_reports() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    let secret = fresh_secret();
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some(&secret),
    ));
    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));

    // Crash mid-call after printing the secret: the error carries the tail.
    let e = fails(&run(&ws, &keys, &["tool", "call", "sec/leak"], None, None));
    assert!(e.contains("upstream said 401 for token ••••"), "{e}");
    assert!(
        e.contains("log says ••••"),
        "the log.error line is scrubbed too: {e}"
    );
    assert!(!e.contains(&secret), "{e}");

    // Crash during initialize, under a running serve, until it gives up:
    // the failure reason (kept in the store, shown by `plugin show`) is scrubbed.
    let serve = Serve::start_with_env(
        &ws,
        &[
            ("HOME", keys.home().to_str().unwrap()),
            ("PLUGD_KEY_FILE", keys.key_file().to_str().unwrap()),
        ],
    );
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "crash_at_init", "true"],
        None,
        None,
    ));
    let r = serve.post("/v1/tools/sec/show_config:invoke", &json!({"args": {}}));
    let body = r.json().to_string();
    assert!(!body.contains(&secret), "{body}");
    assert!(body.contains("login refused for key ••••"), "{body}");
    let mut shown = String::new();
    for _ in 0..200 {
        shown = ok(&run(&ws, &keys, &["plugin", "show", "sec"], None, None));
        if shown.contains("state:     failed") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(shown.contains("state:     failed"), "{shown}");
    assert!(shown.contains("login refused for key ••••"), "{shown}");
    assert!(!shown.contains(&secret), "{shown}");
    let (_, log) = serve.stop();
    assert!(
        !log.contains(&secret),
        "the serve log holds the secret:\n{log}"
    );
}

/// A native plugin (Python stdlib) that reports the `config` its
/// `initialize` carried.
const NATIVE_PY: &str = r#"
import json, os, sys
config = None
for line in sys.stdin:
    msg = json.loads(line)
    m, rid = msg.get("method"), msg.get("id")
    p = msg.get("params") or {}
    if m == "initialize":
        config = p.get("config")
        r = {"manifest": {"plugin": {"id": "nat", "version": "0.1.0"}}, "server_version": "nat-0.1.0",
             "tools": [{"name": "nat_config", "description": "config", "input_schema": {"type": "object"}}]}
    elif m == "tool.invoke":
        r = {"config": config, "pid": os.getpid()}
    elif m == "shutdown":
        r = {}
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid, "result": r}) + "\n")
    sys.stdout.flush()
    if m == "shutdown":
        break
"#;

/// The native plugin `nat` with a JSON Schema config (one secret).
fn native_plugin(ws: &Ws) {
    let dir = ws.plugin_dir("nat");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin.py"), NATIVE_PY).unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"nat\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"plugin.py\"]\n\n[plugin.extends]\ntools = [\"nat_config\"]\n\n[plugin.config_schema]\ntype = \"object\"\nrequired = [\"token\"]\n[plugin.config_schema.properties.token]\ntype = \"string\"\nwriteOnly = true\n[plugin.config_schema.properties.level]\ntype = \"integer\"\nminimum = 1\ndefault = 1\n",
    )
    .unwrap();
}

#[test]
fn a_config_change_reaches_a_running_serve() {
    let ws = Ws::new();
    let keys = Keys::new();
    salmex_plugin(&ws, "sec");
    native_plugin(&ws);
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "api_key", "-"],
        None,
        Some("k-1"),
    ));
    ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "nat", "set", "token", "-"],
        None,
        Some("t-1"),
    ));
    let e = fails(&run(
        &ws,
        &keys,
        &["plugin", "config", "nat", "set", "level", "0"],
        None,
        None,
    ));
    assert!(e.contains("\"0\" is not valid for \"level\""), "{e}");
    ok(&run(&ws, &keys, &["plugin", "approve", "sec"], None, None));
    ok(&run(&ws, &keys, &["plugin", "approve", "nat"], None, None));

    let serve = Serve::start_with_env(
        &ws,
        &[
            ("HOME", keys.home().to_str().unwrap()),
            ("PLUGD_KEY_FILE", keys.key_file().to_str().unwrap()),
        ],
    );
    let call = |name: &str| {
        let r = serve.post(&format!("/v1/tools/{name}:invoke"), &json!({"args": {}}));
        assert_eq!(r.status, 200, "{}", r.json());
        r.json()
    };
    let salmex = |v: Value| -> Value {
        serde_json::from_str(v["content"][0]["text"].as_str().unwrap_or("{}"))
            .unwrap_or_else(|_| v.clone())
    };
    let before = salmex(call("sec/show_config"));
    assert_eq!(before["changes"], 0, "{before}");
    let nat_before = call("nat_config");
    assert_eq!(
        nat_before["config"],
        json!({"token": "t-1", "level": 1}),
        "{nat_before}"
    );

    // Salmex: config/changed to the same process.
    let out = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "sec", "set", "units", "imperial"],
        None,
        None,
    ));
    assert!(
        out.contains("the running plugin got config/changed (via plugd serve pid"),
        "{out}"
    );
    let after = salmex(call("sec/show_config"));
    assert_eq!(after["pid"], before["pid"], "{after}");
    assert_eq!(after["changes"], 1, "{after}");
    assert_eq!(after["config"]["units"], "imperial");
    assert_eq!(after["config"]["api_key"], "k-1");

    // Native: restarted with the new settings.
    let out = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "nat", "set", "level", "5"],
        None,
        None,
    ));
    assert!(
        out.contains("the plugin was restarted with it (via plugd serve pid"),
        "{out}"
    );
    let nat_after = call("nat_config");
    assert_eq!(
        nat_after["config"],
        json!({"token": "t-1", "level": 5}),
        "{nat_after}"
    );
    assert_ne!(
        nat_after["pid"], nat_before["pid"],
        "{nat_before} {nat_after}"
    );
    serve.stop();
}

#[test]
fn a_vai_invocation_gets_only_its_exports_secret_slots_and_config() {
    let ws = Ws::new();
    let keys = Keys::new();
    let dir = ws.plugin_dir("vx");
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    let m = r#"api_version = "vai.plugin.v1"
package_id = "test/vx"
version = "0.1.0"

[runtime]
protocol = "vai.rpc.v1"
transport = "stdio"
entrypoint = ["python3", "plugin.py", "good", "test/vx", "0.1.0"]

[[exports]]
id = "echo"
kind = "tool"
config_schema = "schemas/echo_config.json"
[exports.permissions]
secret_slots = ["jira_token", "unbound"]
[exports.tool]
input_schema = "schemas/any.json"

[[exports]]
id = "pid"
kind = "tool"
[exports.permissions]
secret_slots = ["slack_webhook"]
[exports.tool]
input_schema = "schemas/any.json"
"#;
    std::fs::write(dir.join("vai-plugin.toml"), m).unwrap();
    std::fs::write(
        dir.join("schemas/echo_config.json"),
        r#"{"type":"object","required":["base_url"],"properties":{"base_url":{"type":"string"},"max_results":{"type":"integer","minimum":1,"default":10}}}"#,
    )
    .unwrap();
    let show = ok(&run(
        &ws,
        &keys,
        &["plugin", "config", "test/vx", "show"],
        None,
        None,
    ));
    assert!(
        show.contains("secret_slots.jira_token") && show.contains("secret_slots.slack_webhook"),
        "{show}"
    );
    ok(&run(
        &ws,
        &keys,
        &[
            "plugin",
            "config",
            "test/vx",
            "set",
            "secret_slots.jira_token",
            "-",
        ],
        None,
        Some("jira-s3cret"),
    ));
    ok(&run(
        &ws,
        &keys,
        &[
            "plugin",
            "config",
            "test/vx",
            "set",
            "secret_slots.slack_webhook",
            "-",
        ],
        None,
        Some("slack-s3cret"),
    ));
    let e = fails(&run(
        &ws,
        &keys,
        &["plugin", "approve", "test/vx"],
        None,
        None,
    ));
    assert!(
        e.contains("required setting \"echo.base_url\" is not set; set it with `plugd plugin config test/vx set echo.base_url VALUE`"),
        "{e}"
    );
    let e = fails(&run(
        &ws,
        &keys,
        &[
            "plugin",
            "config",
            "test/vx",
            "set",
            "echo.max_results",
            "0",
        ],
        None,
        None,
    ));
    assert!(
        e.contains("\"0\" is not valid for \"echo.max_results\""),
        "{e}"
    );
    ok(&run(
        &ws,
        &keys,
        &[
            "plugin",
            "config",
            "test/vx",
            "set",
            "echo.base_url",
            "https://jira.example",
        ],
        None,
        None,
    ));
    ok(&run(
        &ws,
        &keys,
        &["plugin", "approve", "test/vx"],
        None,
        None,
    ));
    let out = ok(&run(
        &ws,
        &keys,
        &["tool", "call", "test/vx/echo", "--args", "{}", "--json"],
        None,
        None,
    ));
    let v: Value = serde_json::from_str(&out).unwrap();
    let ctx = &v["structured_output"]["context"];
    assert_eq!(ctx["secrets"], json!({"jira_token": "jira-s3cret"}), "{v}");
    assert!(!out.contains("slack-s3cret"), "{out}");
    assert_eq!(
        ctx["config"],
        json!({"base_url": "https://jira.example", "max_results": 10}),
        "{v}"
    );
}

/// An LLM provider's key as an operator secret: `plugd secrets set NAME`
/// reads it from stdin and seals it; plugd.yaml names it with
/// `api_key_secret:`; a nexo plugin's `llm.complete {provider}` reaches the
/// endpoint with it as the bearer token. The plaintext is in no file of the
/// workspace, and a missing secret is an error saying how to set it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_key_is_an_operator_secret_sealed_at_rest() {
    let (base, seen) = crate::llm::double().await;
    let ws = Ws::new();
    let keys = Keys::new();
    crate::broker::services_plugin(&ws, "keyed", &["broker"], None);
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        format!(
            "llm_providers:\n  minimax:\n    provider: openai\n    base_url: \"{base}\"\n    model: m\n    api_key_secret: acme/minimax\n"
        ),
    )
    .unwrap();
    ok(&run(
        &ws,
        &keys,
        &["plugin", "approve", "keyed"],
        None,
        None,
    ));
    let complete = |ws: &Ws| {
        run(
            ws,
            &keys,
            &[
                "tool",
                "call",
                "keyed_complete",
                "--args",
                r#"{"prompt":"hi","provider":"minimax"}"#,
            ],
            None,
            None,
        )
    };
    let before = complete(&ws);
    let all = stdout(&before) + &stderr(&before);
    assert!(
        all.contains("plugd secrets set acme/minimax"),
        "a missing secret says how to set it: {all}"
    );
    const KEY: &str = "sk-test-Q7mZp2";
    ok(&run(
        &ws,
        &keys,
        &["secrets", "set", "acme/minimax"],
        None,
        Some(&format!("{KEY}\n")),
    ));
    let listed: Value = serde_json::from_str(&ok(&run(
        &ws,
        &keys,
        &["secrets", "list", "--json"],
        None,
        None,
    )))
    .unwrap();
    assert_eq!(listed, json!(["acme/minimax"]));
    let out = ok(&complete(&ws));
    assert!(out.contains("echo: hi"), "{out}");
    let auth = seen.lock().unwrap().auth().to_vec();
    assert_eq!(
        auth.last(),
        Some(&Some(format!("Bearer {KEY}"))),
        "{auth:?}"
    );
    assert!(!out.contains(KEY));
    // Sealed at rest: not in any file of the workspace state.
    for entry in walk(&ws.dir().join(".plugd")) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "{} holds the key in clear",
            entry.display()
        );
    }
    // Hostile names are refused before anything is stored.
    for bad in ["../x", "a/b/c", ".hidden"] {
        let o = run(&ws, &keys, &["secrets", "set", bad], None, Some("v"));
        assert!(
            !o.status.success() && stderr(&o).contains("not a secret name"),
            "{bad}: {}",
            stderr(&o)
        );
    }
    ok(&run(
        &ws,
        &keys,
        &["secrets", "unset", "acme/minimax"],
        None,
        None,
    ));
    let after = complete(&ws);
    assert!(!after.status.success());
}

/// Every regular file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}
