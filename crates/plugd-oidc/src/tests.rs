//! Unit tests of token validation against a real HTTP issuer on loopback
//! (discovery document and JWKS served by axum, keys made with ring).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{EncodingKey, Header};
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use serde_json::{Value, json};

use super::*;

struct TestKey {
    kid: String,
    pkcs8: Vec<u8>,
    public: Vec<u8>,
}

fn key(kid: &str) -> TestKey {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    TestKey {
        kid: kid.into(),
        pkcs8: pkcs8.as_ref().to_vec(),
        public: pair.public_key().as_ref().to_vec(),
    }
}

fn jwk(k: &TestKey) -> Value {
    json!({
        "kty": "OKP", "crv": "Ed25519", "use": "sig", "alg": "EdDSA", "kid": k.kid,
        "x": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&k.public),
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(k: &TestKey, claims: Value) -> String {
    let mut h = Header::new(jsonwebtoken::Algorithm::EdDSA);
    h.kid = Some(k.kid.clone());
    jsonwebtoken::encode(&h, &claims, &EncodingKey::from_ed_der(&k.pkcs8)).unwrap()
}

/// A loopback issuer whose JWKS the test sets; counts JWKS fetches.
struct Issuer {
    url: String,
    jwks: Arc<std::sync::Mutex<Value>>,
    hits: Arc<AtomicUsize>,
    delay: Arc<std::sync::Mutex<Duration>>,
}

async fn issuer() -> Issuer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let jwks = Arc::new(std::sync::Mutex::new(json!({"keys": []})));
    let hits = Arc::new(AtomicUsize::new(0));
    let delay = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let meta = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
    let (j, h, d) = (jwks.clone(), hits.clone(), delay.clone());
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(meta) }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || {
                let (j, h, d) = (j.clone(), h.clone(), d.clone());
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    let wait = *d.lock().unwrap();
                    tokio::time::sleep(wait).await;
                    let body = j.lock().unwrap().clone();
                    axum::Json(body)
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Issuer {
        url,
        jwks,
        hits,
        delay,
    }
}

fn validator(iss: &Issuer, refetch: Duration) -> Validator {
    Validator::with_options(
        vec![IssuerSpec {
            issuer: iss.url.clone(),
            audiences: vec!["plugd".into()],
            groups_claim: "groups".into(),
            org_claim: Some("org".into()),
            project_claim: None,
        }],
        Options {
            refetch_interval: refetch,
            fetch_timeout: Duration::from_secs(2),
            ..Options::default()
        },
    )
    .unwrap()
}

fn claims(iss: &Issuer) -> Value {
    json!({"iss": iss.url, "sub": "alice", "aud": "plugd", "exp": now() + 300,
           "groups": ["admins", "staff"], "org": "acme"})
}

#[tokio::test]
async fn a_token_of_the_issuer_is_accepted_and_its_claims_read() {
    let iss = issuer().await;
    let k = key("k1");
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)]});
    let v = validator(&iss, Duration::from_secs(60));
    let got = v.validate(&sign(&k, claims(&iss))).await.unwrap();
    assert_eq!(got.subject, "alice");
    assert_eq!(got.groups, ["admins", "staff"]);
    assert_eq!(got.org.as_deref(), Some("acme"));
    assert!(got.name().starts_with("oidc:127.0.0.1:"), "{}", got.name());
    assert!(got.name().ends_with("/alice"));
    // The keys are cached: a second token fetches nothing.
    v.validate(&sign(&k, claims(&iss))).await.unwrap();
    assert_eq!(iss.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bad_tokens_are_refused_with_their_cause() {
    let iss = issuer().await;
    let k = key("k1");
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)]});
    let v = validator(&iss, Duration::from_secs(60));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims(&iss);
        f(&mut c);
        sign(&k, c)
    };
    let cases: Vec<(String, &str)> = vec![
        (with(&|c| c["aud"] = json!("other")), "wrong_audience"),
        (with(&|c| c["exp"] = json!(now() - 120)), "expired"),
        (with(&|c| c["nbf"] = json!(now() + 600)), "not_yet_valid"),
        (
            with(&|c| c["iss"] = json!("https://evil.example")),
            "wrong_issuer",
        ),
        (
            with(&|c| {
                c.as_object_mut().unwrap().remove("sub");
            }),
            "missing_claim",
        ),
        (sign(&key("k1"), claims(&iss)), "bad_signature"),
        ("not a token".into(), "malformed"),
        ("a.b.c.d.e".into(), "malformed"),
        ("x".repeat(MAX_TOKEN_BYTES + 1), "too_large"),
    ];
    for (token, cause) in cases {
        let e = v.validate(&token).await.unwrap_err();
        assert_eq!(e.cause(), cause, "{e}");
    }
    // Within the leeway, an expired token still passes.
    v.validate(&with(&|c| c["exp"] = json!(now() - 30)))
        .await
        .unwrap();
    // alg none and HS256 are refused before any key is looked at.
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT"})),
        b64(claims(&iss))
    );
    assert_eq!(v.validate(&none).await.unwrap_err(), Refusal::AlgNone);
    let hs = jsonwebtoken::encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &claims(&iss),
        &EncodingKey::from_secret(b"secret"),
    )
    .unwrap();
    assert_eq!(
        v.validate(&hs).await.unwrap_err().cause(),
        "alg_not_allowed"
    );
}

#[tokio::test]
async fn an_unknown_kid_refetches_the_jwks_at_most_once_per_interval() {
    let iss = issuer().await;
    let (k1, k2) = (key("k1"), key("k2"));
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k1)]});
    let v = validator(&iss, Duration::from_millis(500));
    v.validate(&sign(&k1, claims(&iss))).await.unwrap();
    assert_eq!(iss.hits.load(Ordering::SeqCst), 1);
    // A flood of bogus kids: one refetch at most within the interval.
    for i in 0..50 {
        let bogus = key(&format!("bogus{i}"));
        let e = v.validate(&sign(&bogus, claims(&iss))).await.unwrap_err();
        assert_eq!(e.cause(), "unknown_kid");
    }
    assert!(iss.hits.load(Ordering::SeqCst) <= 2);
    // Rotation: the new key is published; after the interval its token
    // passes once the JWKS is fetched again, and the old key's still does.
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k2), jwk(&k1)]});
    tokio::time::sleep(Duration::from_millis(600)).await;
    v.validate(&sign(&k2, claims(&iss))).await.unwrap();
    v.validate(&sign(&k1, claims(&iss))).await.unwrap();
}

#[tokio::test]
async fn hostile_jwks_are_bounded_and_malformed_keys_skipped() {
    let iss = issuer().await;
    let k = key("k1");
    // A malformed key beside a good one: the good one serves.
    *iss.jwks.lock().unwrap() = json!({"keys": [
        {"kty": "RSA", "kid": "bad", "n": "!!", "e": 1},
        {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
        jwk(&k),
    ]});
    let v = validator(&iss, Duration::from_millis(100));
    v.validate(&sign(&k, claims(&iss))).await.unwrap();
    // A huge JWKS is refused, not read whole.
    let iss = issuer().await;
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)], "pad": "x".repeat(1 << 20)});
    let v = validator(&iss, Duration::from_millis(100));
    let e = v.validate(&sign(&k, claims(&iss))).await.unwrap_err();
    assert_eq!(e.cause(), "keys_unavailable", "{e}");
    assert!(e.to_string().contains("larger than"), "{e}");
    // A slow one times out.
    let iss = issuer().await;
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)]});
    *iss.delay.lock().unwrap() = Duration::from_secs(10);
    let v = validator(&iss, Duration::from_millis(100));
    let started = std::time::Instant::now();
    let e = v.validate(&sign(&k, claims(&iss))).await.unwrap_err();
    assert_eq!(e.cause(), "keys_unavailable", "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Not JSON, not an object, no keys: refused, never a panic.
    for doc in [json!("keys"), json!({"keys": "x"}), json!([1, 2])] {
        let iss = issuer().await;
        *iss.jwks.lock().unwrap() = doc;
        let v = validator(&iss, Duration::from_millis(100));
        assert!(v.validate(&sign(&k, claims(&iss))).await.is_err());
    }
}

#[tokio::test]
async fn an_id_token_needs_the_client_audience_and_the_nonce() {
    let iss = issuer().await;
    let k = key("k1");
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)]});
    let v = validator(&iss, Duration::from_secs(60));
    let mut c = claims(&iss);
    c["aud"] = json!("console");
    c["nonce"] = json!("n1");
    let t = sign(&k, c);
    v.validate_id_token(&t, &iss.url, "console", "n1")
        .await
        .unwrap();
    assert_eq!(
        v.validate_id_token(&t, &iss.url, "console", "n2")
            .await
            .unwrap_err(),
        Refusal::WrongNonce
    );
    assert_eq!(
        v.validate_id_token(&t, &iss.url, "other", "n1")
            .await
            .unwrap_err()
            .cause(),
        "wrong_audience"
    );
    // An access token's audience is not a client's.
    assert_eq!(v.validate(&t).await.unwrap_err().cause(), "wrong_audience");
}

#[tokio::test]
async fn a_remembered_token_still_expires() {
    let iss = issuer().await;
    let k = key("k1");
    *iss.jwks.lock().unwrap() = json!({"keys": [jwk(&k)]});
    let v = Validator::with_options(
        vec![IssuerSpec {
            issuer: iss.url.clone(),
            audiences: vec!["plugd".into()],
            groups_claim: "groups".into(),
            org_claim: None,
            project_claim: None,
        }],
        Options {
            leeway: Duration::ZERO,
            ..Options::default()
        },
    )
    .unwrap();
    let mut c = claims(&iss);
    c["exp"] = json!(now() + 1);
    let t = sign(&k, c);
    let first = v.validate(&t).await.unwrap();
    assert_eq!(v.validate(&t).await.unwrap(), first);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(v.validate(&t).await.unwrap_err(), Refusal::Expired);
    assert_eq!(v.validate(&t).await.unwrap_err(), Refusal::Expired);
}
