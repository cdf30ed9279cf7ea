//! Remote (Streamable HTTP) MCP servers' secrets: the `${NAME}` values of
//! their headers (the operator's secrets, `plugd secrets set NAME`) and the
//! OAuth tokens of `plugd mcp login` (the server's setting [`OAUTH_KEY`]),
//! both sealed in the state database and handed to a start in its
//! [`Launch::remote`]. Refreshed tokens are written back sealed by the
//! transport; `plugd secrets rotate` re-seals them with the rest.

use std::sync::Arc;

use plugd_host::launch::{Launch, RemoteLaunch};
use plugd_manifest::PluginSpec;
use plugd_mcp_http::oauth::{ClientSettings, OAuthCredentials, Stored};
use plugd_store::StateStore;
use plugd_store::secrets::KeySource;
use serde_json::Value;

use crate::plugin_config::{Field, Kind};
use crate::{Runtime, RuntimeError};

/// The setting that holds a server's OAuth credentials (sealed JSON).
pub const OAUTH_KEY: &str = "oauth.credentials";

/// The settings of a remote server (none for anything else).
pub(crate) fn fields(spec: &PluginSpec) -> Vec<Field> {
    let Some(mcp) = spec.mcp.as_ref().filter(|m| m.is_remote()) else {
        return Vec::new();
    };
    let secret = |key: String, required: bool| Field {
        key,
        kind: Kind::Secret,
        required,
        label: Some("OAuth credentials".to_owned()),
        description: Some("the tokens of `plugd mcp login`, sealed".to_owned()),
        ..Field::default()
    };
    let _ = mcp;
    vec![secret(OAUTH_KEY.to_owned(), false)]
}

/// Fills `launch.remote` for a remote server from the values `launch.config`
/// holds (decrypted by [`crate::plugin_config::launch_for`]).
pub(crate) async fn prepare(
    store: &Arc<dyn StateStore>,
    spec: &PluginSpec,
    launch: &mut Launch,
) -> Result<(), String> {
    let Some(mcp) = spec.mcp.as_ref().filter(|m| m.is_remote()) else {
        return Ok(());
    };
    let config = launch.config.as_object().cloned().unwrap_or_default();
    let mut opened = std::collections::BTreeMap::new();
    for name in mcp.secret_names() {
        match crate::host_secrets::open_secret(&**store, &name).await? {
            Some(v) => {
                launch.redact.push(v.clone());
                opened.insert(name, v);
            }
            None => {
                return Err(format!(
                    "its .mcp.json entry sends the secret {name:?}, which is not set; set it with `plugd secrets set {name}`"
                ));
            }
        }
    }
    let mut headers = Vec::new();
    for (k, v) in &mcp.headers {
        let value = plugd_manifest::mcp::expand(v, |n| opened.get(n).cloned()).map_err(|name| {
            format!(
                "header {k:?} needs the secret {name:?}; set it with `plugd secrets set {name}`"
            )
        })?;
        headers.push((k.clone(), value));
    }
    let credentials = match config
        .get(OAUTH_KEY)
        .and_then(Value::as_str)
        .map(str::to_owned)
    {
        None => None,
        Some(text) => {
            let stored: Stored = serde_json::from_str(&text).map_err(|e| {
                format!("its stored OAuth credentials are unreadable ({e}); run `plugd mcp login {}` again", spec.id)
            })?;
            launch.redact.extend(stored.secrets());
            let persist = persister(store.clone(), spec.id.clone());
            let creds = OAuthCredentials::new(&spec.id, stored, persist).map_err(|e| e.0)?;
            Some(Arc::new(creds) as Arc<dyn plugd_mcp_http::Credentials>)
        }
    };
    launch.remote = Some(Arc::new(RemoteLaunch {
        headers,
        credentials,
    }));
    Ok(())
}

/// Writes refreshed tokens back, sealed. The refresh callback is
/// synchronous: the tokens are sealed in it and the write goes to a task
/// (the tokens in use are the refreshed ones either way).
fn persister(store: Arc<dyn StateStore>, id: String) -> plugd_mcp_http::oauth::Persist {
    persister_at(store, id, OAUTH_KEY.to_owned())
}

/// [`persister`] writing to setting `key` of `owner` (a user's own grant:
/// `crate::mcp_upstream`).
pub(crate) fn persister_at(
    store: Arc<dyn StateStore>,
    id: String,
    key: String,
) -> plugd_mcp_http::oauth::Persist {
    Arc::new(move |stored: &Stored| {
        let sealed = seal_at(&id, &key, stored)?;
        let (store, id, key) = (store.clone(), id.clone(), key.clone());
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "cannot store the OAuth tokens: no async runtime".to_owned())?;
        handle.spawn(async move {
            if let Err(e) = store.put_sealed(&id, &key, &sealed).await {
                tracing::warn!(plugin = %id, error = %e, "could not store the refreshed OAuth tokens");
            }
        });
        Ok(())
    })
}

/// The credentials of `id`, sealed with the master key.
fn seal_credentials(id: &str, stored: &Stored) -> Result<plugd_store::secrets::Sealed, String> {
    seal_at(id, OAUTH_KEY, stored)
}

/// OAuth credentials sealed as setting `key` of `owner`.
pub(crate) fn seal_at(
    owner: &str,
    key: &str,
    stored: &Stored,
) -> Result<plugd_store::secrets::Sealed, String> {
    let master = KeySource::from_env()
        .and_then(|s| s.load_or_create())
        .map_err(|e| format!("cannot seal the OAuth tokens: {e}"))?;
    let text = serde_json::to_string(stored).map_err(|e| e.to_string())?;
    master
        .seal(owner, key, text.as_bytes())
        .map_err(|e| e.to_string())
}

async fn store_credentials(
    store: &dyn StateStore,
    id: &str,
    stored: &Stored,
) -> Result<(), String> {
    let sealed = seal_credentials(id, stored)?;
    store
        .put_sealed(id, OAUTH_KEY, &sealed)
        .await
        .map_err(|e| e.to_string())
}

/// What `plugd mcp login SERVER` needs: the server's URL and client settings.
#[derive(Debug, Clone)]
pub struct LoginTarget {
    /// The MCP endpoint.
    pub url: reqwest::Url,
    /// The `.mcp.json` `oauth` settings, the client secret filled in.
    pub settings: ClientSettings,
}

impl Runtime {
    /// The remote server `id` and its client settings, for a login.
    pub async fn mcp_login_target(&self, id: &str) -> Result<LoginTarget, RuntimeError> {
        let sup = self.supervised(id)?;
        let spec = sup.spec();
        let not_remote = || RuntimeError::Config {
            plugin: id.to_owned(),
            message: format!(
                "{id:?} is not a remote MCP server; `plugd mcp login` authorizes servers declared with a \"url\" in .mcp.json"
            ),
        };
        let mcp = spec
            .mcp
            .as_ref()
            .filter(|m| m.is_remote())
            .ok_or_else(not_remote)?;
        let url = reqwest::Url::parse(mcp.url.as_deref().unwrap_or_default()).map_err(|e| {
            RuntimeError::Config {
                plugin: id.to_owned(),
                message: format!("its url is not usable: {e}"),
            }
        })?;
        let oauth = mcp.oauth.clone().unwrap_or_default();
        let client_secret = match &oauth.client_secret {
            None => None,
            Some(template) => {
                // The host secrets, read once; only those the template
                // names are opened.
                let stored: std::collections::HashMap<String, _> = self
                    .inner
                    .state
                    .config_values(crate::host_secrets::HOST_SECRETS)
                    .await?
                    .into_iter()
                    .collect();
                let mut failure = None;
                let value =
                    plugd_manifest::mcp::expand(
                        template,
                        |n| match crate::host_secrets::open_stored(n, stored.get(n).cloned()) {
                            Ok(v) => v,
                            Err(e) => {
                                failure = Some(e);
                                None
                            }
                        },
                    );
                let value = value.map_err(|name| RuntimeError::Config {
                    plugin: id.to_owned(),
                    message: failure.take().unwrap_or_else(|| {
                        format!("oauth.clientSecret needs the secret {name:?}; set it with `plugd secrets set {name}`")
                    }),
                })?;
                Some(value)
            }
        };
        Ok(LoginTarget {
            url,
            settings: ClientSettings {
                client_id: oauth.client_id,
                client_secret,
                client_metadata_url: oauth.client_metadata_url,
                scope: oauth.scope,
                callback_port: oauth.callback_port.unwrap_or(0),
            },
        })
    }

    /// Stores what a login obtained (sealed) and applies it: a running
    /// server is restarted with the new tokens, a failed one gets a fresh start.
    pub async fn mcp_login_store(
        &self,
        id: &str,
        stored: &Stored,
    ) -> Result<crate::plugin_config::Applied, RuntimeError> {
        store_credentials(&*self.inner.state, id, stored)
            .await
            .map_err(|message| RuntimeError::Config {
                plugin: id.to_owned(),
                message,
            })?;
        self.config_apply(id).await
    }
}
