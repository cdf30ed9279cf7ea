//! plugd as an OAuth 2.1 protected resource (RFC 9728; the MCP
//! authorization spec, revision 2025-06-18 and later) and as an OpenID
//! Connect relying party (the console's single sign-on): issuer discovery,
//! a JWKS cache per issuer, and the validation of JWT access tokens and ID
//! tokens.
//!
//! [`Validator::validate`] reads a bearer token as a JWT of one of the
//! configured issuers and answers the [`Verified`] claims plugd maps to an
//! identity, or the [`Refusal`] that says why not (what serve logs; never
//! the token):
//! 1. at most [`MAX_TOKEN_BYTES`], three base64url parts (no JWE);
//! 2. `alg` from [`ALLOWED_ALGS`], asymmetric only (`none` and `HS*` refused
//!    before any key is looked at);
//! 3. `iss` exactly one of the configured issuers;
//! 4. the key by `kid` from the issuer's JWKS (`jwks_uri` of its discovery
//!    document), cached; an unknown `kid` refetches the JWKS (key rotation),
//!    at most once per [`Options::refetch_interval`] per issuer, so a flood
//!    of bogus kids cannot hammer the provider;
//! 5. the signature, `exp` and `nbf` with [`Options::leeway`], `aud`
//!    containing one of the expected audiences (`jsonwebtoken`).
//!
//! A token that passed is remembered by its SHA-256 until its `exp` (at
//! most [`MAX_VERIFIED`] of them): the next request with it checks only
//! `exp`, not the signature again (what a client sending the same access
//! token on every call costs; see BENCHMARKS.md). A key withdrawn from the
//! JWKS therefore stops new tokens at once and remembered ones at their
//! `exp`.
//!
//! Every fetch is bounded in size ([`Options::max_document_bytes`]) and time
//! ([`Options::fetch_timeout`]), follows no redirect, and a malformed key of
//! a JWKS is skipped, never fatal.
//!
//! **API boundary**: this crate knows nothing of plugd's roles or HTTP
//! server; `plugd-server` maps [`Verified`] to an identity.

mod fetch;
mod keys;
pub mod sso;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::Value;

pub use fetch::Metadata;
use keys::IssuerState;

/// The largest bearer token read (a larger one is refused unparsed).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The signature algorithms accepted: asymmetric ones only.
pub const ALLOWED_ALGS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

/// The most verified access tokens remembered (by hash) at once; when
/// full, the expired ones go, and if none has, all of them.
pub const MAX_VERIFIED: usize = 4096;

/// The most groups kept from a token's groups claim (the rest are dropped,
/// with a warning).
pub const MAX_GROUPS: usize = 256;

/// One trusted issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerSpec {
    /// Its issuer identifier, compared exactly with `iss`.
    pub issuer: String,
    /// The audiences an access token of it may carry (one is enough).
    pub audiences: Vec<String>,
    /// The claim holding the subject's groups (`groups` by default).
    pub groups_claim: String,
    /// The claim naming the subject's org (`None`: no org is read).
    pub org_claim: Option<String>,
    /// The claim naming the subject's project (`None`: no project is read).
    pub project_claim: Option<String>,
}

/// The knobs of a [`Validator`]; [`Options::default`] is what serve uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// The least time between two JWKS fetches of one issuer caused by an
    /// unknown `kid` (or by a failed fetch).
    pub refetch_interval: Duration,
    /// How long fetched keys are used before they are fetched again.
    pub max_key_age: Duration,
    /// The deadline of one discovery or JWKS fetch (connect included).
    pub fetch_timeout: Duration,
    /// The largest discovery document or JWKS read.
    pub max_document_bytes: usize,
    /// The most keys of a JWKS kept.
    pub max_keys: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            leeway: Duration::from_secs(60),
            refetch_interval: Duration::from_secs(5),
            max_key_age: Duration::from_secs(3600),
            fetch_timeout: Duration::from_secs(5),
            max_document_bytes: 256 * 1024,
            max_keys: 64,
        }
    }
}

/// What a valid token says about its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The issuer that signed it (`iss`).
    pub issuer: String,
    /// `sub`.
    pub subject: String,
    /// The issuer's groups claim (empty when absent).
    pub groups: Vec<String>,
    /// The issuer's org claim ([`IssuerSpec::org_claim`]), when it names
    /// one and the token carries it as a string.
    pub org: Option<String>,
    /// The issuer's project claim ([`IssuerSpec::project_claim`]), likewise.
    pub project: Option<String>,
    /// `exp`, Unix seconds.
    pub expires_at: u64,
    /// `nonce` (ID tokens).
    pub nonce: Option<String>,
    /// `scope` (access tokens), split on spaces.
    pub scopes: Vec<String>,
    /// `email` or `preferred_username`, for display only.
    pub display: Option<String>,
}

impl Verified {
    /// The identity's name: `oidc:<issuer host[:port]>/<sub>`.
    pub fn name(&self) -> String {
        let host = url::Url::parse(&self.issuer)
            .ok()
            .and_then(|u| {
                let host = u.host_str()?.to_owned();
                Some(match u.port() {
                    Some(p) => format!("{host}:{p}"),
                    None => host,
                })
            })
            .unwrap_or_else(|| self.issuer.clone());
        format!("oidc:{host}/{}", self.subject)
    }
}

/// Why a token was refused. [`Refusal::cause`] is the short label serve
/// logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a signed JWT at all.
    #[error("the token is not a signed JWT ({0})")]
    Malformed(String),
    /// Larger than [`MAX_TOKEN_BYTES`].
    #[error("the token is larger than {MAX_TOKEN_BYTES} bytes")]
    TooLarge,
    /// `alg: none`.
    #[error(
        "the token is unsigned (alg \"none\"); only tokens signed with an asymmetric key are accepted"
    )]
    AlgNone,
    /// An `alg` outside [`ALLOWED_ALGS`] (`HS256`, …).
    #[error(
        "the token's alg {0:?} is not accepted; issuers must sign with one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA"
    )]
    AlgNotAllowed(String),
    /// `iss` names no configured issuer.
    #[error("the token's issuer {0:?} is not one of plugd.yaml auth.issuers")]
    WrongIssuer(String),
    /// No key of the issuer's JWKS has the token's `kid`.
    #[error("the issuer's JWKS has no key {0:?}")]
    UnknownKid(String),
    /// The signature does not verify.
    #[error("the token's signature does not verify with the issuer's key")]
    BadSignature,
    /// `exp` passed (beyond the leeway).
    #[error("the token expired")]
    Expired,
    /// `nbf` is still ahead (beyond the leeway).
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    /// `aud` holds none of the expected audiences.
    #[error("the token's audience is not {0}")]
    WrongAudience(String),
    /// A required claim is missing or of the wrong type.
    #[error("the token has no usable {0:?} claim")]
    MissingClaim(String),
    /// An ID token whose `nonce` is not the login's.
    #[error("the ID token's nonce is not the login's")]
    WrongNonce,
    /// The issuer's discovery document or JWKS could not be had.
    #[error("the issuer's keys are unavailable: {0}")]
    KeysUnavailable(String),
}

impl Refusal {
    /// A short, stable label for logs and metrics.
    pub fn cause(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::TooLarge => "too_large",
            Refusal::AlgNone => "alg_none",
            Refusal::AlgNotAllowed(_) => "alg_not_allowed",
            Refusal::WrongIssuer(_) => "wrong_issuer",
            Refusal::UnknownKid(_) => "unknown_kid",
            Refusal::BadSignature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::WrongAudience(_) => "wrong_audience",
            Refusal::MissingClaim(_) => "missing_claim",
            Refusal::WrongNonce => "wrong_nonce",
            Refusal::KeysUnavailable(_) => "keys_unavailable",
        }
    }
}

/// Validates tokens of the configured issuers; cheap to clone, shared by
/// every request (the key caches live inside).
#[derive(Clone)]
pub struct Validator {
    issuers: Arc<Vec<Arc<IssuerState>>>,
    options: Arc<Options>,
    http: reqwest::Client,
    /// Access tokens that passed, by SHA-256, until their `exp`.
    verified: Arc<std::sync::Mutex<std::collections::HashMap<[u8; 32], Verified>>>,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field(
                "issuers",
                &self
                    .issuers
                    .iter()
                    .map(|i| i.spec.issuer.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// The header and payload of a JWT, decoded but not verified.
struct Unverified {
    alg: String,
    kid: Option<String>,
    iss: Option<String>,
}

fn peek(token: &str) -> Result<Unverified, Refusal> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Refusal::TooLarge);
    }
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(Refusal::Malformed(format!(
            "{} dot-separated parts, a signed JWT has 3",
            parts.len()
        )));
    }
    let part = |s: &str, what: &str| -> Result<serde_json::Map<String, Value>, Refusal> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim_end_matches('='))
            .map_err(|_| Refusal::Malformed(format!("its {what} is not base64url")))?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(Refusal::Malformed(format!(
                "its {what} is not a JSON object"
            ))),
        }
    };
    let header = part(parts[0], "header")?;
    let payload = part(parts[1], "payload")?;
    let Some(alg) = header.get("alg").and_then(Value::as_str) else {
        return Err(Refusal::Malformed("its header has no alg".into()));
    };
    Ok(Unverified {
        alg: alg.to_owned(),
        kid: header.get("kid").and_then(Value::as_str).map(str::to_owned),
        iss: payload
            .get("iss")
            .and_then(Value::as_str)
            .map(str::to_owned),
    })
}

fn algorithm(alg: &str) -> Result<Algorithm, Refusal> {
    if alg.eq_ignore_ascii_case("none") {
        return Err(Refusal::AlgNone);
    }
    let a = match alg {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        other => return Err(Refusal::AlgNotAllowed(other.to_owned())),
    };
    Ok(a)
}

fn refusal_of(e: jsonwebtoken::errors::Error, audiences: &[String]) -> Refusal {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::InvalidSignature | K::InvalidAlgorithm | K::InvalidKeyFormat | K::InvalidEcdsaKey => {
            Refusal::BadSignature
        }
        K::ExpiredSignature => Refusal::Expired,
        K::ImmatureSignature => Refusal::NotYetValid,
        K::InvalidAudience => Refusal::WrongAudience(
            audiences
                .iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(" or "),
        ),
        K::InvalidIssuer => Refusal::WrongIssuer("(mismatch)".into()),
        K::MissingRequiredClaim(c) => Refusal::MissingClaim(c.clone()),
        other => Refusal::Malformed(format!("{other:?}")),
    }
}

impl Validator {
    /// A validator of `issuers`, with [`Options::default`].
    pub fn new(issuers: Vec<IssuerSpec>) -> Result<Validator, String> {
        Validator::with_options(issuers, Options::default())
    }

    /// A validator of `issuers` with `options`.
    pub fn with_options(issuers: Vec<IssuerSpec>, options: Options) -> Result<Validator, String> {
        let http = fetch::client(&options)?;
        Ok(Validator {
            issuers: Arc::new(
                issuers
                    .into_iter()
                    .map(|spec| Arc::new(IssuerState::new(spec, http.clone())))
                    .collect(),
            ),
            options: Arc::new(options),
            http,
            verified: Arc::default(),
        })
    }

    /// The configured issuers, in order.
    pub fn issuers(&self) -> impl Iterator<Item = &IssuerSpec> {
        self.issuers.iter().map(|i| &i.spec)
    }

    fn issuer(&self, iss: &str) -> Option<&Arc<IssuerState>> {
        self.issuers.iter().find(|i| i.spec.issuer == iss)
    }

    /// The discovery document of configured issuer `issuer` (fetched once,
    /// then cached).
    pub async fn metadata(&self, issuer: &str) -> Result<Arc<Metadata>, Refusal> {
        let state = self
            .issuer(issuer)
            .ok_or_else(|| Refusal::WrongIssuer(issuer.to_owned()))?;
        state.metadata(&self.options).await
    }

    /// Validates access token `token` (see the crate documentation).
    pub async fn validate(&self, token: &str) -> Result<Verified, Refusal> {
        use sha2::Digest as _;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::TooLarge);
        }
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let leeway = self.options.leeway.as_secs();
        {
            let mut seen = self
                .verified
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(v) = seen.get(&key) {
                if now <= v.expires_at.saturating_add(leeway) {
                    return Ok(v.clone());
                }
                seen.remove(&key);
                return Err(Refusal::Expired);
            }
        }
        let v = self.check(token, None, None).await?;
        let mut seen = self
            .verified
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= MAX_VERIFIED {
            seen.retain(|_, v| now <= v.expires_at.saturating_add(leeway));
            if seen.len() >= MAX_VERIFIED {
                seen.clear();
            }
        }
        seen.insert(key, v.clone());
        Ok(v)
    }

    /// Validates ID token `token` of `issuer` for client `client_id`, with
    /// the login's `nonce`.
    pub async fn validate_id_token(
        &self,
        token: &str,
        issuer: &str,
        client_id: &str,
        nonce: &str,
    ) -> Result<Verified, Refusal> {
        let v = self
            .check(token, Some(issuer), Some(&[client_id.to_owned()]))
            .await?;
        if v.nonce.as_deref() != Some(nonce) {
            return Err(Refusal::WrongNonce);
        }
        Ok(v)
    }

    async fn check(
        &self,
        token: &str,
        only_issuer: Option<&str>,
        audiences: Option<&[String]>,
    ) -> Result<Verified, Refusal> {
        let head = peek(token)?;
        let alg = algorithm(&head.alg)?;
        let iss = head
            .iss
            .ok_or_else(|| Refusal::MissingClaim("iss".into()))?;
        if only_issuer.is_some_and(|i| i != iss) {
            return Err(Refusal::WrongIssuer(iss));
        }
        let state = self
            .issuer(&iss)
            .ok_or_else(|| Refusal::WrongIssuer(iss.clone()))?;
        let audiences = audiences.unwrap_or(&state.spec.audiences);
        let mut v = Validation::new(alg);
        v.leeway = self.options.leeway.as_secs();
        v.validate_nbf = true;
        v.set_issuer(&[&state.spec.issuer]);
        v.set_audience(audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let candidates = state
            .keys_for(head.kid.as_deref(), alg, &self.options)
            .await?;
        let mut last = Refusal::BadSignature;
        for key in candidates.iter() {
            match jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, key, &v) {
                Ok(data) => return claims(&state.spec, data.claims),
                Err(e) => {
                    last = refusal_of(e, audiences);
                    if last != Refusal::BadSignature {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }
}

fn claims(spec: &IssuerSpec, c: serde_json::Map<String, Value>) -> Result<Verified, Refusal> {
    let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
    let subject = text("sub")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Refusal::MissingClaim("sub".into()))?;
    let expires_at = c
        .get("exp")
        .and_then(Value::as_u64)
        .ok_or_else(|| Refusal::MissingClaim("exp".into()))?;
    let mut groups: Vec<String> = match c.get(&spec.groups_claim) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    if groups.len() > MAX_GROUPS {
        tracing::warn!(
            issuer = %spec.issuer,
            groups = groups.len(),
            "a token's groups claim holds more than {MAX_GROUPS} groups; the rest are ignored"
        );
        groups.truncate(MAX_GROUPS);
    }
    Ok(Verified {
        issuer: spec.issuer.clone(),
        subject,
        groups,
        org: spec.org_claim.as_deref().and_then(text),
        project: spec.project_claim.as_deref().and_then(text),
        expires_at,
        nonce: text("nonce"),
        scopes: text("scope")
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        display: text("email").or_else(|| text("preferred_username")),
    })
}

#[cfg(test)]
mod tests;
