//! What an export of an installed package asks of its bindings: its
//! `config_schema` and its declared secret slots, read from the package's
//! own (read-only, digest-pinned) manifest.

use plugd_control::{ExportContract, Package};
use plugd_manifest::LoadOptions;
use plugd_manifest::vai::VAI_MANIFEST_FILE;

use crate::PackageError;

/// The contract of export `export_id` of `pkg`; `None` when the package has
/// no such export. A `vai-plugin.toml` package gives the export's
/// `config_schema` (read inside the package) and `secret_slots`; other
/// manifest forms declare neither, so any config object and slot name pass.
pub fn export_contract(
    pkg: &Package,
    export_id: &str,
) -> Result<Option<ExportContract>, PackageError> {
    if !pkg.exports.iter().any(|e| e.id == export_id) {
        return Ok(None);
    }
    if pkg.manifest != VAI_MANIFEST_FILE {
        return Ok(Some(ExportContract::default()));
    }
    let spec =
        plugd_manifest::vai::load_vai(&pkg.path.join(VAI_MANIFEST_FILE), &LoadOptions::default())?;
    let Some(export) = spec.vai.as_ref().and_then(|v| v.export(export_id)) else {
        return Ok(None);
    };
    let config_schema = export
        .config_schema
        .as_deref()
        .map(|rel| {
            plugd_manifest::config_schema::read_inside(
                &spec.manifest_path,
                &spec.dir,
                &format!("exports[{export_id}].config_schema"),
                rel,
            )
        })
        .transpose()?;
    Ok(Some(ExportContract {
        config_schema,
        secret_slots: Some(export.permissions.secret_slots.clone()),
    }))
}
