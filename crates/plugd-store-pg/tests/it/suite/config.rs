//! Plugin configuration and secrets on PostgreSQL: sealed boxes stored as
//! SQLite stores them, rotation in one transaction, two nodes rotating at once.

use plugd_store::secrets::{ConfigWrite, MasterKey, StoredValue};
use serde_json::json;

use crate::{fresh_store, two_nodes};

fn key(b: u8) -> MasterKey {
    MasterKey::from_bytes([b; 32], format!("test key {b}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_and_rotation_moves_every_secret() {
    let s = fresh_store().await;
    let (a, b) = (key(1), key(2));
    s.config_set_plain("p", "units", &json!("metric"))
        .await
        .unwrap();
    s.config_set_secret("p", "api_key", "sekrit", &a)
        .await
        .unwrap();
    s.config_set_secret("q", "token", "t0k", &a).await.unwrap();
    let vals = s.config_values("p").await.unwrap();
    assert_eq!(vals.len(), 2);
    assert_eq!(
        vals[1],
        ("units".to_owned(), StoredValue::Plain(json!("metric")))
    );
    // A key switches between plain and secret in place.
    s.config_set_plain("q", "token", &json!(1)).await.unwrap();
    assert_eq!(
        s.config_value("q", "token").await.unwrap(),
        Some(StoredValue::Plain(json!(1)))
    );
    s.config_set_secret("q", "token", "t0k", &a).await.unwrap();
    let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").await.unwrap() else {
        panic!("not sealed");
    };
    assert_eq!(sealed.key_id, a.id());
    assert_ne!(sealed.ciphertext, b"sekrit", "never plaintext");
    let r = s.rotate_secrets(&a, &b).await.unwrap();
    assert_eq!(r.resealed, 2);
    let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").await.unwrap() else {
        panic!("not sealed");
    };
    assert_eq!(b.open("p", "api_key", &sealed).unwrap().as_str(), "sekrit");
    assert!(a.open("p", "api_key", &sealed).is_err());
    assert!(
        s.rotate_secrets(&a, &key(3)).await.is_err(),
        "the wrong old key changes nothing"
    );
    assert_eq!(s.secret_key_ids().await.unwrap(), vec![b.id().to_owned()]);
    assert!(
        s.rotate_secrets(&b, &key(2)).await.is_err(),
        "the same key is refused"
    );
    assert!(s.config_unset("p", "api_key").await.unwrap());
    assert!(!s.config_unset("p", "api_key").await.unwrap());
    assert!(s.config_set_plain("", "k", &json!(1)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_sealed_on_sqlite_opens_from_postgres() {
    let a = key(7);
    let sqlite = plugd_store::Store::open_in_memory().unwrap();
    sqlite
        .config_set_secret("acme/kit", "api_key", "s3cret", &a)
        .unwrap();
    let Some(StoredValue::Secret(sealed)) = sqlite.config_value("acme/kit", "api_key").unwrap()
    else {
        panic!("not sealed");
    };
    let pg = fresh_store().await;
    pg.put_sealed("acme/kit", "api_key", &sealed).await.unwrap();
    let Some(StoredValue::Secret(back)) = pg.config_value("acme/kit", "api_key").await.unwrap()
    else {
        panic!("not sealed");
    };
    assert_eq!(back, sealed, "the same bytes");
    assert_eq!(
        a.open("acme/kit", "api_key", &back).unwrap().as_str(),
        "s3cret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_all_applies_every_change_together() {
    let s = fresh_store().await;
    let a = key(1);
    s.config_set_plain("p", "old", &json!(1)).await.unwrap();
    let sealed = a.seal("p", "pw", b"x").unwrap();
    s.config_write_all(
        "p",
        &[
            ("units".into(), ConfigWrite::Plain(json!("si"))),
            ("pw".into(), ConfigWrite::Sealed(sealed.clone())),
            ("old".into(), ConfigWrite::Unset),
        ],
    )
    .await
    .unwrap();
    let keys: Vec<String> = s
        .config_values("p")
        .await
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["pw", "units"]);
    assert!(
        s.config_write_all(
            "p",
            &[
                ("ok".into(), ConfigWrite::Plain(json!(1))),
                ("".into(), ConfigWrite::Unset)
            ]
        )
        .await
        .is_err()
    );
    assert_eq!(
        s.config_value("p", "ok").await.unwrap(),
        None,
        "nothing of a refused batch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_rotating_at_once_leave_one_key() {
    let (x, y) = two_nodes().await;
    let (a, b) = (key(1), key(2));
    for n in 0..20 {
        x.config_set_secret(&format!("p{n}"), "k", "v", &a)
            .await
            .unwrap();
    }
    let (r1, r2) = tokio::join!(x.rotate_secrets(&a, &b), y.rotate_secrets(&a, &b));
    assert_eq!(
        usize::from(r1.is_ok()) + usize::from(r2.is_ok()),
        1,
        "{r1:?} {r2:?}"
    );
    assert_eq!(x.secret_key_ids().await.unwrap(), vec![b.id().to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_secrets_are_kept_apart_per_org() {
    let s = fresh_store().await;
    let a = key(7);
    s.config_set_secret("@org:org_a", "jira_token", "s3cret", &a)
        .await
        .unwrap();
    assert_eq!(s.org_secret_names("org_a").await.unwrap(), ["jira_token"]);
    assert!(s.org_secret_names("org_b").await.unwrap().is_empty());
    assert!(s.org_secret_exists("org_a", "jira_token").await.unwrap());
    assert!(!s.org_secret_exists("org_b", "jira_token").await.unwrap());
    assert!(s.org_secret_set("bad org", "x", "v").await.is_err());
    assert!(s.org_secret_delete("org_a", "jira_token").await.unwrap());
    assert!(!s.org_secret_exists("org_a", "jira_token").await.unwrap());
}
