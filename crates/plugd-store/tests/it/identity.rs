//! The state identity marker: a fresh workspace gets one, an old database is
//! adopted, and a database the marker vouches for is never silently recreated.

use plugd_store::identity::{self, STATE_ID_FILE};
use plugd_store::{Approval, STATE_DB_FILE, Store, StoreError};

fn approval(id: &str) -> Approval {
    Approval {
        plugin_id: id.into(),
        digest: "sha256:00".into(),
        approved_by: "t".into(),
        approved_at: "2026-01-01T00:00:00Z".into(),
        catalog: serde_json::json!([]),
    }
}

#[test]
fn a_fresh_workspace_gets_a_marker_matching_its_database() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    store.approve(&approval("a")).unwrap();
    drop(store);
    let marker = identity::read_marker(tmp.path()).unwrap().expect("marker");
    assert_eq!(marker.id.len(), 32);
    // Reopening checks and keeps it.
    let store = Store::open(tmp.path()).unwrap();
    assert_eq!(store.approvals().unwrap().len(), 1);
    assert_eq!(identity::read_marker(tmp.path()).unwrap(), Some(marker));
}

#[test]
fn a_database_older_than_the_marker_is_adopted() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    store.approve(&approval("a")).unwrap();
    drop(store);
    // As if written by a plugd before the marker existed.
    std::fs::remove_file(tmp.path().join(STATE_ID_FILE)).unwrap();
    let store = Store::open(tmp.path()).unwrap();
    assert_eq!(store.approvals().unwrap().len(), 1);
    assert!(identity::read_marker(tmp.path()).unwrap().is_some());
}

#[test]
fn a_missing_database_is_refused_and_not_created() {
    let tmp = tempfile::tempdir().unwrap();
    drop(Store::open(tmp.path()).unwrap());
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(tmp.path().join(f));
    }
    let err = Store::open(tmp.path()).unwrap_err();
    assert!(matches!(err, StoreError::Lost(_)), "{err:?}");
    assert!(err.to_string().contains("is missing"), "{err}");
    assert!(!tmp.path().join(STATE_DB_FILE).exists());
}

#[test]
fn a_blank_sqlite_database_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    drop(Store::open(tmp.path()).unwrap());
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(tmp.path().join(f));
    }
    // A valid SQLite file with nothing of plugd's in it.
    let other = tempfile::tempdir().unwrap();
    let blank = other.path().join("blank.db");
    let conn = rusqlite::Connection::open(&blank).unwrap();
    conn.execute_batch("CREATE TABLE t (x INTEGER);").unwrap();
    drop(conn);
    std::fs::copy(&blank, tmp.path().join(STATE_DB_FILE)).unwrap();
    let err = Store::open(tmp.path()).unwrap_err();
    assert!(err.to_string().contains("blank database"), "{err}");
}

#[test]
fn reset_moves_everything_aside_and_the_next_open_starts_over() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    store.approve(&approval("a")).unwrap();
    drop(store);
    let before = identity::read_marker(tmp.path()).unwrap().unwrap();
    std::fs::write(tmp.path().join(STATE_DB_FILE), b"").unwrap();
    assert!(Store::open(tmp.path()).is_err());
    let (aside, moved) = identity::reset(tmp.path()).unwrap().unwrap();
    assert!(moved.contains(&"state.db".to_owned()) && moved.contains(&"state.id".to_owned()));
    assert!(aside.join("state.id").exists());
    let store = Store::open(tmp.path()).unwrap();
    assert!(store.approvals().unwrap().is_empty());
    let after = identity::read_marker(tmp.path()).unwrap().unwrap();
    assert_ne!(before.id, after.id);
}
