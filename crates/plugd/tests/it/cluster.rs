//! `plugd cluster init --state URL` and `plugd state export --to URL` as
//! real child processes against a real PostgreSQL 15 (`TestPg`): the key
//! file created on first use, a second init refused by name, `PLUGD_STATE`,
//! a workspace exported once (counts printed, secret still opening with the
//! cluster's key), a second export and an uninitialised target refused.

use std::path::Path;
use std::process::Output;

use plugd_store::Store;
use plugd_store::secrets::{KeySource, StoredValue};
use plugd_store_pg::test_pg::TestPg;
use plugd_store_pg::{PgOptions, PgStore};

use crate::support::{Ws, ok, plugd_cmd, stderr, stdout};

/// Runs plugd on `ws` with its own HOME and key file under `keys`.
fn plugd(ws: &Ws, keys: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = plugd_cmd(ws.dir());
    cmd.env("HOME", keys.join("home"))
        .env("XDG_CONFIG_HOME", keys.join("config"))
        .env("PLUGD_KEY_FILE", keys.join("master.key"))
        .env_remove("PLUGD_MASTER_KEY")
        .env_remove("PLUGD_STATE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(args).output().unwrap()
}

#[test]
fn cluster_init_creates_the_key_and_refuses_a_second_init() {
    let ws = Ws::new();
    let keys = tempfile::tempdir().unwrap();
    let url = TestPg::shared().fresh_database();

    // PLUGD_STATE stands in for --state.
    let out = plugd(
        &ws,
        keys.path(),
        &[("PLUGD_STATE", &url)],
        &["cluster", "init"],
    );
    let text = ok(&out);
    let key = KeySource::File(keys.path().join("master.key"))
        .require()
        .unwrap();
    let cluster_id = text
        .split_whitespace()
        .nth(1)
        .filter(|w| w.starts_with("cluster_"))
        .unwrap_or_else(|| panic!("no cluster id in {text}"))
        .to_owned();
    assert!(text.contains(&format!("master key {}", key.id())), "{text}");
    assert!(text.contains("master.key (created now)"), "{text}");
    assert!(
        text.contains("every node needs this same master key"),
        "{text}"
    );

    let out = plugd(&ws, keys.path(), &[], &["cluster", "init", "--state", &url]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("already initialised"), "{err}");
    assert!(err.contains(&cluster_id), "{err}");

    // Neither the flag nor the variable: a usage error.
    let out = plugd(&ws, keys.path(), &[], &["cluster", "init"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--state"), "{}", stderr(&out));
}

#[test]
fn a_workspace_exports_once_into_an_initialised_cluster() {
    let ws = Ws::new();
    let keys = tempfile::tempdir().unwrap();
    let pg = TestPg::shared();
    let url = pg.fresh_database();

    // Not initialised yet: refused before anything is written.
    {
        let store = Store::open(&ws.dir().join(".plugd")).unwrap();
        store
            .kv_set("database", "k", &serde_json::json!(1))
            .unwrap();
    }
    let out = plugd(&ws, keys.path(), &[], &["state", "export", "--to", &url]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("run `plugd cluster init --state URL` first"),
        "{}",
        stderr(&out)
    );

    ok(&plugd(
        &ws,
        keys.path(),
        &[],
        &["cluster", "init", "--state", &url],
    ));
    let key = KeySource::File(keys.path().join("master.key"))
        .require()
        .unwrap();
    {
        let store = Store::open(&ws.dir().join(".plugd")).unwrap();
        store
            .config_set_secret("acme", "api_key", "s3cret", &key)
            .unwrap();
        store
            .config_set_plain("acme", "units", &serde_json::json!("si"))
            .unwrap();
    }
    let out = plugd(&ws, keys.path(), &[], &["state", "export", "--to", &url]);
    let text = ok(&out);
    assert!(text.starts_with("exported "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["plugin_config", "2"]),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["agent_kv", "1"]),
        "{text}"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let node = PgStore::open_node(&url, &PgOptions::default(), key.id())
            .await
            .unwrap();
        let Some(StoredValue::Secret(sealed)) = node.config_value("acme", "api_key").await.unwrap()
        else {
            panic!("not sealed");
        };
        assert_eq!(
            key.open("acme", "api_key", &sealed).unwrap().as_str(),
            "s3cret"
        );
    });

    let out = plugd(&ws, keys.path(), &[], &["state", "export", "--to", &url]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("is not empty (table agent_kv has 1 rows)"),
        "{}",
        stderr(&out)
    );
}
