//! Per-user upstream credentials for remote MCP servers (plugd.yaml
//! `mcp.servers.NAME.upstream_auth`, issue 28): a tool call of such a
//! server goes to the caller's own session with it
//! ([`plugd_host::supervisor::Supervised::for_user`]), authorized by the
//! caller's access token exchanged at its issuer (RFC 8693,
//! [`plugd_mcp_http::exchange`]).
//!
//! With `user_grants: true`, a user's own OAuth grant at the server, stored
//! by `plugd mcp login SERVER --user SUBJECT` (sealed under the owner
//! `@mcp-user:SERVER`, never a plugin's settings), is used for that user's
//! calls before any exchange; refreshed tokens are sealed back.
//!
//! A call without a user token (a `plugd_…` API token, the CLI, the Unix
//! socket, an agent turn with no OIDC caller) is refused with
//! [`RuntimeError::UpstreamAuth`] naming the server and why; plugd never
//! falls back to the server's own credential for it. The server's own
//! session (its `.mcp.json` headers or `plugd mcp login` grant) still
//! lists its catalog and serves resources and prompts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use plugd_host::dialect::CallContext;
use plugd_host::supervisor::Supervised;
use plugd_mcp_http::exchange::{ExchangeSettings, Exchanger, Secret, UserCredentials};

use crate::mcp_config::UpstreamAuth;
use crate::{Runtime, RuntimeError};

/// Server name → its `upstream_auth` and the exchanger it built (kept
/// across reloads while the settings stay the same, with their cache).
#[derive(Default)]
pub(crate) struct Upstreams {
    servers: Mutex<BTreeMap<String, Upstream>>,
}

/// One server's settings and, when it has `token_exchange`, its exchanger.
type Upstream = (UpstreamAuth, Option<Arc<Exchanger>>);

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Upstreams {
    /// Applies plugd.yaml's `upstream_auth` settings; returns the servers
    /// whose settings changed or went away (their user sessions must end).
    pub(crate) fn replace(&self, config: BTreeMap<String, UpstreamAuth>) -> Vec<String> {
        let mut map = locked(&self.servers);
        let mut changed: Vec<String> = map
            .iter()
            .filter(|(name, (old, _))| config.get(*name) != Some(old))
            .map(|(name, _)| name.clone())
            .collect();
        let mut next = BTreeMap::new();
        for (name, auth) in config {
            match map.remove(&name) {
                Some((old, x)) if old == auth => {
                    next.insert(name, (old, x));
                }
                _ => {
                    let x = exchanger(&name, &auth).map(Arc::new);
                    next.insert(name, (auth, x));
                }
            }
        }
        *map = next;
        changed.dedup();
        changed
    }

    fn get(&self, server: &str) -> Option<Upstream> {
        locked(&self.servers).get(server).cloned()
    }
}

/// The owner the per-user grants of `server` are sealed under (not a valid
/// plugin id, so no plugin's settings can shadow or read them).
pub fn user_grants_owner(server: &str) -> String {
    format!("@mcp-user:{server}")
}

fn exchanger(server: &str, auth: &UpstreamAuth) -> Option<Exchanger> {
    let tx = auth.token_exchange.as_ref()?;
    let issuer = reqwest::Url::parse(&tx.issuer).ok()?;
    let http = match plugd_mcp_http::oauth::http_client() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(plugin = %server, "no token exchange: {}", e.0);
            return None;
        }
    };
    Some(Exchanger::new(
        ExchangeSettings {
            server: server.to_owned(),
            issuer,
            audience: tx.audience.clone(),
            scope: tx.scope.clone(),
            client_id: tx.client_id.clone(),
        },
        http,
    ))
}

impl Runtime {
    /// Applies `upstream_auth` of plugd.yaml; the user sessions of a server
    /// whose settings changed are closed (the next call opens a new one).
    pub(crate) fn apply_upstream_auth(&self, config: BTreeMap<String, UpstreamAuth>) {
        for server in self.inner.upstreams.replace(config) {
            if let Ok(sup) = self.supervised(&server) {
                sup.close_user_sessions();
            }
        }
    }

    /// Where a tool call of `sup` goes: `None` for a server without
    /// `upstream_auth` (its own session), else the caller's own session,
    /// its token exchanged first (a refusal fails the call here, before
    /// anything reaches the server).
    pub(crate) async fn upstream_session(
        &self,
        sup: &Supervised,
        ctx: &CallContext,
    ) -> Result<Option<Supervised>, RuntimeError> {
        let server = sup.spec().id.clone();
        let Some((auth, exchanger)) = self.inner.upstreams.get(&server) else {
            return Ok(None);
        };
        let refuse = |message: String| RuntimeError::UpstreamAuth {
            server: server.clone(),
            message,
        };
        if !sup.spec().mcp.as_ref().is_some_and(|m| m.is_remote()) {
            return Err(refuse(
                "it is not a remote MCP server (no \"url\" in .mcp.json); upstream_auth applies to servers reached over HTTP only".into(),
            ));
        }
        let Some(user) = &ctx.user else {
            let who = ctx.caller.as_deref().unwrap_or("this caller");
            let issuers = auth.token_exchange.as_ref().map_or_else(
                || "an auth.issuers issuer".to_owned(),
                |t| format!("issuer {}", t.issuer),
            );
            return Err(refuse(format!(
                "{who} has no user token of its own (a plugd API token, the CLI, the Unix socket or an agent turn carries none), and plugd never sends a shared credential instead; call it with an access token of {issuers} on /mcp or /v1"
            )));
        };
        if auth.user_grants
            && let Some(stored) = self
                .user_grant(&server, &user.subject)
                .await
                .map_err(&refuse)?
        {
            let owner = user_grants_owner(&server);
            let persist = crate::mcp_remote::persister_at(
                self.inner.state.clone(),
                owner,
                user.subject.clone(),
            );
            let creds = plugd_mcp_http::oauth::OAuthCredentials::new(&server, stored, persist)
                .map_err(|e| refuse(e.0))?;
            return Ok(Some(
                sup.for_user(&format!("grant:{}", user.subject), move || {
                    Arc::new(creds) as Arc<dyn plugd_mcp_http::Credentials>
                }),
            ));
        }
        let (Some(tx), Some(exchanger)) = (&auth.token_exchange, exchanger) else {
            return Err(refuse(format!(
                "no OAuth grant of {} is stored for it; run `plugd mcp login {server} --user {}`",
                user.subject, user.subject
            )));
        };
        if user.issuer.trim_end_matches('/') != tx.issuer.trim_end_matches('/') {
            return Err(refuse(format!(
                "{}'s token is from issuer {}, and this server's token exchange is at {}; only that issuer can exchange it",
                user.subject, user.issuer, tx.issuer
            )));
        }
        exchanger.note_subject(&user.subject, user.token.clone());
        if !exchanger.has_token(&user.subject) {
            let secret = match &tx.client_secret {
                None => None,
                Some(name) => Some(
                    crate::host_secrets::open_secret(&*self.inner.state, name)
                        .await
                        .map_err(|e| refuse(format!("its client secret {name:?}: {e}")))?
                        .map(Secret::new)
                        .ok_or_else(|| {
                            refuse(format!(
                                "its client_secret names the secret {name:?}, which is not set; set it with `plugd secrets set {name}`"
                            ))
                        })?,
                ),
            };
            exchanger.set_client_secret(secret);
            exchanger
                .token_for(&user.subject)
                .await
                .map_err(|e| refuse(e.0))?;
        }
        let subject = user.subject.clone();
        Ok(Some(sup.for_user(
            &format!("exchange:{}", user.subject),
            move || {
                Arc::new(UserCredentials::new(exchanger, &subject))
                    as Arc<dyn plugd_mcp_http::Credentials>
            },
        )))
    }

    /// `subject`'s stored OAuth grant at `server` (`None`: none stored).
    async fn user_grant(
        &self,
        server: &str,
        subject: &str,
    ) -> Result<Option<plugd_mcp_http::oauth::Stored>, String> {
        let owner = user_grants_owner(server);
        let stored = self
            .inner
            .state
            .config_value(&owner, subject)
            .await
            .map_err(|e| e.to_string())?;
        let Some(plugd_store::secrets::StoredValue::Secret(sealed)) = stored else {
            return Ok(None);
        };
        let master = plugd_store::secrets::KeySource::from_env()
            .and_then(|s| s.require())
            .map_err(|e| format!("{subject}'s stored grant cannot be decrypted: {e}"))?;
        let plain = master
            .open(&owner, subject, &sealed)
            .map_err(|e| format!("{subject}'s stored grant cannot be decrypted: {e}"))?;
        serde_json::from_str(plain.as_str()).map(Some).map_err(|e| {
            format!("{subject}'s stored grant is unreadable ({e}); run `plugd mcp login {server} --user {subject}` again")
        })
    }

    /// Stores `subject`'s own OAuth grant at remote server `id` (what
    /// `plugd mcp login ID --user SUBJECT` obtained), sealed; the server's
    /// plugd.yaml `upstream_auth.user_grants` makes that user's calls use it.
    pub async fn mcp_login_store_user(
        &self,
        id: &str,
        subject: &str,
        stored: &plugd_mcp_http::oauth::Stored,
    ) -> Result<(), RuntimeError> {
        let config = |message: String| RuntimeError::Config {
            plugin: id.to_owned(),
            message,
        };
        if subject.trim().is_empty() || subject.len() > 512 || subject.contains(char::is_control) {
            return Err(config(format!(
                "{:?} is not a user; give the identity's name as plugd shows it (oidc:ISSUER-HOST/SUB)",
                subject.chars().take(80).collect::<String>()
            )));
        }
        let sealed =
            crate::mcp_remote::seal_at(&user_grants_owner(id), subject, stored).map_err(config)?;
        self.inner
            .state
            .put_sealed(&user_grants_owner(id), subject, &sealed)
            .await?;
        if let Ok(sup) = self.supervised(id) {
            sup.close_user_session(&format!("grant:{subject}"));
        }
        Ok(())
    }

    /// Forgets `subject`'s own grant at `id`; `false` when none was stored.
    pub async fn mcp_logout_user(&self, id: &str, subject: &str) -> Result<bool, RuntimeError> {
        let gone = self
            .inner
            .state
            .config_unset(&user_grants_owner(id), subject)
            .await?;
        if let Ok(sup) = self.supervised(id) {
            sup.close_user_session(&format!("grant:{subject}"));
        }
        Ok(gone)
    }
}
