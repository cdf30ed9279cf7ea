//! OAuth 2.0 Token Exchange (RFC 8693) for remote MCP servers that must see
//! each user's own token (plugd.yaml `mcp.servers.NAME.upstream_auth`):
//! the caller's access token, which plugd validated, is the
//! `subject_token` of a request to the issuer's token endpoint, and the
//! token it answers for the upstream's audience (RFC 8707 `resource` and
//! `audience`) is what that user's session with the server sends.
//!
//! The `oauth2` crate has no token-exchange grant, so the request is a
//! small typed form POST on the no-redirect client: its reply bounded
//! ([`MAX_REPLY`]) and its wait bounded ([`EXCHANGE_TIMEOUT`]).
//!
//! **Invariant**: a token (the caller's, the exchanged one, the client
//! secret) is never in a message, a log line or a `Debug` output; an
//! exchanged token is cached per subject only ([`Exchanger`]: at most
//! [`MAX_SUBJECTS`] subjects, each until [`crate::oauth::EXPIRY_MARGIN`]
//! before its `expires_in`) and handed only to that subject's session
//! ([`UserCredentials`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use reqwest::Url;
use reqwest::header;
use serde::Deserialize;
use serde_json::Value;

use crate::oauth::{EXPIRY_MARGIN, MAX_DOCUMENT, check_issuer, get_json, read_bounded};
use crate::transport::Credentials;

/// The `grant_type` of RFC 8693.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The `subject_token_type` (and `requested_token_type`) plugd sends.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
/// How long one exchange (discovery included) may take.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest token-endpoint reply read.
pub const MAX_REPLY: usize = 64 * 1024;
/// Most subjects whose exchanged tokens one server keeps; the least
/// recently used is forgotten beyond it.
pub const MAX_SUBJECTS: usize = 1024;
/// Lifetime assumed for an exchanged token whose reply has no `expires_in`.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// A secret string whose `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<Arc<str>>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(••••)")
    }
}

/// Why an exchange failed: a sentence naming the issuer and the cause,
/// never a token.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ExchangeError(pub String);

/// What one server's exchanges send (from plugd.yaml).
#[derive(Clone, PartialEq, Eq)]
pub struct ExchangeSettings {
    /// The server (`.mcp.json` key), for messages.
    pub server: String,
    /// The issuer (one of `auth.issuers`); its discovery document names the
    /// token endpoint.
    pub issuer: Url,
    /// The upstream's resource: sent as `resource` (RFC 8707) and
    /// `audience` (RFC 8693).
    pub audience: String,
    /// `scope`, when set.
    pub scope: Option<String>,
    /// plugd's client at the issuer.
    pub client_id: String,
}

impl std::fmt::Debug for ExchangeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangeSettings")
            .field("server", &self.server)
            .field("issuer", &self.issuer.as_str())
            .field("audience", &self.audience)
            .field("scope", &self.scope)
            .field("client_id", &self.client_id)
            .finish()
    }
}

struct Cached {
    /// The subject's latest access token (what the next exchange sends).
    subject_token: Secret,
    /// The exchanged token and when plugd stops using it.
    exchanged: Option<(Secret, Instant)>,
    /// When it was last used, on [`Exchanger`]'s tick.
    used: u64,
}

/// The token exchanges of one server: the token endpoint, found once, and
/// the exchanged tokens, per subject.
pub struct Exchanger {
    settings: ExchangeSettings,
    http: reqwest::Client,
    endpoint: tokio::sync::OnceCell<Url>,
    client_secret: Mutex<Option<Secret>>,
    subjects: Mutex<HashMap<String, Cached>>,
    /// One exchange at a time per server (concurrent first calls of one
    /// subject exchange once).
    exchanging: tokio::sync::Mutex<()>,
    tick: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Exchanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchanger")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Deserialize)]
struct Issued {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl Exchanger {
    /// The exchanges of `settings` over `http` (a client that follows no
    /// redirects: [`crate::oauth::http_client`]).
    pub fn new(settings: ExchangeSettings, http: reqwest::Client) -> Exchanger {
        Exchanger {
            settings,
            http,
            endpoint: tokio::sync::OnceCell::new(),
            client_secret: Mutex::new(None),
            subjects: Mutex::new(HashMap::new()),
            exchanging: tokio::sync::Mutex::new(()),
            tick: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// What this exchanger sends.
    pub fn settings(&self) -> &ExchangeSettings {
        &self.settings
    }

    /// Sets the client secret (resolved from the operator's secrets by the
    /// runtime before each exchange it starts; `None`: a public client).
    pub fn set_client_secret(&self, secret: Option<Secret>) {
        *locked(&self.client_secret) = secret;
    }

    /// Remembers `token` as `subject`'s latest access token (the next
    /// exchange for `subject` sends it).
    pub fn note_subject(&self, subject: &str, token: Secret) {
        let now = self.now();
        let mut map = locked(&self.subjects);
        if let Some(c) = map.get_mut(subject) {
            c.subject_token = token;
            c.used = now;
            return;
        }
        if map.len() >= MAX_SUBJECTS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            subject.to_owned(),
            Cached {
                subject_token: token,
                exchanged: None,
                used: now,
            },
        );
    }

    fn now(&self) -> u64 {
        self.tick.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The cached exchanged token of `subject`, when it is still good.
    fn cached(&self, subject: &str) -> Option<Secret> {
        let now = self.now();
        let mut map = locked(&self.subjects);
        let c = map.get_mut(subject)?;
        c.used = now;
        match &c.exchanged {
            Some((t, until)) if Instant::now() < *until => Some(t.clone()),
            _ => None,
        }
    }

    /// Forgets `subject`'s exchanged token (the upstream refused it).
    pub fn forget_exchanged(&self, subject: &str) {
        if let Some(c) = locked(&self.subjects).get_mut(subject) {
            c.exchanged = None;
        }
    }

    /// Whether `subject` has an exchanged token still good (no exchange
    /// needed to call now).
    pub fn has_token(&self, subject: &str) -> bool {
        self.cached(subject).is_some()
    }

    /// `subject`'s token for the upstream: the cached one, else a new
    /// exchange of the subject's latest token.
    pub async fn token_for(&self, subject: &str) -> Result<Secret, ExchangeError> {
        if let Some(t) = self.cached(subject) {
            return Ok(t);
        }
        let _one = self.exchanging.lock().await;
        if let Some(t) = self.cached(subject) {
            return Ok(t);
        }
        let subject_token = locked(&self.subjects)
            .get(subject)
            .map(|c| c.subject_token.clone())
            .ok_or_else(|| {
                ExchangeError(format!(
                    "MCP server {:?} needs {subject}'s own token, and plugd has none from {subject} (call it again as that user)",
                    self.settings.server
                ))
            })?;
        let (token, lifetime) =
            tokio::time::timeout(EXCHANGE_TIMEOUT, self.exchange(&subject_token))
                .await
                .map_err(|_| {
                    self.fail(format!("no answer within {}s", EXCHANGE_TIMEOUT.as_secs()))
                })??;
        let until = Instant::now() + lifetime.saturating_sub(EXPIRY_MARGIN);
        if let Some(c) = locked(&self.subjects).get_mut(subject) {
            c.exchanged = Some((token.clone(), until));
        }
        Ok(token)
    }

    fn fail(&self, why: String) -> ExchangeError {
        ExchangeError(format!(
            "the token exchange for MCP server {:?} at {} failed: {why}",
            self.settings.server, self.settings.issuer
        ))
    }

    async fn token_endpoint(&self) -> Result<Url, ExchangeError> {
        self.endpoint
            .get_or_try_init(|| async {
                let issuer = &self.settings.issuer;
                let base = issuer.as_str().trim_end_matches('/');
                let mut doc = None;
                for suffix in [
                    "/.well-known/openid-configuration",
                    "/.well-known/oauth-authorization-server",
                ] {
                    let url = Url::parse(&format!("{base}{suffix}"))
                        .map_err(|e| self.fail(format!("the discovery URL: {e}")))?;
                    if let Some(d) = get_json(&self.http, &url)
                        .await
                        .map_err(|e| self.fail(e.0))?
                    {
                        doc = Some(d);
                        break;
                    }
                }
                let doc = doc.ok_or_else(|| {
                    self.fail("the issuer serves no discovery document".to_owned())
                })?;
                check_issuer(
                    issuer.as_str().trim_end_matches('/'),
                    issuer,
                    doc.get("issuer").and_then(Value::as_str),
                )
                .map_err(|e| self.fail(e.0))?;
                let endpoint = doc
                    .get("token_endpoint")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        self.fail("its discovery document names no token_endpoint".to_owned())
                    })?;
                let url = Url::parse(endpoint)
                    .map_err(|e| self.fail(format!("its token_endpoint is not a URL: {e}")))?;
                if !crate::oauth::secure_enough(&url) {
                    return Err(self.fail(format!(
                        "its token_endpoint {url} is plain http to a host that is not loopback"
                    )));
                }
                Ok(url)
            })
            .await
            .cloned()
    }

    async fn exchange(&self, subject_token: &Secret) -> Result<(Secret, Duration), ExchangeError> {
        let endpoint = self.token_endpoint().await?;
        let s = &self.settings;
        let mut form: Vec<(&str, &str)> = vec![
            ("grant_type", GRANT_TYPE),
            ("subject_token", subject_token.expose()),
            ("subject_token_type", ACCESS_TOKEN_TYPE),
            ("requested_token_type", ACCESS_TOKEN_TYPE),
            ("resource", &s.audience),
            ("audience", &s.audience),
        ];
        if let Some(scope) = &s.scope {
            form.push(("scope", scope));
        }
        let secret = locked(&self.client_secret).clone();
        let mut req = self
            .http
            .post(endpoint.clone())
            .header(header::ACCEPT, "application/json");
        match &secret {
            // client_secret_basic (RFC 6749 2.3.1: both form-encoded first).
            Some(secret) => {
                let enc = |t: &str| {
                    url::form_urlencoded::byte_serialize(t.as_bytes()).collect::<String>()
                };
                use base64::Engine as _;
                let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                    "{}:{}",
                    enc(&s.client_id),
                    enc(secret.expose())
                ));
                let mut v =
                    header::HeaderValue::from_str(&format!("Basic {basic}")).map_err(|_| {
                        self.fail("the client credentials are not a valid header".to_owned())
                    })?;
                v.set_sensitive(true);
                req = req.header(header::AUTHORIZATION, v);
            }
            None => form.push(("client_id", &s.client_id)),
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&form)
            .finish();
        let resp = req
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                self.fail(format!(
                    "cannot reach {endpoint}: {}",
                    without_url_query(&e)
                ))
            })?;
        let status = resp.status();
        let body = read_bounded(resp, MAX_REPLY.min(MAX_DOCUMENT))
            .await
            .map_err(|e| self.fail(e))?;
        let scrub = |text: &str| {
            let mut t: String = text.chars().take(300).collect();
            for hidden in [Some(subject_token), secret.as_ref()].into_iter().flatten() {
                if !hidden.expose().is_empty() {
                    t = t.replace(hidden.expose(), "••••");
                }
            }
            t
        };
        if !status.is_success() {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let code = v
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error code");
            let what = v
                .get("error_description")
                .and_then(Value::as_str)
                .map(|d| format!(" ({})", scrub(d)))
                .unwrap_or_default();
            return Err(self.fail(format!(
                "the issuer refused it with {status}: {}{what}",
                scrub(code)
            )));
        }
        let issued: Issued = serde_json::from_slice(&body)
            .map_err(|_| self.fail("the issuer's answer has no access_token".to_owned()))?;
        if let Some(t) = &issued.token_type
            && !t.eq_ignore_ascii_case("bearer")
            && !t.eq_ignore_ascii_case("N_A")
        {
            return Err(self.fail(format!(
                "the issuer answered a token of type {:?}; plugd sends bearer tokens only",
                scrub(t)
            )));
        }
        if issued.access_token.is_empty() {
            return Err(self.fail("the issuer answered an empty access_token".to_owned()));
        }
        let lifetime = issued
            .expires_in
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        tracing::debug!(plugin = %s.server, lifetime_s = lifetime.as_secs(), "exchanged a token for the upstream");
        Ok((Secret::new(issued.access_token), lifetime))
    }
}

/// A reqwest error's text without the URL's query (none is sent here, but
/// the error text is for a message).
fn without_url_query(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url()
        && let Some(q) = u.query()
    {
        s = s.replace(q, "…");
    }
    s
}

/// The bearer tokens of one subject's session with the server: the
/// exchanged token of that subject, never another's.
pub struct UserCredentials {
    exchanger: Arc<Exchanger>,
    subject: String,
}

impl UserCredentials {
    /// `subject`'s credentials through `exchanger`.
    pub fn new(exchanger: Arc<Exchanger>, subject: &str) -> UserCredentials {
        UserCredentials {
            exchanger,
            subject: subject.to_owned(),
        }
    }
}

impl std::fmt::Debug for UserCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserCredentials")
            .field("server", &self.exchanger.settings.server)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Credentials for UserCredentials {
    fn token(&self) -> BoxFuture<'_, Result<Option<String>, String>> {
        Box::pin(async move {
            self.exchanger
                .token_for(&self.subject)
                .await
                .map(|t| Some(t.expose().to_owned()))
                .map_err(|e| e.0)
        })
    }

    fn refresh(&self, _rejected: Option<String>) -> BoxFuture<'_, Result<String, String>> {
        Box::pin(async move {
            self.exchanger.forget_exchanged(&self.subject);
            self.exchanger
                .token_for(&self.subject)
                .await
                .map(|t| t.expose().to_owned())
                .map_err(|e| e.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchanger() -> Exchanger {
        Exchanger::new(
            ExchangeSettings {
                server: "notes".into(),
                issuer: Url::parse("http://127.0.0.1:9").unwrap(),
                audience: "http://127.0.0.1:8/mcp".into(),
                scope: None,
                client_id: "plugd".into(),
            },
            crate::oauth::http_client().unwrap(),
        )
    }

    #[test]
    fn debug_output_never_shows_a_token_or_secret() {
        let x = exchanger();
        x.note_subject("oidc:h/alice", Secret::new("eyJ.alice-subject-token.sig"));
        x.set_client_secret(Some(Secret::new("s3cr3t-client")));
        let x = Arc::new(x);
        let shown = format!(
            "{x:?} {:?} {:?}",
            Secret::new("abc-token"),
            UserCredentials::new(x.clone(), "oidc:h/alice")
        );
        for hidden in ["alice-subject-token", "s3cr3t-client", "abc-token"] {
            assert!(!shown.contains(hidden), "{shown}");
        }
        assert!(shown.contains("notes"), "{shown}");
    }

    #[tokio::test]
    async fn a_subject_plugd_has_no_token_of_is_refused_by_name() {
        let x = exchanger();
        let e = x.token_for("oidc:h/bob").await.unwrap_err().0;
        assert!(e.contains("oidc:h/bob") && e.contains("\"notes\""), "{e}");
    }

    /// A one-route-per-path HTTP/1.1 authorization server on loopback:
    /// discovery names `/token`; `/token` answers `token` (status, body,
    /// extra header lines) and records each request (head and body).
    struct Fake {
        base: String,
        seen: Arc<Mutex<Vec<(String, String)>>>,
    }

    async fn fake(
        issuer_in_doc: Option<&str>,
        token: impl Fn() -> (u16, String, String) + Send + Sync + 'static,
    ) -> Fake {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let doc_issuer = issuer_in_doc.map_or_else(|| base.clone(), str::to_owned);
        let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let (log, token, tb) = (seen.clone(), Arc::new(token), base.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (log, token, base, doc_issuer) =
                    (log.clone(), token.clone(), tb.clone(), doc_issuer.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (head, body) = loop {
                        let n = sock.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).into_owned();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let len = head
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if body.len() >= len {
                                break (head.to_owned(), body.to_owned());
                            }
                        }
                    };
                    let (status, reply, extra) = if head
                        .starts_with("GET /.well-known/openid-configuration")
                    {
                        let doc = serde_json::json!({"issuer": doc_issuer, "token_endpoint": format!("{base}/token")});
                        (200, doc.to_string(), String::new())
                    } else if head.starts_with("POST /token") {
                        log.lock().unwrap().push((head, body));
                        token()
                    } else {
                        (404, "{}".to_owned(), String::new())
                    };
                    let out = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{reply}",
                        reply.len()
                    );
                    let _ = sock.write_all(out.as_bytes()).await;
                });
            }
        });
        Fake { base, seen }
    }

    fn at(base: &str, secret: Option<&str>) -> Exchanger {
        let x = Exchanger::new(
            ExchangeSettings {
                server: "notes".into(),
                issuer: Url::parse(base).unwrap(),
                audience: "https://notes.example/mcp".into(),
                scope: Some("notes:read".into()),
                client_id: "plugd x".into(),
            },
            crate::oauth::http_client().unwrap(),
        );
        x.set_client_secret(secret.map(Secret::new));
        x.note_subject("oidc:h/alice", Secret::new("alice-subject-token"));
        x
    }

    #[tokio::test]
    async fn an_exchange_sends_rfc_8693_and_is_cached_per_subject_until_near_expiry() {
        let f = fake(None, || {
            (
                200,
                r#"{"access_token":"up-1","token_type":"Bearer","expires_in":3600}"#.into(),
                String::new(),
            )
        })
        .await;
        let x = at(&f.base, Some("s3cret:&"));
        assert_eq!(x.token_for("oidc:h/alice").await.unwrap().expose(), "up-1");
        assert_eq!(x.token_for("oidc:h/alice").await.unwrap().expose(), "up-1");
        let seen = f.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "cached: {seen:?}");
        let (head, body) = &seen[0];
        let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        assert_eq!(form["grant_type"], GRANT_TYPE);
        assert_eq!(form["subject_token"], "alice-subject-token");
        assert_eq!(form["subject_token_type"], ACCESS_TOKEN_TYPE);
        assert_eq!(form["audience"], "https://notes.example/mcp");
        assert_eq!(form["resource"], "https://notes.example/mcp");
        assert_eq!(form["scope"], "notes:read");
        assert!(!form.contains_key("client_id"), "{form:?}");
        // client_secret_basic, both parts form-encoded first (RFC 6749 2.3.1).
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode("plugd+x:s3cret%3A%26");
        assert!(
            head.to_ascii_lowercase().contains(&format!(
                "authorization: basic {}",
                basic.to_ascii_lowercase()
            )),
            "{head}"
        );
        // Another subject has no token of its own: refused, not alice's.
        assert!(x.token_for("oidc:h/bob").await.is_err());
        // A token that expires within the margin is not kept.
        let g = fake(None, || {
            (
                200,
                r#"{"access_token":"short","expires_in":5}"#.into(),
                String::new(),
            )
        })
        .await;
        let y = at(&g.base, None);
        y.token_for("oidc:h/alice").await.unwrap();
        y.token_for("oidc:h/alice").await.unwrap();
        assert_eq!(g.seen.lock().unwrap().len(), 2);
        let form: HashMap<String, String> =
            url::form_urlencoded::parse(g.seen.lock().unwrap()[0].1.as_bytes())
                .into_owned()
                .collect();
        assert_eq!(form["client_id"], "plugd x", "a public client names itself");
    }

    #[tokio::test]
    async fn hostile_token_endpoints_fail_the_exchange_by_name_without_a_token() {
        let cases: Vec<(u16, String, String, &str)> = vec![
            (
                400,
                r#"{"error":"invalid_grant","error_description":"alice-subject-token is not welcome, s3cret"}"#.into(),
                String::new(),
                "invalid_grant",
            ),
            (200, format!(r#"{{"access_token":"{}"}}"#, "x".repeat(MAX_REPLY)), String::new(), "over"),
            (302, "{}".into(), "location: http://127.0.0.1:9/steal\r\n".into(), "302"),
            (200, r#"{"access_token":"t","token_type":"DPoP"}"#.into(), String::new(), "bearer tokens only"),
            (200, r#"{"token":"t"}"#.into(), String::new(), "no access_token"),
            (200, r#"{"access_token":""}"#.into(), String::new(), "empty access_token"),
            (200, "not json".into(), String::new(), "no access_token"),
        ];
        for (status, body, extra, want) in cases {
            let reply = (status, body.clone(), extra);
            let f = fake(None, move || reply.clone()).await;
            let x = at(&f.base, Some("s3cret"));
            let e = x.token_for("oidc:h/alice").await.unwrap_err().0;
            assert!(e.contains(want) && e.contains("\"notes\""), "{want}: {e}");
            assert!(
                !e.contains("alice-subject-token") && !e.contains("s3cret"),
                "{e}"
            );
        }
        // Discovery that names another issuer: its endpoints are not used.
        let f = fake(Some("https://evil.example"), || {
            (200, "{}".into(), String::new())
        })
        .await;
        let e = at(&f.base, None)
            .token_for("oidc:h/alice")
            .await
            .unwrap_err()
            .0;
        assert!(e.contains("evil.example"), "{e}");
        assert!(
            f.seen.lock().unwrap().is_empty(),
            "nothing sent to its token endpoint"
        );
    }

    #[test]
    fn subjects_are_bounded_least_recently_used_first() {
        let x = exchanger();
        for i in 0..MAX_SUBJECTS + 5 {
            x.note_subject(&format!("s{i}"), Secret::new(format!("t{i}")));
        }
        let map = locked(&x.subjects);
        assert_eq!(map.len(), MAX_SUBJECTS);
        assert!(!map.contains_key("s0"));
        assert!(map.contains_key(&format!("s{}", MAX_SUBJECTS + 4)));
    }
}
