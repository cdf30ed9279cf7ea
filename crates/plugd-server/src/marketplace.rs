//! The marketplace over HTTP, and the install step `plugd marketplace
//! install` shares:
//!
//! | route | right |
//! |-------|-------|
//! | `GET /v1/marketplace` | viewer (org tokens too) |
//! | `GET /v1/marketplace/{entry_id}` | viewer (org tokens too) |
//! | `POST /v1/marketplace/{entry_id}:install` (`{"org_id", "project_id"?, "config"?, "secrets"?}`) | operator |
//!
//! Install = pull the entry's OCI reference by its pinned digest (digest
//! and signature verified, the signature per the mode and trust policy),
//! then create, or update when one exists, a binding of each of the
//! entry's exports in the scope, through the checks of [`crate::bindings`].
//! Nothing here calls a plugin: execution still flows through the ordinary
//! contracts. A token bound to an org installs only into its own org
//! (another org answers 404, as everywhere).
//!
//! Errors: no `marketplace:` in plugd.yaml → 503
//! `marketplace_not_configured`; an index that cannot be read or fails its
//! checks (signature, trusted key, entries, size) → 502
//! `marketplace_index_refused`, naming the cause; an unknown entry → 404
//! `unknown_entry`; a contract-ready entry, or one the mode refuses → 409
//! `entry_not_installable`, naming why; a package whose signature is refused
//! → 422 `signature_refused`; a package that lacks an export its entry
//! names → 422 `entry_mismatch`; the package and binding errors otherwise.

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugd_control::marketplace::{Entry, Installability, Mode, installability};
use plugd_control::{
    Binding, BindingFilter, BindingPatch, BindingStatus, BindingStore, Package, Scope,
    SignatureStatus,
};
use plugd_packages::{OciRef, RegistryOptions};
use plugd_runtime::config::PlugdConfig;
use plugd_runtime::marketplace::{IndexError, LoadedIndex};
use plugd_store::Store;
use plugd_store::tokens::Tenancy;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Identity;
use crate::error::code;
use crate::packages::store_error;
use crate::{ApiError, AppState, JsonBody};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/marketplace", get(list))
        .route("/v1/marketplace/{id}", get(show).post(action))
}

/// The body of `POST /v1/marketplace/{entry_id}:install`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallRequest {
    /// The org to bind in.
    pub org_id: String,
    /// The project (default: the whole org).
    #[serde(default)]
    pub project_id: Option<String>,
    /// Config of every binding it creates or updates (checked against each
    /// export's `config_schema`); an update keeps the old config when absent.
    #[serde(default)]
    pub config: Option<Value>,
    /// Slot → `secret://ORG/NAME`, likewise.
    #[serde(default)]
    pub secrets: Option<BTreeMap<String, String>>,
}

/// The status and code of an index error.
pub fn index_error(e: IndexError) -> ApiError {
    let (status, c) = match &e {
        IndexError::NotConfigured => (
            StatusCode::SERVICE_UNAVAILABLE,
            code::MARKETPLACE_NOT_CONFIGURED,
        ),
        _ => (StatusCode::BAD_GATEWAY, code::MARKETPLACE_INDEX_REFUSED),
    };
    ApiError::new(status, c, e.to_string())
}

/// Reads and verifies the configured index.
pub async fn load(config: &PlugdConfig) -> Result<LoadedIndex, ApiError> {
    plugd_runtime::marketplace::load(config.marketplace.as_ref(), &config.signing)
        .await
        .map_err(index_error)
}

/// Whether `entry` installs under `index`'s mode and `config`'s trust.
pub fn entry_installability(config: &PlugdConfig, mode: Mode, entry: &Entry) -> Installability {
    installability(entry, mode, &|k| {
        config.signing.publisher(k).map(|p| p.name.clone())
    })
}

/// One entry as the API shows it: its fields, its signature posture and
/// whether it installs (with the reason when not).
pub fn entry_view(config: &PlugdConfig, mode: Mode, entry: &Entry) -> Value {
    let mut v = serde_json::to_value(entry).unwrap_or_else(|_| json!({}));
    let state = entry_installability(config, mode, entry);
    v["installable"] = (state == Installability::Installable).into();
    v["installability"] = serde_json::to_value(&state).unwrap_or(Value::Null);
    v["signature"] = json!(match &entry.signed_by {
        Some(k) => match config.signing.publisher(k) {
            Some(p) => format!("signed by key {k} (trusted publisher {})", p.name),
            None => format!("signed by key {k} (not in trusted_publishers)"),
        },
        None => "unsigned".to_owned(),
    });
    v
}

/// The whole catalog as `GET /v1/marketplace` answers it.
pub fn catalog_view(config: &PlugdConfig, index: &LoadedIndex) -> Value {
    let entries: Vec<Value> = index
        .catalog
        .entries
        .iter()
        .map(|e| entry_view(config, index.mode, e))
        .collect();
    json!({
        "name": index.catalog.name,
        "source": index.source,
        "mode": index.mode,
        "signed_by": index.signed_by,
        "key_id": index.key_id,
        "signed_at": index.signed_at,
        "entries": entries,
    })
}

fn unknown_entry(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        code::UNKNOWN_ENTRY,
        format!("no marketplace entry {id:?}; GET /v1/marketplace lists them"),
    )
}

/// The entry `id` of `index`.
pub fn find<'a>(index: &'a LoadedIndex, id: &str) -> Result<&'a Entry, ApiError> {
    index
        .catalog
        .entries
        .iter()
        .find(|e| e.id == id)
        .ok_or_else(|| unknown_entry(id))
}

/// Who installs, where the workspace keeps packages, and under what policy.
#[derive(Debug, Clone, Copy)]
pub struct Installer<'a> {
    /// The state database.
    pub store: &'a Store,
    /// The workspace's `.plugd`.
    pub state_dir: &'a FsPath,
    /// plugd.yaml (trust policy and marketplace).
    pub config: &'a PlugdConfig,
    /// Who (`token:NAME`, a Unix user name).
    pub by: &'a str,
    /// The caller's org binding (`None`: a workspace operator).
    pub tenant: Option<&'a Tenancy>,
}

/// What an install did: the package, and each binding with whether it was
/// created or updated.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The entry installed.
    pub entry_id: String,
    /// The package (`new`: pulled now rather than installed before).
    pub package: Package,
    /// Whether the package was pulled now.
    pub package_new: bool,
    /// `(binding, created)`, in the entry's export order.
    pub bindings: Vec<(Binding, bool)>,
}

impl Outcome {
    /// The JSON the API answers and `--json` prints.
    pub fn to_json(&self) -> Value {
        let bindings: Vec<Value> = self
            .bindings
            .iter()
            .map(|(b, created)| {
                let mut v = serde_json::to_value(b).unwrap_or_else(|_| json!({}));
                v["action"] = json!(if *created { "created" } else { "updated" });
                v
            })
            .collect();
        json!({
            "entry_id": self.entry_id,
            "package": self.package,
            "package_new": self.package_new,
            "bindings": bindings,
        })
    }
}

/// Installs entry `id` of the configured index for `req`'s scope.
pub async fn install(
    who: &Installer<'_>,
    id: &str,
    req: InstallRequest,
) -> Result<Outcome, ApiError> {
    let scope = Scope {
        org_id: req.org_id.clone(),
        project_id: req.project_id.clone(),
    };
    // Before anything is read: another org's scope does not exist here.
    if !crate::bindings::owns(who.tenant, &scope) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            code::NOT_FOUND,
            format!(
                "no scope {:?}; {} may install only into its own org",
                scope.org_id, who.by
            ),
        ));
    }
    let index = load(who.config).await?;
    let entry = find(&index, id)?.clone();
    if let Some(reason) = entry_installability(who.config, index.mode, &entry).reason() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            code::ENTRY_NOT_INSTALLABLE,
            format!("marketplace entry {id:?} is not installable: {reason}"),
        ));
    }
    // parse_catalog already refuses an available entry without a pin.
    let (Some(oci), Some(pinned)) = (entry.oci.as_deref(), entry.pinned_digest()) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            code::ENTRY_NOT_INSTALLABLE,
            format!("marketplace entry {id:?} has no oci reference pinned by digest"),
        ));
    };
    let source = OciRef::parse(oci).map_err(crate::packages::package_error)?;
    let require = index.mode == Mode::Production || who.config.signing.require_signatures;
    let policy = who.config.signing.clone();
    let signer = entry.signed_by.clone();
    let verify = move |dir: &FsPath| -> Result<SignatureStatus, String> {
        let status = plugd_runtime::signing::check_package(&policy, dir, require)?;
        if let Some(want) = &signer {
            match &status {
                SignatureStatus::Verified { key_id, .. }
                | SignatureStatus::UntrustedKey { key_id, .. }
                    if key_id == want => {}
                other => {
                    return Err(format!(
                        "the marketplace entry says key {want} signed it, but its signature is {}",
                        other.summary()
                    ));
                }
            }
        }
        Ok(status)
    };
    let opts = RegistryOptions::default();
    let at = plugd_store::now_rfc3339();
    let pull = plugd_packages::Request {
        source: &source,
        opts: &opts,
        by: who.by,
        at: &at,
        verify: &verify,
    };
    let done = plugd_packages::install(who.store, who.state_dir, &pull)
        .await
        .map_err(crate::packages::package_error)?;
    let package = done.package;
    if package.digest != pinned {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            code::PACKAGE_TAMPERED,
            format!(
                "{oci} was pinned to {pinned} but {} was installed; nothing was bound",
                package.digest
            ),
        ));
    }
    for x in &entry.exports {
        if !package
            .exports
            .iter()
            .any(|p| p.id == x.id && p.kind == x.kind)
        {
            let has: Vec<String> = package
                .exports
                .iter()
                .map(|p| format!("{} {}", p.kind, p.id))
                .collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                code::ENTRY_MISMATCH,
                format!(
                    "marketplace entry {id:?} offers {} {:?} but package {}@{} has no such export (it exports {}); nothing was bound",
                    x.kind,
                    x.id,
                    package.package_id,
                    package.version,
                    has.join(", ")
                ),
            ));
        }
    }
    let bindings = bind(who, &entry, &package, &scope, &req)?;
    Ok(Outcome {
        entry_id: entry.id,
        package,
        package_new: done.new,
        bindings,
    })
}

/// Creates or updates one binding per export of `entry` in `scope`: every
/// one is checked before any is written, so a failed check writes nothing.
fn bind(
    who: &Installer<'_>,
    entry: &Entry,
    package: &Package,
    scope: &Scope,
    req: &InstallRequest,
) -> Result<Vec<(Binding, bool)>, ApiError> {
    let store = who.store;
    let now = plugd_store::now_rfc3339();
    let mut planned = Vec::new();
    for x in &entry.exports {
        let filter = BindingFilter {
            org_id: Some(scope.org_id.clone()),
            export_id: Some(x.id.clone()),
            package_id: Some(package.package_id.clone()),
            status: None,
        };
        // The oldest binding of this export in exactly this scope is the
        // one an install updates (a second install never duplicates it).
        let existing = store
            .bindings(&filter)
            .map_err(store_error)?
            .into_iter()
            .filter(|b| &b.scope == scope)
            .min_by(|a, b| a.created_at.cmp(&b.created_at));
        let b = match existing {
            Some(old) => {
                let patch = BindingPatch {
                    package_version: Some(package.version.clone()),
                    config: req.config.clone(),
                    secrets: req.secrets.clone(),
                    status: None,
                    rollout: None,
                    gateway_api_scopes: None,
                };
                let mut b = patch.apply(&old);
                b.updated_at.clone_from(&now);
                (b, false)
            }
            None => (
                Binding {
                    binding_id: plugd_store::bindings::new_binding_id().map_err(store_error)?,
                    package_id: package.package_id.clone(),
                    package_version: package.version.clone(),
                    export_id: x.id.clone(),
                    scope: scope.clone(),
                    config: req.config.clone().unwrap_or_else(|| json!({})),
                    secrets: req.secrets.clone().unwrap_or_default(),
                    status: BindingStatus::Active,
                    rollout: Default::default(),
                    created_at: now.clone(),
                    updated_at: now.clone(),
                    created_by: who.by.to_owned(),
                    gateway_api_scopes: None,
                },
                true,
            ),
        };
        let found = crate::bindings::problems(store, &b.0)?;
        if !found.is_empty() {
            return Err(crate::bindings::invalid(&found));
        }
        planned.push(b);
    }
    for (b, created) in &planned {
        if *created {
            store.insert_binding(b).map_err(store_error)?;
        } else {
            store.update_binding(b).map_err(store_error)?;
        }
    }
    Ok(planned)
}

async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let index = load(&state.config).await?;
    Ok(Json(catalog_view(&state.config, &index)))
}

async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let index = load(&state.config).await?;
    let entry = find(&index, &id)?;
    Ok(Json(entry_view(&state.config, index.mode, entry)))
}

/// `POST /v1/marketplace/{entry_id}:install`.
async fn action(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<InstallRequest>,
) -> Result<Response, ApiError> {
    let Some((entry_id, "install")) = crate::auth::action_of(&id) else {
        return Err(ApiError::no_route("POST", &format!("/v1/marketplace/{id}")));
    };
    let state_dir = state.runtime.dir().join(".plugd");
    let installer = Installer {
        store: state.runtime.store(),
        state_dir: &state_dir,
        config: &state.config,
        by: who.by(),
        tenant: who.tenant.as_ref(),
    };
    let done = install(&installer, entry_id, req).await?;
    let status = if done.package_new || done.bindings.iter().any(|(_, c)| *c) {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(done.to_json())).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_errors_have_fixed_statuses() {
        let cases = [
            (
                IndexError::NotConfigured,
                503,
                code::MARKETPLACE_NOT_CONFIGURED,
            ),
            (
                IndexError::BadSignature {
                    location: "i.json".into(),
                    key_id: "00".into(),
                },
                502,
                code::MARKETPLACE_INDEX_REFUSED,
            ),
            (
                IndexError::TooLarge {
                    location: "i.json".into(),
                },
                502,
                code::MARKETPLACE_INDEX_REFUSED,
            ),
        ];
        for (e, status, c) in cases {
            let err = index_error(e);
            assert_eq!(err.body()["error"]["code"], c);
            assert_eq!(err.into_response().status().as_u16(), status);
        }
    }
}
