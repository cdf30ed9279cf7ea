//! Installing a marketplace entry, shared by `POST
//! /v1/marketplace/{entry_id}:install` and `plugd marketplace install`, and
//! the catalog views both show.
//!
//! Install = pull the entry's OCI reference by its pinned digest (digest
//! and signature verified, the signature per the mode and trust policy),
//! then create, or update when one exists, a binding of each of the
//! entry's exports in the scope, through the checks of [`crate::bindings`].
//! Nothing here calls a plugin: execution still flows through the ordinary
//! contracts. A caller bound to an org installs only into its own org
//! (another org is `not_found`, as everywhere).
//!
//! Errors ([`ServiceError`]): no `marketplace:` in plugd.yaml →
//! `marketplace_not_configured`; an index that cannot be read or fails its
//! checks (signature, trusted key, entries, size) →
//! `marketplace_index_refused`, naming the cause; an unknown entry →
//! `unknown_entry`; a contract-ready entry, or one the mode refuses →
//! `entry_not_installable`, naming why; a package whose signature is
//! refused → `signature_refused`; a package that lacks an export its entry
//! names → `entry_mismatch`; the package and binding errors otherwise.

use std::collections::BTreeMap;
use std::path::Path;

use plugd_control::marketplace::{Entry, Installability, Mode, installability};
use plugd_control::store::StateStore;
use plugd_control::{
    Binding, BindingFilter, BindingPatch, BindingStatus, Code, Package, Scope, ServiceError,
    SignatureStatus,
};
use plugd_packages::{OciRef, RegistryOptions};
use plugd_store::tokens::Tenancy;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::marketplace::{IndexError, LoadedIndex, MarketplaceConfig};
use crate::signing::SigningPolicy;

impl From<IndexError> for ServiceError {
    /// No `marketplace:` → `marketplace_not_configured`; any other refusal
    /// of the index → `marketplace_index_refused`.
    fn from(e: IndexError) -> ServiceError {
        let code = match &e {
            IndexError::NotConfigured => Code::MarketplaceNotConfigured,
            _ => Code::MarketplaceIndexRefused,
        };
        ServiceError::new(code, e.to_string())
    }
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

/// Reads and verifies the configured index.
pub async fn load(
    marketplace: Option<&MarketplaceConfig>,
    signing: &SigningPolicy,
) -> Result<LoadedIndex, ServiceError> {
    Ok(crate::marketplace::load(marketplace, signing).await?)
}

/// Whether `entry` installs under `index`'s mode and `config`'s trust.
pub fn entry_installability(signing: &SigningPolicy, mode: Mode, entry: &Entry) -> Installability {
    installability(entry, mode, &|k| {
        signing.publisher(k).map(|p| p.name.clone())
    })
}

/// One entry as the API shows it: its fields, its signature posture and
/// whether it installs (with the reason when not).
pub fn entry_view(signing: &SigningPolicy, mode: Mode, entry: &Entry) -> Value {
    let mut v = serde_json::to_value(entry).unwrap_or_else(|_| json!({}));
    let state = entry_installability(signing, mode, entry);
    v["installable"] = (state == Installability::Installable).into();
    v["installability"] = serde_json::to_value(&state).unwrap_or(Value::Null);
    v["signature"] = json!(match &entry.signed_by {
        Some(k) => match signing.publisher(k) {
            Some(p) => format!("signed by key {k} (trusted publisher {})", p.name),
            None => format!("signed by key {k} (not in trusted_publishers)"),
        },
        None => "unsigned".to_owned(),
    });
    v
}

/// The whole catalog as `GET /v1/marketplace` answers it.
pub fn catalog_view(signing: &SigningPolicy, index: &LoadedIndex) -> Value {
    let entries: Vec<Value> = index
        .catalog
        .entries
        .iter()
        .map(|e| entry_view(signing, index.mode, e))
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

fn unknown_entry(id: &str) -> ServiceError {
    ServiceError::new(
        Code::UnknownEntry,
        format!("no marketplace entry {id:?}; GET /v1/marketplace lists them"),
    )
}

/// The entry `id` of `index`.
pub fn find<'a>(index: &'a LoadedIndex, id: &str) -> Result<&'a Entry, ServiceError> {
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
    pub store: &'a dyn StateStore,
    /// The workspace's `.plugd`.
    pub state_dir: &'a Path,
    /// plugd.yaml's `marketplace:` (`None`: not set).
    pub marketplace: Option<&'a MarketplaceConfig>,
    /// plugd.yaml's trust policy.
    pub signing: &'a SigningPolicy,
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
) -> Result<Outcome, ServiceError> {
    let scope = Scope {
        org_id: req.org_id.clone(),
        project_id: req.project_id.clone(),
    };
    // Before anything is read: another org's scope does not exist here.
    if !crate::bindings::owns(who.tenant, &scope) {
        return Err(ServiceError::new(
            Code::NotFound,
            format!(
                "no scope {:?}; {} may install only into its own org",
                scope.org_id, who.by
            ),
        ));
    }
    let index = load(who.marketplace, who.signing).await?;
    let entry = find(&index, id)?.clone();
    if let Some(reason) = entry_installability(who.signing, index.mode, &entry).reason() {
        return Err(ServiceError::new(
            Code::EntryNotInstallable,
            format!("marketplace entry {id:?} is not installable: {reason}"),
        ));
    }
    // parse_catalog already refuses an available entry without a pin.
    let (Some(oci), Some(pinned)) = (entry.oci.as_deref(), entry.pinned_digest()) else {
        return Err(ServiceError::new(
            Code::EntryNotInstallable,
            format!("marketplace entry {id:?} has no oci reference pinned by digest"),
        ));
    };
    let source = OciRef::parse(oci)?;
    let require = index.mode == Mode::Production || who.signing.require_signatures;
    let policy = who.signing.clone();
    let signer = entry.signed_by.clone();
    let verify = move |dir: &Path| -> Result<SignatureStatus, String> {
        let status = crate::signing::check_package(&policy, dir, require)?;
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
    let done = plugd_packages::install(who.store, who.state_dir, &pull).await?;
    let package = done.package;
    if package.digest != pinned {
        return Err(ServiceError::new(
            Code::PackageTampered,
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
            return Err(ServiceError::new(
                Code::EntryMismatch,
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
    let bindings = bind(who, &entry, &package, &scope, &req).await?;
    Ok(Outcome {
        entry_id: entry.id,
        package,
        package_new: done.new,
        bindings,
    })
}

/// Creates or updates one binding per export of `entry` in `scope`: every
/// one is checked before any is written, so a failed check writes nothing.
async fn bind(
    who: &Installer<'_>,
    entry: &Entry,
    package: &Package,
    scope: &Scope,
    req: &InstallRequest,
) -> Result<Vec<(Binding, bool)>, ServiceError> {
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
            .await
            .map_err(ServiceError::store)?
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
                    binding_id: plugd_store::bindings::new_binding_id()
                        .map_err(ServiceError::store)?,
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
        let found = crate::bindings::problems(store, &b.0).await?;
        if !found.is_empty() {
            return Err(crate::bindings::invalid(&found));
        }
        planned.push(b);
    }
    for (b, created) in &planned {
        if *created {
            store.insert_binding(b).await.map_err(ServiceError::store)?;
        } else {
            store.update_binding(b).await.map_err(ServiceError::store)?;
        }
    }
    Ok(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_errors_have_fixed_codes() {
        let cases = [
            (IndexError::NotConfigured, Code::MarketplaceNotConfigured),
            (
                IndexError::BadSignature {
                    location: "i.json".into(),
                    key_id: "00".into(),
                },
                Code::MarketplaceIndexRefused,
            ),
            (
                IndexError::TooLarge {
                    location: "i.json".into(),
                },
                Code::MarketplaceIndexRefused,
            ),
        ];
        for (e, c) in cases {
            assert_eq!(ServiceError::from(e).code, c);
        }
    }
}
