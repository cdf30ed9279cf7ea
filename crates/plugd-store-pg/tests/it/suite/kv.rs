//! The agent's key-value storage on PostgreSQL: the SQLite store's behaviour.

use plugd_store::kv::{MAX_KEY, MAX_VALUE};
use serde_json::json;

use super::backends;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_per_space_and_prefixes_are_literal() {
    for be in backends().await {
        let s = &be.a;
        assert_eq!(s.kv_get("database", "a").await.unwrap(), None);
        s.kv_set("database", "tenant:acme:quota", &json!({"tokensPerDay": 5}))
            .await
            .unwrap();
        s.kv_set("database", "tenant:acme:usage", &json!(1))
            .await
            .unwrap();
        s.kv_set("database", "tenant%x", &json!(1)).await.unwrap();
        s.kv_set("database", "tenant_y", &json!("a\u{0}b"))
            .await
            .unwrap();
        s.kv_set("cache", "tenant:acme:quota", &json!("other"))
            .await
            .unwrap();
        assert_eq!(
            s.kv_get("database", "tenant:acme:quota").await.unwrap(),
            Some(json!({"tokensPerDay": 5}))
        );
        assert_eq!(
            s.kv_list("database", "tenant:acme:").await.unwrap(),
            ["tenant:acme:quota", "tenant:acme:usage"]
        );
        assert_eq!(
            s.kv_list("database", "tenant%").await.unwrap(),
            ["tenant%x"]
        );
        assert_eq!(
            s.kv_list("database", "tenant_").await.unwrap(),
            ["tenant_y"]
        );
        assert_eq!(
            s.kv_get("database", "tenant_y").await.unwrap(),
            Some(json!("a\u{0}b"))
        );
        assert_eq!(
            s.kv_get("cache", "tenant:acme:quota").await.unwrap(),
            Some(json!("other"))
        );
        s.kv_set("cache", "tenant:acme:quota", &json!(2))
            .await
            .unwrap();
        assert_eq!(
            s.kv_get("cache", "tenant:acme:quota").await.unwrap(),
            Some(json!(2))
        );
        assert!(s.kv_delete("database", "tenant:acme:usage").await.unwrap());
        assert!(!s.kv_delete("database", "tenant:acme:usage").await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_spaces_keys_and_values_are_refused() {
    for be in backends().await {
        let s = &be.a;
        assert!(s.kv_set("secrets", "k", &json!(1)).await.is_err());
        assert!(s.kv_set("database", "", &json!(1)).await.is_err());
        assert!(
            s.kv_set("database", &"k".repeat(MAX_KEY + 1), &json!(1))
                .await
                .is_err()
        );
        assert!(s.kv_set("database", "a\0b", &json!(1)).await.is_err());
        let big = json!("x".repeat(MAX_VALUE));
        assert!(s.kv_set("database", "big", &big).await.is_err());
        assert_eq!(s.kv_get("database", "big").await.unwrap(), None);
        assert!(s.kv_list("database", "a\0").await.unwrap().is_empty());
    }
}
