//! Micro-benchmark of what identity and policy cost a call: JWT access
//! token validation with a warm JWKS cache (a loopback issuer serves
//! discovery and JWKS, the validator fetches them once, then validates new
//! tokens and the same token repeatedly), against the check of a
//! `plugd_…` token by the SQLite state store, in the same process; then
//! plugd.yaml `policy:` evaluation at call time (CEL) for a JWT caller with
//! groups and for a plugd token's caller.
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

/// A `plugd_…` token checked by the state store (what a request with a
/// plugd token pays where a JWT pays `validate`), the same token each call.
fn plugd_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = plugd_store::Store::open(dir.path()).unwrap();
    let token = store
        .token_create("bench", plugd_store::tokens::Role::Agent, None, "bench")
        .unwrap()
        .token;
    let mut samples = Vec::with_capacity(CALLS);
    for i in 0..CALLS * 2 {
        let t = Instant::now();
        let got = store.token_verify(&token).unwrap().unwrap();
        if i >= CALLS {
            samples.push(t.elapsed());
        }
        std::hint::black_box(got);
    }
    print_row(
        "plugd token (state store, SQLite)",
        "the same token each call",
        &mut samples,
    );
}

/// plugd.yaml `policy:` at call time: `rules` in order, for `caller`.
fn policy(rules: &[(&str, &str, plugd_runtime::tool_policy::Effect)], caller_kind: &str) {
    use plugd_runtime::tool_policy::{PolicyCaller, Rule, Stage, ToolPolicy};
    let policy = ToolPolicy {
        rules: rules
            .iter()
            .map(|(name, when, effect)| Rule::compile(name, when, *effect).unwrap())
            .collect(),
    };
    let caller = match caller_kind {
        "jwt" => PolicyCaller {
            groups: vec!["admins".into(), "staff".into()],
            role: "agent".into(),
            ..PolicyCaller::named("oidc:idp.example.com/alice")
        },
        _ => PolicyCaller {
            role: "agent".into(),
            ..PolicyCaller::named("token:bench")
        },
    };
    let tool = json!({"name": "db__query", "plugin": "db", "risk": "low", "annotations": {}});
    let args = json!({"sql": "select 1 from users where id = 42"});
    let mut samples = Vec::with_capacity(CALLS);
    for i in 0..CALLS * 2 {
        let t = Instant::now();
        let got = policy.explain(&caller, tool.clone(), Some(&args), Stage::Call);
        if i >= CALLS {
            samples.push(t.elapsed());
        }
        std::hint::black_box(got);
    }
    let what = format!("{} rule(s), {caller_kind} caller", rules.len());
    print_row("policy: explain at call time", &what, &mut samples);
}

fn print_row(what: &str, how: &str, samples: &mut [Duration]) {
    let p50 = pct(samples, 0.50);
    let p99 = pct(samples, 0.99);
    #[allow(clippy::print_stdout)] // a benchmark's report
    {
        println!("{what}, {how}: p50 {p50:.2} us, p99 {p99:.2} us ({CALLS} calls)");
    }
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

    plugd_token();

    use plugd_runtime::tool_policy::Effect;
    // The issue's example, then a require_approval on the arguments, then
    // ten rules of which none matches (every one evaluated).
    let deny = (
        "no-drop-for-interns",
        r#""interns" in caller.groups && tool.name == "db__drop""#,
        Effect::Deny,
    );
    let approve = (
        "writes-need-approval",
        r#"tool.name.startsWith("db__") && args.sql.matches("(?i)^\\s*(insert|update|delete)")"#,
        Effect::RequireApproval,
    );
    let ten: Vec<(&str, String, Effect)> = (0..10)
        .map(|i| {
            (
                "rule",
                format!(r#""group{i}" in caller.groups && tool.plugin == "p{i}""#),
                Effect::Deny,
            )
        })
        .collect();
    let ten: Vec<(&str, &str, Effect)> = ten.iter().map(|(n, w, e)| (*n, w.as_str(), *e)).collect();
    for caller in ["jwt", "plugd token"] {
        policy(&[], caller);
        policy(&[deny], caller);
        policy(&[deny, approve], caller);
        policy(&ten, caller);
    }
}
