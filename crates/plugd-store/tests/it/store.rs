//! Tests of `Store` on its files: persistence, migrations, damaged files, two stores on one file (approvals and failures run on both backends in plugd-store-pg's store suite).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use plugd_store::{Approval, SCHEMA_VERSION, STATE_DB_FILE, Store, StoreError, now_rfc3339};
use serde_json::json;

fn approval(id: &str, digest: &str) -> Approval {
    Approval {
        plugin_id: id.to_owned(),
        digest: digest.to_owned(),
        approved_by: "alice".to_owned(),
        approved_at: now_rfc3339(),
        catalog: json!([{"name": "echo"}]),
    }
}

fn user_version(db: &Path) -> i64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

#[test]
fn state_survives_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ws/.plugd");
    let a = approval("p", "sha256:aa");
    {
        let store = Store::open(&dir).unwrap();
        assert_eq!(store.path(), Some(dir.join(STATE_DB_FILE).as_path()));
        store.approve(&a).unwrap();
        store.mark_failed("q", "gave up").unwrap();
    }
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.approval("p").unwrap(), Some(a));
    assert_eq!(store.failure("q").unwrap().unwrap().reason, "gave up");
}

#[test]
fn open_creates_private_dir_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".plugd");
    Store::open(&dir).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(STATE_DB_FILE)), 0o600);
}

#[test]
fn open_is_idempotent_and_sets_schema_version() {
    let tmp = tempfile::tempdir().unwrap();
    for _ in 0..3 {
        Store::open(tmp.path()).unwrap();
    }
    assert_eq!(
        user_version(&tmp.path().join(STATE_DB_FILE)),
        SCHEMA_VERSION
    );
}

#[test]
fn open_upgrades_a_version_1_database() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join(STATE_DB_FILE);
    {
        // Exactly what schema version 1 created, with one approval in it.
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE approvals (
                plugin_id   TEXT PRIMARY KEY NOT NULL,
                digest      TEXT NOT NULL,
                approved_by TEXT NOT NULL,
                approved_at TEXT NOT NULL,
                catalog     TEXT NOT NULL DEFAULT '[]'
            ) STRICT;
            INSERT INTO approvals VALUES ('old', 'sha256:aa', 'carol', '2024-05-01T10:00:00Z', '[{\"name\":\"t\"}]');
            PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let store = Store::open(tmp.path()).unwrap();
    let old = store.approval("old").unwrap().unwrap();
    assert_eq!(old.approved_by, "carol");
    assert_eq!(old.catalog, json!([{"name": "t"}]));
    store.mark_failed("old", "gave up").unwrap();
    drop(store);
    assert_eq!(user_version(&db), SCHEMA_VERSION);
}

#[test]
fn database_from_a_newer_plugd_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join(STATE_DB_FILE);
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = Store::open(tmp.path()).unwrap_err();
    assert!(
        matches!(err, StoreError::TooNew { found: 99, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&db.display().to_string()) && msg.contains("99"),
        "{msg}"
    );
}

#[test]
fn garbage_state_db_is_a_clear_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join(STATE_DB_FILE);
    std::fs::write(&db, "this is not a database, just some text\n".repeat(200)).unwrap();
    let err = Store::open(tmp.path()).unwrap_err();
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&db.display().to_string()), "{msg}");
    assert!(msg.contains("not a usable plugd state database"), "{msg}");
}

#[test]
fn damaged_sqlite_state_db_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join(STATE_DB_FILE);
    // A real SQLite header followed by junk pages.
    let mut bytes = b"SQLite format 3\0".to_vec();
    bytes.extend(std::iter::repeat_n(0xA5u8, 8192));
    std::fs::write(&db, bytes).unwrap();
    let err = Store::open(tmp.path()).unwrap_err();
    assert!(err.to_string().contains(&db.display().to_string()), "{err}");
}

#[test]
fn state_dir_that_is_a_file_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join(".plugd");
    std::fs::write(&file, "x").unwrap();
    let err = Store::open(&file).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains(".plugd"), "{err}");
}

#[test]
fn damaged_catalog_row_names_the_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    Store::open(tmp.path()).unwrap();
    rusqlite::Connection::open(tmp.path().join(STATE_DB_FILE))
        .unwrap()
        .execute_batch(
            "INSERT INTO approvals VALUES ('bad', 'sha256:aa', 'x', '2024-01-01T00:00:00Z', '{nope');",
        )
        .unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let err = store.approval("bad").unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("\"bad\""), "{err}");
    assert!(store.approvals().is_err());
}

#[test]
fn two_stores_on_one_file_and_many_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let one = Arc::new(Store::open(tmp.path()).unwrap());
    let two = Store::open(tmp.path()).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&one);
            std::thread::spawn(move || {
                for i in 0..10 {
                    store
                        .approve(&approval(&format!("p{t}-{i}"), "sha256:aa"))
                        .unwrap();
                }
            })
        })
        .collect();
    for i in 0..10 {
        two.mark_failed(&format!("q{i}"), "x").unwrap();
    }
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(two.approvals().unwrap().len(), 40);
    assert!(one.failure("q9").unwrap().is_some());
}
