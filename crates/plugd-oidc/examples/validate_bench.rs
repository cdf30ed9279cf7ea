//! Micro-benchmark of JWT access token validation with a warm JWKS cache
//! (what a `/mcp` or API request with an issuer's token pays on top of the
//! request itself): a loopback issuer serves discovery and JWKS, the
//! validator fetches them once, then validates the same token repeatedly.
//! Run: `cargo run --release -p plugd-oidc --example validate_bench`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use plugd_oidc::{IssuerSpec, Validator};
use ring::signature::{self, KeyPair as _};
use serde_json::{Value, json};

const CALLS: usize = 4_000;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

async fn issuer(jwks: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let meta = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(meta) }),
        )
        .route(
            "/jwks",
            axum::routing::get(move || async move { axum::Json(jwks) }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn pct(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e6
}

async fn measure(alg: Algorithm, key: EncodingKey, jwk: Value) {
    let url = issuer(json!({"keys": [jwk]})).await;
    let v = Validator::new(vec![IssuerSpec {
        issuer: url.clone(),
        audiences: vec!["plugd".into()],
        groups_claim: "groups".into(),
        org_claim: Some("org".into()),
        project_claim: None,
    }])
    .unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut h = Header::new(alg);
    h.kid = Some("k1".into());
    let mint = |jti: usize| {
        jsonwebtoken::encode(
            &h,
            &json!({"iss": url, "sub": "alice", "aud": "plugd", "exp": now + 3600,
                    "iat": now, "jti": jti, "scope": "mcp", "groups": ["admins", "staff"]}),
            &key,
        )
        .unwrap()
    };
    v.validate(&mint(0)).await.unwrap(); // warms the JWKS cache
    // A new token each call: the signature is checked every time.
    let fresh: Vec<String> = (1..=CALLS).map(mint).collect();
    let mut samples = Vec::with_capacity(CALLS);
    for token in &fresh {
        let t = Instant::now();
        let got = v.validate(token).await.unwrap();
        samples.push(t.elapsed());
        std::hint::black_box(got);
    }
    report(
        alg,
        "a new token each call (signature checked)",
        &mut samples,
    );
    // The same token on every call (what an MCP client does): remembered.
    let token = mint(0);
    let mut samples = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let t = Instant::now();
        let got = v.validate(&token).await.unwrap();
        samples.push(t.elapsed());
        std::hint::black_box(got);
    }
    report(
        alg,
        "the same token each call (verified cache)",
        &mut samples,
    );
}

fn report(alg: Algorithm, what: &str, samples: &mut [Duration]) {
    let p50 = pct(samples, 0.50);
    let p99 = pct(samples, 0.99);
    #[allow(clippy::print_stdout)] // a benchmark's report
    {
        println!(
            "{alg:?}, {what}: validate p50 {p50:.2} us, p99 {p99:.2} us ({CALLS} calls, warm JWKS)"
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": "k1", "use": "sig",
                     "x": b64(pair.public_key().as_ref())});
    measure(
        Algorithm::EdDSA,
        EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk,
    )
    .await;

    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let public = pair.public_key().as_ref();
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": "k1", "use": "sig",
                     "x": b64(&public[1..33]), "y": b64(&public[33..65])});
    measure(
        Algorithm::ES256,
        EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk,
    )
    .await;
}
