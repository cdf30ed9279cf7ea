//! The JSON Schema of a plugin's settings (`config_schema`) for native and
//! VAI plugins, and the checks it must pass at load.
//!
//! In `nexo-plugin.toml`, `plugin.config_schema` is either an inline table
//! (the schema written as TOML) or a string: a path to a JSON file inside the
//! plugin directory (absolute paths, `..` and symlinks that leave the
//! directory are refused). The schema must be an object schema with
//! `properties`; a property marked `"writeOnly": true` is a **secret**: it
//! must be a string, may not have a `default`, is stored encrypted and is
//! shown as `••••`.
//!
//! A VAI export's `config_schema` file is read with [`read_inside`] too; its
//! properties become the settings `<export>.<property>`.

use std::io::Read as _;
use std::path::Path;

use serde_json::{Map, Value};

use crate::ManifestError;
use crate::error::quote;
use crate::sandbox::resolve_path;

/// Largest config schema file accepted.
pub const MAX_CONFIG_SCHEMA_BYTES: u64 = 1024 * 1024;

/// Whether property schema `p` marks a secret (`"writeOnly": true`).
pub fn is_secret_property(p: &Value) -> bool {
    p.get("writeOnly").and_then(Value::as_bool) == Some(true)
}

fn invalid(path: &Path, field: &str, message: String) -> ManifestError {
    ManifestError::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        message,
    }
}

/// Reads `config_schema` of a native manifest: an inline table or a path to
/// a JSON file inside `dir`. `field` names it in errors.
pub(crate) fn load_native(
    manifest: &Path,
    dir: &Path,
    field: &str,
    v: &toml::Value,
) -> Result<Value, ManifestError> {
    let schema = match v {
        toml::Value::Table(t) => serde_json::to_value(t).map_err(|e| {
            invalid(
                manifest,
                field,
                format!("cannot be converted to JSON ({e}); write the schema as a JSON file"),
            )
        })?,
        toml::Value::String(rel) => read_inside(manifest, dir, field, rel)?,
        other => {
            return Err(invalid(
                manifest,
                field,
                format!(
                    "expected a table (the schema inline) or a string (a JSON file in the plugin), found {}",
                    other.type_str()
                ),
            ));
        }
    };
    check(manifest, field, &schema)?;
    Ok(schema)
}

/// Reads the JSON file `rel`, which must resolve inside `dir`.
pub fn read_inside(
    manifest: &Path,
    dir: &Path,
    field: &str,
    rel: &str,
) -> Result<Value, ManifestError> {
    if rel.contains('\0') || Path::new(rel).is_absolute() {
        return Err(invalid(
            manifest,
            field,
            format!(
                "{} is not a relative path; use a path inside the plugin like \"config.schema.json\"",
                quote(rel)
            ),
        ));
    }
    let resolved = resolve_path(&dir.join(rel)).ok_or_else(|| {
        invalid(
            manifest,
            field,
            format!(
                "{} follows too many symlinks; point it at the real file",
                quote(rel)
            ),
        )
    })?;
    if !resolved.starts_with(dir) || resolved == dir {
        return Err(invalid(
            manifest,
            field,
            format!(
                "{} escapes the plugin directory (resolves to {:?}); use a path inside the plugin",
                quote(rel),
                resolved
            ),
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(&resolved)
        .and_then(|f| f.take(MAX_CONFIG_SCHEMA_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| {
            invalid(
                manifest,
                field,
                format!(
                    "schema file {} cannot be read ({e}); add it to the plugin",
                    quote(rel)
                ),
            )
        })?;
    if bytes.len() as u64 > MAX_CONFIG_SCHEMA_BYTES {
        return Err(invalid(
            manifest,
            field,
            format!(
                "schema file {} is over the {MAX_CONFIG_SCHEMA_BYTES}-byte limit; shrink it",
                quote(rel)
            ),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        invalid(
            manifest,
            field,
            format!(
                "schema file {} is not valid JSON ({e}); fix the file",
                quote(rel)
            ),
        )
    })
}

/// Checks a config schema: a valid JSON Schema, an object with `properties`,
/// `required` naming declared properties, secrets (`writeOnly`) typed string
/// and without a default, every default valid against its property.
pub fn check(manifest: &Path, field: &str, schema: &Value) -> Result<(), ManifestError> {
    let bad = |f: String, m: String| invalid(manifest, &f, m);
    let Some(obj) = schema.as_object() else {
        return Err(bad(
            field.to_owned(),
            "must be a JSON Schema object with \"properties\"".to_owned(),
        ));
    };
    if let Some(t) = obj.get("type")
        && t != "object"
    {
        return Err(bad(
            format!("{field}.type"),
            format!("is {t}; a config schema describes an object, use \"object\""),
        ));
    }
    if let Err(e) = jsonschema::meta::validate(schema) {
        return Err(bad(
            field.to_owned(),
            format!("is not a valid JSON Schema ({e}); fix the schema"),
        ));
    }
    let empty = Map::new();
    let props = match obj.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(bad(
                format!("{field}.properties"),
                "must be an object of property schemas".to_owned(),
            ));
        }
    };
    for (k, p) in props {
        let f = format!("{field}.properties.{k}");
        if k.is_empty() || k.contains('\0') {
            return Err(bad(f, "a config key must be non-empty".to_owned()));
        }
        if is_secret_property(p) {
            if p.get("type").and_then(Value::as_str) != Some("string") {
                return Err(bad(
                    f,
                    "a secret (\"writeOnly\": true) must have \"type\": \"string\"".to_owned(),
                ));
            }
            if p.get("default").is_some() {
                return Err(bad(
                    format!("{f}.default"),
                    "a secret cannot have a default (it would ship in plain text); remove it"
                        .to_owned(),
                ));
            }
        }
        if let Some(d) = p.get("default") {
            let ok = jsonschema::validator_for(p)
                .map(|v| v.is_valid(d))
                .unwrap_or(false);
            if !ok {
                return Err(bad(
                    format!("{f}.default"),
                    format!("{d} does not match the property's own schema; fix the default"),
                ));
            }
        }
    }
    if let Some(req) = obj.get("required").and_then(Value::as_array) {
        for r in req {
            let name = r.as_str().unwrap_or_default();
            if !props.contains_key(name) {
                return Err(bad(
                    format!("{field}.required"),
                    format!(
                        "names {r}, which is not in \"properties\"; declare it or remove it from \"required\""
                    ),
                ));
            }
        }
    }
    Ok(())
}
