//! One issuer's state: its discovery document and its signing keys, cached;
//! an unknown `kid` refetches the keys (rotation), rate limited, one fetch
//! at a time.

use std::sync::{Arc, RwLock};
use std::time::Instant;

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use crate::fetch::{self, Metadata};
use crate::{IssuerSpec, Options, Refusal};

/// The key type an algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Okp,
}

fn family_of(alg: Algorithm) -> Option<Family> {
    use Algorithm as A;
    match alg {
        A::RS256 | A::RS384 | A::RS512 | A::PS256 | A::PS384 | A::PS512 => Some(Family::Rsa),
        A::ES256 | A::ES384 => Some(Family::Ec),
        A::EdDSA => Some(Family::Okp),
        A::HS256 | A::HS384 | A::HS512 => None,
    }
}

struct Key {
    kid: Option<String>,
    family: Family,
    /// The JWK's `alg`, when it names one.
    alg: Option<String>,
    key: Arc<DecodingKey>,
}

#[derive(Default)]
struct KeySet {
    keys: Vec<Key>,
    fetched_at: Option<Instant>,
}

pub(crate) struct IssuerState {
    pub(crate) spec: IssuerSpec,
    http: reqwest::Client,
    meta: tokio::sync::Mutex<Option<Arc<Metadata>>>,
    keys: RwLock<Arc<KeySet>>,
    /// When the keys were last fetched (or tried): held while fetching, so
    /// there is one fetch at a time.
    fetching: tokio::sync::Mutex<Option<Instant>>,
}

impl IssuerState {
    pub(crate) fn new(spec: IssuerSpec, http: reqwest::Client) -> IssuerState {
        IssuerState {
            spec,
            http,
            meta: tokio::sync::Mutex::new(None),
            keys: RwLock::new(Arc::new(KeySet::default())),
            fetching: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) async fn metadata(&self, options: &Options) -> Result<Arc<Metadata>, Refusal> {
        let mut meta = self.meta.lock().await;
        if let Some(m) = &*meta {
            return Ok(m.clone());
        }
        let m = Arc::new(
            fetch::discover(&self.http, &self.spec.issuer, options)
                .await
                .map_err(Refusal::KeysUnavailable)?,
        );
        *meta = Some(m.clone());
        Ok(m)
    }

    fn current(&self) -> Arc<KeySet> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The keys that may have signed a token with `kid` and `alg`.
    pub(crate) async fn keys_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
        options: &Options,
    ) -> Result<Vec<Arc<DecodingKey>>, Refusal> {
        let Some(family) = family_of(alg) else {
            return Err(Refusal::AlgNotAllowed(format!("{alg:?}")));
        };
        let alg_name = format!("{alg:?}");
        let find = |set: &KeySet| -> Vec<Arc<DecodingKey>> {
            set.keys
                .iter()
                .filter(|k| {
                    k.family == family
                        && k.alg.as_deref().is_none_or(|a| a == alg_name)
                        && kid.is_none_or(|kid| k.kid.as_deref() == Some(kid))
                })
                .map(|k| k.key.clone())
                .collect()
        };
        let fresh = |set: &KeySet| {
            set.fetched_at
                .is_some_and(|t| t.elapsed() < options.max_key_age)
        };
        let set = self.current();
        if fresh(&set) {
            let found = find(&set);
            if !found.is_empty() {
                return Ok(found);
            }
        }
        let unknown = || Refusal::UnknownKid(kid.unwrap_or("(none)").to_owned());
        let mut last = self.fetching.lock().await;
        // Another request may have fetched meanwhile.
        let set = self.current();
        if fresh(&set) {
            let found = find(&set);
            if !found.is_empty() {
                return Ok(found);
            }
        }
        if last.is_some_and(|t| t.elapsed() < options.refetch_interval) {
            // Rate limited: stale keys still serve, an unknown kid waits.
            let found = find(&set);
            if !found.is_empty() {
                return Ok(found);
            }
            return Err(if set.fetched_at.is_none() {
                Refusal::KeysUnavailable(format!(
                    "the last fetch of {}'s keys failed; it is retried at most every {} s",
                    self.spec.issuer,
                    options.refetch_interval.as_secs()
                ))
            } else {
                unknown()
            });
        }
        *last = Some(Instant::now());
        match self.fetch_keys(options).await {
            Ok(keys) => {
                tracing::info!(issuer = %self.spec.issuer, keys = keys.len(), "fetched the issuer's JWKS");
                let set = Arc::new(KeySet {
                    keys,
                    fetched_at: Some(Instant::now()),
                });
                *self
                    .keys
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = set.clone();
                let found = find(&set);
                if found.is_empty() {
                    Err(unknown())
                } else {
                    Ok(found)
                }
            }
            Err(e) => {
                tracing::warn!(issuer = %self.spec.issuer, error = %e, "could not fetch the issuer's JWKS");
                // The discovery document is read again next time.
                *self.meta.lock().await = None;
                let found = find(&set);
                if found.is_empty() {
                    Err(Refusal::KeysUnavailable(e))
                } else {
                    Ok(found)
                }
            }
        }
    }

    async fn fetch_keys(&self, options: &Options) -> Result<Vec<Key>, String> {
        let meta = self.metadata(options).await.map_err(|e| e.to_string())?;
        let doc = fetch::get_json(
            &self.http,
            &meta.jwks_uri,
            options.max_document_bytes,
            options.fetch_timeout,
        )
        .await?;
        let Some(Value::Array(keys)) = doc.get("keys") else {
            return Err(format!("{}: no \"keys\" array", meta.jwks_uri));
        };
        let mut out = Vec::new();
        for (i, k) in keys.iter().take(options.max_keys).enumerate() {
            match parse_key(k) {
                Ok(Some(key)) => out.push(key),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(issuer = %self.spec.issuer, key = i, error = %e, "skipped a key of the issuer's JWKS")
                }
            }
        }
        Ok(out)
    }
}

/// A signing key of a JWKS; `None` for keys that are not for signatures
/// (`use: enc`) and symmetric keys (never trusted from a JWKS).
fn parse_key(k: &Value) -> Result<Option<Key>, String> {
    let jwk: Jwk = serde_json::from_value(k.clone()).map_err(|e| e.to_string())?;
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
        return Ok(None);
    }
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Family::Rsa,
        AlgorithmParameters::EllipticCurve(_) => Family::Ec,
        AlgorithmParameters::OctetKeyPair(_) => Family::Okp,
        AlgorithmParameters::OctetKey(_) => return Ok(None),
    };
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| e.to_string())?;
    Ok(Some(Key {
        kid: jwk.common.key_id.clone(),
        family,
        alg: jwk.common.key_algorithm.map(|a| format!("{a:?}")),
        key: Arc::new(key),
    }))
}
