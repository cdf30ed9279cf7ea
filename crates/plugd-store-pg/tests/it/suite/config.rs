//! Plugin configuration and secrets on both backends: plain values, sealed
//! boxes stored byte for byte, reseal (rotation) in one transaction, two
//! connections rotating at once, org secrets.

use std::sync::Arc;

use plugd_control::store::{Rotation, Sealed, StateStore, StoreError};
use plugd_store::secrets::{ConfigWrite, MasterKey, StoredValue};
use serde_json::json;

use super::backends;

/// Seals `value` with `k` and stores it, as `plugd config set` does.
async fn set_secret(
    s: &Arc<dyn StateStore>,
    plugin: &str,
    key: &str,
    value: &str,
    k: &MasterKey,
) -> Result<(), StoreError> {
    let sealed = k.seal(plugin, key, value.as_bytes())?;
    s.put_sealed(plugin, key, &sealed).await
}

/// Re-seals every secret from `old` to `new`, as `plugd secrets rotate` does.
async fn rotate(
    s: &Arc<dyn StateStore>,
    old: &MasterKey,
    new: &MasterKey,
) -> Result<Rotation, StoreError> {
    let reseal = |plugin: &str, key: &str, sealed: &Sealed| -> Result<Sealed, StoreError> {
        let plain = old.open(plugin, key, sealed)?;
        Ok(new.seal(plugin, key, plain.as_bytes())?)
    };
    s.reseal_secrets(old.id(), new.id(), &reseal).await
}

fn key(b: u8) -> MasterKey {
    MasterKey::from_bytes([b; 32], format!("test key {b}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_and_rotation_moves_every_secret() {
    for be in backends().await {
        let s = &be.a;
        let (a, b) = (key(1), key(2));
        s.config_set_plain("p", "units", &json!("metric"))
            .await
            .unwrap();
        set_secret(s, "p", "api_key", "sekrit", &a).await.unwrap();
        set_secret(s, "q", "token", "t0k", &a).await.unwrap();
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
        set_secret(s, "q", "token", "t0k", &a).await.unwrap();
        let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").await.unwrap()
        else {
            panic!("not sealed");
        };
        assert_eq!(sealed.key_id, a.id());
        assert_ne!(sealed.ciphertext, b"sekrit", "never plaintext");
        let r = rotate(s, &a, &b).await.unwrap();
        assert_eq!(r.resealed, 2);
        let Some(StoredValue::Secret(sealed)) = s.config_value("p", "api_key").await.unwrap()
        else {
            panic!("not sealed");
        };
        assert_eq!(b.open("p", "api_key", &sealed).unwrap().as_str(), "sekrit");
        assert!(a.open("p", "api_key", &sealed).is_err());
        assert!(
            rotate(s, &a, &key(3)).await.is_err(),
            "the wrong old key changes nothing"
        );
        assert_eq!(s.secret_key_ids().await.unwrap(), vec![b.id().to_owned()]);
        assert!(s.config_unset("p", "api_key").await.unwrap());
        assert!(!s.config_unset("p", "api_key").await.unwrap());
        assert!(s.config_set_plain("", "k", &json!(1)).await.is_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_sealed_on_sqlite_opens_from_either_backend() {
    let a = key(7);
    let sqlite = plugd_store::Store::open_in_memory().unwrap();
    sqlite
        .config_set_secret("acme/kit", "api_key", "s3cret", &a)
        .unwrap();
    let Some(StoredValue::Secret(sealed)) = sqlite.config_value("acme/kit", "api_key").unwrap()
    else {
        panic!("not sealed");
    };
    for be in backends().await {
        let pg = &be.a;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_all_applies_every_change_together() {
    for be in backends().await {
        let s = &be.a;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_rotating_at_once_leave_one_key() {
    for be in backends().await {
        let (x, y) = (&be.a, &be.b);
        let (a, b) = (key(1), key(2));
        for n in 0..20 {
            set_secret(x, &format!("p{n}"), "k", "v", &a).await.unwrap();
        }
        let (r1, r2) = tokio::join!(rotate(x, &a, &b), rotate(y, &a, &b));
        assert_eq!(
            usize::from(r1.is_ok()) + usize::from(r2.is_ok()),
            1,
            "{r1:?} {r2:?}"
        );
        assert_eq!(x.secret_key_ids().await.unwrap(), vec![b.id().to_owned()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_secrets_are_kept_apart_per_org() {
    for be in backends().await {
        let s = &be.a;
        let a = key(7);
        set_secret(s, "@org:org_a", "jira_token", "s3cret", &a)
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
}
