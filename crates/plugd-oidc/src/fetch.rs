//! Bounded fetches of an issuer's documents: its discovery document
//! (OpenID Connect Discovery, else RFC 8414) and its JWKS. No redirects,
//! a deadline per fetch, a cap on the bytes read.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::Options;

/// The parts of an issuer's discovery document plugd uses.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Metadata {
    /// Its issuer identifier (must be the configured one, exactly).
    pub issuer: String,
    /// Where its keys are.
    pub jwks_uri: String,
    /// Where the console sends browsers to sign in.
    #[serde(default)]
    pub authorization_endpoint: Option<String>,
    /// Where codes are exchanged.
    #[serde(default)]
    pub token_endpoint: Option<String>,
    /// Where a logout may end the provider's session too.
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
    /// The scopes it offers.
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
}

/// The HTTP client of the fetches: rustls (ring), no redirects, the
/// options' deadline.
pub(crate) fn client(options: &Options) -> Result<reqwest::Client, String> {
    // reqwest's rustls backend needs a process-wide crypto provider; an
    // `Err` only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(options.fetch_timeout)
        .timeout(options.fetch_timeout)
        .build()
        .map_err(|e| format!("http client: {e}"))
}

/// GETs `url` as JSON: `200` only, at most `max` bytes, within `deadline`.
pub(crate) async fn get_json(
    http: &reqwest::Client,
    url: &str,
    max: usize,
    deadline: Duration,
) -> Result<Value, String> {
    let fetch = async {
        let mut resp = http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("GET {url}: {}", chain(&e)))?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(format!("GET {url}: status {}", resp.status()));
        }
        if resp.content_length().is_some_and(|n| n > max as u64) {
            return Err(format!(
                "GET {url}: the document is larger than {max} bytes"
            ));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("GET {url}: {}", chain(&e)))?
        {
            if body.len() + chunk.len() > max {
                return Err(format!(
                    "GET {url}: the document is larger than {max} bytes"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON ({e})"))
    };
    tokio::time::timeout(deadline, fetch)
        .await
        .map_err(|_| format!("GET {url}: no answer within {} s", deadline.as_secs()))?
}

/// A transport error with its causes, `: `-joined.
fn chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// The discovery document of `issuer`: `{issuer}/.well-known/openid-configuration`,
/// else RFC 8414's `{origin}/.well-known/oauth-authorization-server{path}`;
/// its `issuer` must be `issuer` exactly.
pub(crate) async fn discover(
    http: &reqwest::Client,
    issuer: &str,
    options: &Options,
) -> Result<Metadata, String> {
    let base = issuer.trim_end_matches('/');
    let mut urls = vec![format!("{base}/.well-known/openid-configuration")];
    if let Ok(u) = url::Url::parse(issuer) {
        let path = u.path().trim_end_matches('/');
        let mut origin = u.clone();
        origin.set_path("");
        origin.set_query(None);
        let origin = origin.as_str().trim_end_matches('/').to_owned();
        urls.push(format!(
            "{origin}/.well-known/oauth-authorization-server{path}"
        ));
    }
    let mut errors = Vec::new();
    for url in urls {
        match get_json(
            http,
            &url,
            options.max_document_bytes,
            options.fetch_timeout,
        )
        .await
        {
            Ok(doc) => {
                let meta: Metadata = serde_json::from_value(doc)
                    .map_err(|e| format!("{url}: not a discovery document ({e})"))?;
                if meta.issuer != issuer {
                    return Err(format!(
                        "{url} names issuer {:?}, not {issuer:?}; set auth.issuers[].issuer to the issuer exactly as its discovery document names it",
                        meta.issuer
                    ));
                }
                return Ok(meta);
            }
            Err(e) => errors.push(e),
        }
    }
    Err(errors.join("; "))
}

/// POSTs form `fields` to `url` and reads a JSON answer (any status; the
/// caller reads `error`), at most `max` bytes, within `deadline`.
pub(crate) async fn post_form(
    http: &reqwest::Client,
    url: &str,
    fields: &[(&str, &str)],
    max: usize,
    deadline: Duration,
) -> Result<(reqwest::StatusCode, Value), String> {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    let fetch = async {
        let mut resp = http
            .post(url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("POST {url}: {}", chain(&e)))?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("POST {url}: {}", chain(&e)))?
        {
            if body.len() + chunk.len() > max {
                return Err(format!("POST {url}: the answer is larger than {max} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        let v = serde_json::from_slice(&body)
            .map_err(|e| format!("POST {url}: status {status}, not JSON ({e})"))?;
        Ok((status, v))
    };
    tokio::time::timeout(deadline, fetch)
        .await
        .map_err(|_| format!("POST {url}: no answer within {} s", deadline.as_secs()))?
}
