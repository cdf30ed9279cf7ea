//! API tokens on PostgreSQL: only the secret's SHA-256 is stored (the
//! rest of tokens and audit runs on both backends in `suite::tokens`).

use plugd_store::tokens::Role;

use crate::fresh_store;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_secrets_hash_is_stored() {
    let store = fresh_store().await;
    let t = store
        .token_create("ci", Role::Agent, None, "root")
        .await
        .unwrap();
    let (_, secret) = t.token["plugd_".len()..].split_once('_').unwrap();
    // Only sha256(secret) is stored, as on SQLite; the secret is nowhere.
    let hashed = store
        .test_count(
            "SELECT count(*) FROM api_tokens WHERE secret_sha256 = sha256(convert_to($1, 'UTF8'))",
            secret,
        )
        .await
        .unwrap();
    assert_eq!(hashed, 1);
    let leaked = store
        .test_count(
            "SELECT count(*) FROM api_tokens WHERE encode(secret_sha256, 'hex') = $1 OR id = $1
                OR name = $1 OR position($1 IN coalesce(mcp_profiles, '')) > 0",
            secret,
        )
        .await
        .unwrap();
    assert_eq!(leaked, 0);
}
