//! Delegated credentials at run time: the tokens minted for one VAI
//! invocation (`context.gateway`), kept in memory only, valid until the
//! invocation's deadline and revoked the moment it ends.
//!
//! A token is `vai_dlg_` and 64 hex digits from the OS generator; the
//! registry keeps its SHA-256 only, so a dump of serve's memory maps
//! shows no usable token. [`Delegations::mint`] returns a [`Minted`]
//! whose drop revokes it: whatever way the invocation ends (answer,
//! error, timeout, a caller that went away), the token dies with it.
//!
//! Where plugins reach the API (`base_url`) is set by the surface that
//! serves it ([`Delegations::set_base_url`]): `plugd serve` and the CLI's
//! harness and turn commands start a loopback listener for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use plugd_control::delegation::{Delegation, TOKEN_PREFIX};
use plugd_host::dialect::GatewayGrant;
use sha2::{Digest, Sha256};

/// Most live delegation tokens at once; minting past it fails the
/// invocation's delegation (the call still runs, without a token).
pub const MAX_LIVE: usize = 10_000;

type Key = [u8; 32];

/// The live delegation tokens of a runtime.
#[derive(Default)]
pub struct Delegations {
    live: Mutex<HashMap<Key, Arc<Delegation>>>,
    base_url: RwLock<Option<String>>,
}

impl std::fmt::Debug for Delegations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delegations")
            .field("live", &self.live_count())
            .finish()
    }
}

fn key(token: &str) -> Key {
    Sha256::digest(token.as_bytes()).into()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A minted token; dropping it revokes the token.
pub struct Minted {
    owner: Arc<Delegations>,
    key: Key,
    /// What goes into `context.gateway`.
    pub grant: GatewayGrant,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted")
            .field("scopes", &self.grant.scopes)
            .finish()
    }
}

impl Drop for Minted {
    fn drop(&mut self) {
        self.owner.revoke_key(&self.key);
    }
}

impl Delegations {
    /// Sets where plugins reach plugd's API (`http://127.0.0.1:PORT`).
    pub fn set_base_url(&self, url: Option<String>) {
        *self.base_url.write().unwrap_or_else(|p| p.into_inner()) = url;
    }

    /// The address of the API's loopback listener, when something serves it.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.base_url()?.strip_prefix("http://")?.parse().ok()
    }

    /// Gives a sandboxed process of `spec` a route to plugd's API when the
    /// package has exports with `gateway_api_scopes` and the API is served:
    /// a sandbox without network gets plugd's egress proxy with that one
    /// route (the plugin uses `base_url` unchanged, through the proxy
    /// variables); a host-network sandbox reaches it directly. Every request
    /// on that route still needs the invocation's token.
    pub fn route_gateway(
        &self,
        spec: &plugd_manifest::PluginSpec,
        containment: &mut plugd_host::sandbox::Containment,
    ) {
        let wants = spec.vai.as_ref().is_some_and(|v| {
            v.exports
                .iter()
                .any(|e| !e.permissions.gateway_api_scopes.is_empty())
        });
        if let (true, Some(addr), Some(plan)) = (wants, self.addr(), containment.sandbox.as_mut()) {
            plan.allow_gateway(addr);
        }
    }

    /// Where plugins reach plugd's API, when something serves it.
    pub fn base_url(&self) -> Option<String> {
        self.base_url
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Mints a token for `d`, valid for `ttl` (the invocation's deadline)
    /// unless revoked first. `None` when no randomness or too many live.
    pub fn mint(self: &Arc<Self>, mut d: Delegation, ttl: Duration) -> Option<Minted> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).ok()?;
        let token = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
        let k = key(&token);
        d.expires_at_ms = now_ms().saturating_add(ttl.as_millis() as u64);
        let scopes = d.scopes.clone();
        {
            let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            let now = now_ms();
            live.retain(|_, v| v.expires_at_ms > now);
            if live.len() >= MAX_LIVE {
                tracing::warn!(export = %d.export, "too many live delegation tokens; this invocation gets none");
                return None;
            }
            live.insert(k, Arc::new(d));
        }
        Some(Minted {
            owner: self.clone(),
            key: k,
            grant: GatewayGrant {
                base_url: self.base_url(),
                delegation_token: token,
                scopes,
            },
        })
    }

    /// The delegation `token` stands for, when live and not expired.
    pub fn verify(&self, token: &str) -> Option<Arc<Delegation>> {
        if !token.starts_with(TOKEN_PREFIX) {
            return None;
        }
        let k = key(token);
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.get(&k).filter(|d| d.expires_at_ms > now_ms()).cloned()
    }

    fn revoke_key(&self, k: &Key) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(k);
    }

    /// How many tokens are live (for tests and metrics).
    pub fn live_count(&self) -> usize {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl crate::Runtime {
    /// The live delegation tokens, and where plugins reach the API.
    pub fn delegations(&self) -> &Arc<Delegations> {
        &self.inner.delegations
    }

    /// Mints the delegation of one invocation of `export_id` of `spec`
    /// when the export asks for gateway scopes (`gateway_api_scopes`):
    /// bound to `ctx`'s org, project, session, chain and run, valid for
    /// `ttl` (the call's deadline). Scopes plugd does not know are left
    /// out with a warning.
    pub fn delegate(
        &self,
        spec: &plugd_manifest::PluginSpec,
        export_id: &str,
        ctx: &plugd_host::dialect::CallContext,
        ttl: Duration,
    ) -> Option<Minted> {
        self.delegate_within(spec, export_id, ctx, ttl, None)
    }

    /// [`Runtime::delegate`] with a ceiling: the scopes of the delegation
    /// that caused this invocation (a harness starting a child harness), so
    /// no chain of runs holds more than the run that started it.
    pub fn delegate_within(
        &self,
        spec: &plugd_manifest::PluginSpec,
        export_id: &str,
        ctx: &plugd_host::dialect::CallContext,
        ttl: Duration,
        ceiling: Option<&[String]>,
    ) -> Option<Minted> {
        let export = spec.vai.as_ref()?.export(export_id)?;
        if export.permissions.gateway_api_scopes.is_empty() {
            return None;
        }
        let ttl = export.default_timeout.map_or(ttl, |d| d.min(ttl));
        let (scopes, unknown) =
            plugd_control::delegation::granted(&export.permissions.gateway_api_scopes, ceiling);
        if !unknown.is_empty() {
            tracing::warn!(plugin = %spec.id, export = export_id, ?unknown, "gateway_api_scopes plugd does not know are not granted");
        }
        if scopes.is_empty() {
            return None;
        }
        let d = Delegation {
            invocation_id: ctx.invocation_id.clone().unwrap_or_default(),
            export: format!("{}/{export_id}", spec.id),
            scopes,
            org_id: ctx.org_id.clone(),
            project_id: ctx.project_id.clone(),
            session_id: ctx.session_id.clone(),
            chain_id: ctx.chain_id.clone(),
            run_id: ctx.run_id.clone(),
            expires_at_ms: 0,
        };
        self.inner.delegations.mint(d, ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delegation() -> Delegation {
        Delegation {
            invocation_id: "inv_1".into(),
            export: "acme/kit/triage".into(),
            scopes: vec!["chains:read".into()],
            org_id: None,
            project_id: None,
            session_id: Some("s".into()),
            chain_id: None,
            run_id: None,
            expires_at_ms: 0,
        }
    }

    #[test]
    fn tokens_live_until_dropped_or_expired() {
        let reg = Arc::new(Delegations::default());
        reg.set_base_url(Some("http://127.0.0.1:1".into()));
        let m = reg.mint(delegation(), Duration::from_secs(60)).unwrap();
        let token = m.grant.delegation_token.clone();
        assert!(token.starts_with("vai_dlg_") && token.len() == 8 + 64);
        assert_eq!(m.grant.base_url.as_deref(), Some("http://127.0.0.1:1"));
        let d = reg.verify(&token).unwrap();
        assert!(d.allows("chains:read") && !d.allows("chains:write"));
        assert!(reg.verify("vai_dlg_00").is_none());
        assert!(reg.verify(&token.replace("vai_dlg_", "plugd_")).is_none());
        drop(m);
        assert!(
            reg.verify(&token).is_none(),
            "revoked when the invocation ends"
        );
        let short = reg.mint(delegation(), Duration::ZERO).unwrap();
        assert!(
            reg.verify(&short.grant.delegation_token).is_none(),
            "expired at the deadline"
        );
        drop(short);
        assert_eq!(reg.live_count(), 0);
        // The registry keeps hashes, never the token.
        let m = reg.mint(delegation(), Duration::from_secs(60)).unwrap();
        assert!(!format!("{reg:?}{m:?}").contains(&m.grant.delegation_token[8..]));
    }
}
