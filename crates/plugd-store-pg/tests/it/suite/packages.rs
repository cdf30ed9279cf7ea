//! Packages and bindings on PostgreSQL: the SQLite store's behaviour, and
//! two nodes installing at once.

use std::collections::BTreeMap;

use plugd_control::bindings::{Binding, BindingFilter, BindingStatus, Rollout, Scope};
use plugd_control::packages::{Inserted, Package, latest};
use plugd_control::store::StoreError;
use serde_json::json;

use super::backends;

use plugd_control::samples::package as pkg;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_round_trip_and_both_keys_stay_unique() {
    for be in backends().await {
        let store = &be.a;
        let a = pkg("0.1.0", 1);
        assert_eq!(store.insert_package(&a).await.unwrap(), Inserted::New);
        assert_eq!(store.package(&a.digest).await.unwrap().as_ref(), Some(&a));
        let untreed = Package {
            tree_digest: None,
            ..pkg("0.0.1", 9)
        };
        store.insert_package(&untreed).await.unwrap();
        assert_eq!(store.package(&untreed.digest).await.unwrap(), Some(untreed));
        assert_eq!(
            store.insert_package(&a).await.unwrap(),
            Inserted::Existing(a.clone())
        );
        let clash = pkg("0.1.0", 2);
        assert_eq!(
            store.insert_package(&clash).await.unwrap(),
            Inserted::VersionTaken(a.clone())
        );
        assert_eq!(store.package(&clash.digest).await.unwrap(), None);
        let b = pkg("0.2.0", 3);
        assert_eq!(store.insert_package(&b).await.unwrap(), Inserted::New);
        assert_eq!(store.packages().await.unwrap().len(), 3);
        let versions = store.package_versions("acme/devkit").await.unwrap();
        assert_eq!(versions.len(), 3);
        assert_eq!(latest(versions), Some(b.clone()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_installing_at_once_store_one_row() {
    for be in backends().await {
        let (x, y) = (&be.a, &be.b);
        for n in 0..10u8 {
            // The same package on both nodes.
            let same = pkg(&format!("1.0.{n}"), 2 * n + 10);
            let (a, b) = tokio::join!(x.insert_package(&same), y.insert_package(&same));
            let mut got = [a.unwrap(), b.unwrap()];
            got.sort_by_key(|i| !matches!(i, Inserted::New));
            assert_eq!(
                got,
                [Inserted::New, Inserted::Existing(same.clone())],
                "round {n}"
            );
            // Two digests claiming one version.
            let (p, q) = (
                pkg(&format!("2.0.{n}"), 2 * n + 50),
                pkg(&format!("2.0.{n}"), 2 * n + 51),
            );
            let (a, b) = tokio::join!(x.insert_package(&p), y.insert_package(&q));
            let (a, b) = (a.unwrap(), b.unwrap());
            match (&a, &b) {
                (Inserted::New, Inserted::VersionTaken(w)) => assert_eq!(w, &p),
                (Inserted::VersionTaken(w), Inserted::New) => assert_eq!(w, &q),
                other => panic!("round {n}: {other:?}"),
            }
        }
    }
}

fn binding(id: &str, org: &str, export: &str) -> Binding {
    Binding {
        binding_id: id.into(),
        package_id: "acme/devkit".into(),
        package_version: "0.1.0".into(),
        export_id: export.into(),
        scope: Scope {
            org_id: org.into(),
            project_id: None,
        },
        config: json!({"max_results": 10}),
        secrets: BTreeMap::from([("t".to_owned(), format!("secret://{org}/t"))]),
        status: BindingStatus::Active,
        rollout: Rollout::default(),
        created_at: "2026-01-01T00:00:00Z".into(),
        updated_at: "2026-01-01T00:00:00Z".into(),
        created_by: "cli".into(),
        gateway_api_scopes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_round_trip_filter_and_update() {
    for be in backends().await {
        let store = &be.a;
        let a = binding("bind_a", "org_a", "jira_search");
        let b = binding("bind_b", "org_b", "jira_search");
        let c = binding("bind_c", "org_a", "slack_notify");
        for x in [&a, &b, &c] {
            store.insert_binding(x).await.unwrap();
        }
        assert!(matches!(
            store.insert_binding(&a).await,
            Err(StoreError::Conflict(_))
        ));
        assert_eq!(
            store.binding(&a.binding_id).await.unwrap().as_ref(),
            Some(&a)
        );
        assert_eq!(store.binding("bind_none").await.unwrap(), None);
        assert_eq!(
            store
                .bindings(&BindingFilter::default())
                .await
                .unwrap()
                .len(),
            3
        );
        let org_a = BindingFilter {
            org_id: Some("org_a".into()),
            ..BindingFilter::default()
        };
        assert_eq!(store.bindings(&org_a).await.unwrap().len(), 2);
        let jira_a = BindingFilter {
            export_id: Some("jira_search".into()),
            ..org_a.clone()
        };
        assert_eq!(store.bindings(&jira_a).await.unwrap(), vec![a.clone()]);
        let mut changed = a.clone();
        changed.status = BindingStatus::Disabled;
        changed.rollout.traffic_percent = 10;
        assert!(store.update_binding(&changed).await.unwrap());
        let active_a = BindingFilter {
            status: Some(BindingStatus::Active),
            ..org_a
        };
        assert_eq!(store.bindings(&active_a).await.unwrap(), vec![c]);
        assert_eq!(store.binding(&a.binding_id).await.unwrap(), Some(changed));
        let mut ghost = a;
        ghost.binding_id = "bind_ghost".into();
        assert!(!store.update_binding(&ghost).await.unwrap());
    }
}
