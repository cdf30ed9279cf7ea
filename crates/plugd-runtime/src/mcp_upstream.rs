//! Per-user upstream credentials for remote MCP servers (plugd.yaml
//! `mcp.servers.NAME.upstream_auth`, issue 28): a tool call of such a
//! server goes to the caller's own session with it
//! ([`plugd_host::supervisor::Supervised::for_user`]), authorized by the
//! caller's access token exchanged at its issuer (RFC 8693,
//! [`plugd_mcp_http::exchange`]).
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
    servers: Mutex<BTreeMap<String, (UpstreamAuth, Arc<Exchanger>)>>,
}

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
                    let Some(x) = exchanger(&name, &auth) else {
                        continue;
                    };
                    next.insert(name, (auth, Arc::new(x)));
                }
            }
        }
        *map = next;
        changed.dedup();
        changed
    }

    fn get(&self, server: &str) -> Option<(UpstreamAuth, Arc<Exchanger>)> {
        locked(&self.servers).get(server).cloned()
    }
}

fn exchanger(server: &str, auth: &UpstreamAuth) -> Option<Exchanger> {
    let tx = &auth.token_exchange;
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
            return Err(refuse(format!(
                "{who} has no user token of its own (a plugd API token, the CLI, the Unix socket or an agent turn carries none), and plugd never sends a shared credential instead; call it with an access token of issuer {} on /mcp or /v1",
                auth.token_exchange.issuer
            )));
        };
        let tx = &auth.token_exchange;
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
        Ok(Some(sup.for_user(&user.subject, move || {
            Arc::new(UserCredentials::new(exchanger, &subject))
                as Arc<dyn plugd_mcp_http::Credentials>
        })))
    }
}
