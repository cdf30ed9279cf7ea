//! A plugin's settings: the schema its manifest declares, the values the
//! operator sets (`plugd plugin config ID set|get|unset|show`), and the
//! effective configuration each start receives.
//!
//! Schemas, by dialect:
//! - Salmex: `config.properties` of `plugin.json` (`string`, `secret`,
//!   `boolean`, `integer`, `number`, `select`; `default`, `required`,
//!   `show_when`).
//! - native: `plugin.config_schema` of `nexo-plugin.toml`, a JSON Schema;
//!   properties with `"writeOnly": true` are secrets. The effective object is
//!   validated against the whole schema before every start.
//! - VAI: one secret key `secret_slots.<slot>` per slot any export declares
//!   (the binding of a slot to a stored secret), and `<export>.<property>`
//!   for each property of an export's `config_schema` file; an invocation
//!   gets its export's object as `context.config`.
//!
//! Values typed on the command line are coerced to the field's type
//! (`true`, `42`, `1.5`, a select option); secrets are sealed by
//! `plugd-store` before they touch the database. A start
//! ([`launch_for`]) gets the defaults plus the stored values, secrets
//! decrypted, and the list of secret values to scrub from logs and reports.
//! A required field that is missing (and shown, per `show_when`) refuses the
//! start with the exact command that sets it.
//!
//! **Architecture invariant**: a decrypted secret leaves this module only in
//! a [`Launch`] (for the handshake, `config/changed` and VAI invocations) and
//! is never returned by [`Runtime::config_show`] / [`Runtime::config_get`],
//! which print [`MASK`].
//!
//! Why one file: a plugin's settings are one model (the schema per dialect,
//! typed get/set/unset/show, the effective configuration a start gets,
//! applying a change); the console's form over it is `settings_form.rs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use plugd_host::{Launch, Status};
use plugd_manifest::config_schema::is_secret_property;
use plugd_manifest::salmex::show_when_holds;
use plugd_manifest::{Dialect, PluginSpec};
use plugd_store::StateStore;
use plugd_store::secrets::{KeySource, MasterKey, StoredValue};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{Runtime, RuntimeError};

/// How a secret value is shown.
pub const MASK: &str = "••••";

/// The type of one setting.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Kind {
    /// Free text.
    #[default]
    String,
    /// Free text, stored encrypted and never shown.
    Secret,
    /// `true` / `false`.
    Boolean,
    /// A whole number.
    Integer,
    /// Any finite number.
    Number,
    /// One of these values.
    Select(Vec<String>),
    /// Any JSON value the property schema accepts (native objects, arrays).
    Json,
}

impl Kind {
    /// The type's name (`string`, `secret`, `boolean`, `integer`, `number`,
    /// `select`, `json`).
    pub fn name(&self) -> &'static str {
        match self {
            Kind::String => "string",
            Kind::Secret => "secret",
            Kind::Boolean => "boolean",
            Kind::Integer => "integer",
            Kind::Number => "number",
            Kind::Select(_) => "select",
            Kind::Json => "json",
        }
    }
}

/// One setting a plugin declares.
#[derive(Debug, Clone, Default)]
pub struct Field {
    /// The key the plugin receives the value under.
    pub key: String,
    /// Its type.
    pub kind: Kind,
    /// Needed before the plugin may start (when shown).
    pub required: bool,
    /// The manifest's default.
    pub default: Option<Value>,
    /// Salmex conditional visibility.
    pub show_when: Option<Value>,
    /// The native property schema, checked on every set.
    pub schema: Option<Value>,
    /// What the settings form calls it (Salmex `label`, JSON Schema `title`).
    pub label: Option<String>,
    /// What it is for (Salmex and JSON Schema `description`).
    pub description: Option<String>,
    /// The section of the settings form it belongs to (Salmex `group`).
    pub group: Option<String>,
    /// A select's options with their labels (the value when none), in
    /// manifest order.
    pub options: Vec<(String, String)>,
}

/// Every setting of a plugin, and the whole-object JSON Schema (native).
#[derive(Debug, Clone, Default)]
pub struct ConfigSchema {
    /// The settings, in manifest order.
    pub fields: Vec<Field>,
    /// The native `config_schema`, validated against the effective object.
    pub json: Option<Value>,
    /// VAI: settings go under `secret_slots` and `exports` in the launch
    /// configuration.
    pub vai: bool,
    /// VAI: each export's `config_schema`, by export id.
    pub exports: Vec<(String, Value)>,
}

impl ConfigSchema {
    pub(crate) fn field(&self, key: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.key == key)
    }
}

/// The schema `spec` declares (empty when it declares none).
pub fn schema_of(spec: &PluginSpec) -> ConfigSchema {
    match spec.dialect {
        Dialect::Salmex => {
            let Some(s) = &spec.salmex else {
                return ConfigSchema::default();
            };
            let fields = s
                .config
                .iter()
                .map(|f| Field {
                    key: f.key.clone(),
                    kind: match f.kind.as_str() {
                        "secret" => Kind::Secret,
                        "boolean" => Kind::Boolean,
                        "integer" => Kind::Integer,
                        "number" => Kind::Number,
                        "select" => {
                            Kind::Select(f.options.iter().map(|o| o.value.clone()).collect())
                        }
                        _ => Kind::String,
                    },
                    required: f.required,
                    default: f.default.clone(),
                    show_when: f.show_when.clone(),
                    schema: None,
                    label: f.label.clone(),
                    description: f.description.clone(),
                    group: f.group.clone(),
                    options: f
                        .options
                        .iter()
                        .map(|o| {
                            (
                                o.value.clone(),
                                o.label.clone().unwrap_or_else(|| o.value.clone()),
                            )
                        })
                        .collect(),
                })
                .collect();
            ConfigSchema {
                fields,
                json: None,
                vai: false,
                exports: Vec::new(),
            }
        }
        Dialect::Vai => {
            let mut fields: Vec<Field> = Vec::new();
            for e in spec.vai.iter().flat_map(|v| v.exports.iter()) {
                for slot in &e.permissions.secret_slots {
                    let key = format!("secret_slots.{slot}");
                    if !fields.iter().any(|f| f.key == key) {
                        fields.push(Field {
                            label: Some(format!("Secret slot {slot}")),
                            description: Some(format!(
                                "the value of secret slot {slot:?}, which export {:?} declares",
                                e.id
                            )),
                            key,
                            kind: Kind::Secret,
                            ..Field::default()
                        });
                    }
                }
            }
            let mut exports = Vec::new();
            for e in spec.vai.iter().flat_map(|v| v.exports.iter()) {
                let Some(rel) = &e.config_schema else {
                    continue;
                };
                let field = format!("exports[{}].config_schema", e.id);
                match plugd_manifest::config_schema::read_inside(
                    &spec.manifest_path,
                    &spec.dir,
                    &field,
                    rel,
                ) {
                    Ok(schema) => {
                        fields.extend(properties(&schema).into_iter().map(|mut f| {
                            f.key = format!("{}.{}", e.id, f.key);
                            f
                        }));
                        exports.push((e.id.clone(), schema));
                    }
                    Err(err) => {
                        tracing::warn!(plugin = %spec.id, "config schema of export {:?} unreadable: {err}", e.id);
                    }
                }
            }
            ConfigSchema {
                fields,
                json: None,
                vai: true,
                exports,
            }
        }
        Dialect::Mcp => ConfigSchema {
            fields: crate::mcp_remote::fields(spec),
            json: None,
            vai: false,
            exports: Vec::new(),
        },
        _ => {
            let Some(schema) = spec.native.as_ref().and_then(|n| n.config_schema.clone()) else {
                return ConfigSchema::default();
            };
            let fields = properties(&schema);
            ConfigSchema {
                fields,
                json: Some(schema),
                vai: false,
                exports: Vec::new(),
            }
        }
    }
}

/// The settings of a JSON Schema's `properties` (`"writeOnly": true` is a
/// secret, a string `enum` a select).
fn properties(schema: &Value) -> Vec<Field> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields = Vec::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, p) in props {
            let ty = p.get("type").and_then(Value::as_str);
            let mut options = Vec::new();
            let kind = if is_secret_property(p) {
                Kind::Secret
            } else if let Some(opts) = p.get("enum").and_then(Value::as_array)
                && opts.iter().all(Value::is_string)
            {
                let values: Vec<String> = opts
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect();
                options = values.iter().map(|v| (v.clone(), v.clone())).collect();
                Kind::Select(values)
            } else {
                match ty {
                    Some("string") => Kind::String,
                    Some("boolean") => Kind::Boolean,
                    Some("integer") => Kind::Integer,
                    Some("number") => Kind::Number,
                    _ => Kind::Json,
                }
            };
            fields.push(Field {
                key: k.clone(),
                kind,
                required: required.contains(&k.as_str()),
                default: p.get("default").cloned(),
                show_when: None,
                schema: Some(p.clone()),
                label: p.get("title").and_then(Value::as_str).map(str::to_owned),
                description: p
                    .get("description")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                group: None,
                options,
            });
        }
    }
    fields
}

/// How one setting is shown by `plugd plugin config ID show|get`.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigEntry {
    /// The key.
    pub key: String,
    /// Its type (`string`, `secret`, `boolean`, `integer`, `number`,
    /// `select`, `json`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The value; secrets are [`MASK`] when set, `null` otherwise.
    pub value: Value,
    /// `set`, `default` or `unset`.
    pub source: &'static str,
    /// Needed before the plugin may start.
    pub required: bool,
    /// Whether it is a secret.
    pub secret: bool,
    /// The options of a select.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// What happened to a running plugin after its settings changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// It was not running; the next start uses the new settings.
    NotRunning,
    /// A Salmex plugin got `config/changed`.
    Notified,
    /// It was restarted with the new settings.
    Restarted,
}

impl Applied {
    /// For the CLI: what happened, as a phrase.
    pub fn describe(self) -> &'static str {
        match self {
            Applied::NotRunning => "the next start uses it",
            Applied::Notified => "the running plugin got config/changed",
            Applied::Restarted => "the plugin was restarted with it",
        }
    }
}

/// Secret values of the last launch of each plugin, to scrub failure
/// reasons before they are stored.
#[derive(Debug, Default)]
pub(crate) struct Redactions(Mutex<HashMap<String, Vec<String>>>);

impl Redactions {
    pub(crate) fn remember(&self, plugin: &str, values: &[String]) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(plugin.to_owned()).or_default();
        for v in values {
            if !e.contains(v) {
                e.push(v.clone());
            }
        }
    }

    /// Every value remembered, of every plugin (what invocation records
    /// mask).
    pub(crate) fn all(&self) -> Vec<String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.values().flatten().cloned().collect()
    }

    pub(crate) fn scrub(&self, plugin: &str, text: &str) -> String {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(plugin) {
            Some(v) => plugd_host::launch::scrub(text, v),
            None => text.to_owned(),
        }
    }
}

fn config_err(plugin: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Config {
        plugin: plugin.to_owned(),
        message: message.into(),
    }
}

fn unknown_key(plugin: &str, key: &str, schema: &ConfigSchema) -> RuntimeError {
    if schema.fields.is_empty() {
        return config_err(
            plugin,
            format!("it declares no settings, so {key:?} cannot be set"),
        );
    }
    config_err(
        plugin,
        format!(
            "it has no setting {key:?}; its settings are: {}",
            schema
                .fields
                .iter()
                .map(|f| f.key.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

/// Turns the command-line text `raw` into the value of `field`.
pub fn coerce(plugin: &str, field: &Field, raw: &str) -> Result<Value, RuntimeError> {
    let key = &field.key;
    let bad = |what: &str| {
        config_err(
            plugin,
            format!(
                "{key:?} must be {what}, got {raw:?}; e.g. `plugd plugin config {plugin} set {key} {}`",
                match &field.kind {
                    Kind::Boolean => "true".to_owned(),
                    Kind::Integer => "42".to_owned(),
                    Kind::Number => "1.5".to_owned(),
                    Kind::Select(o) => o.first().cloned().unwrap_or_default(),
                    _ => "VALUE".to_owned(),
                }
            ),
        )
    };
    let v = match &field.kind {
        Kind::String => Value::String(raw.to_owned()),
        Kind::Secret => {
            if raw.is_empty() {
                return Err(config_err(
                    plugin,
                    format!(
                        "an empty secret for {key:?}; to clear it run `plugd plugin config {plugin} unset {key}`"
                    ),
                ));
            }
            Value::String(raw.to_owned())
        }
        Kind::Boolean => match raw {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(bad("true or false")),
        },
        Kind::Integer => raw
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| bad("an integer"))?,
        Kind::Number => match raw.parse::<f64>() {
            Ok(n) if n.is_finite() => serde_json::Number::from_f64(n)
                .map(Value::Number)
                .ok_or_else(|| bad("a number"))?,
            _ => return Err(bad("a number")),
        },
        Kind::Select(opts) => {
            if !opts.iter().any(|o| o == raw) {
                return Err(config_err(
                    plugin,
                    format!(
                        "{raw:?} is not an option of {key:?}; use one of {}",
                        opts.join(", ")
                    ),
                ));
            }
            Value::String(raw.to_owned())
        }
        Kind::Json => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned())),
    };
    match schema_problem(field, &v) {
        None => Ok(v),
        Some(SchemaProblem::Unusable(e)) => Err(config_err(
            plugin,
            format!("the schema of {key:?} is not usable: {e}"),
        )),
        Some(SchemaProblem::Invalid(e)) => Err(config_err(
            plugin,
            format!("{raw:?} is not valid for {key:?}: {e}"),
        )),
    }
}

/// Why a typed value fails its field's property schema (native and VAI).
pub(crate) enum SchemaProblem {
    /// The manifest's schema does not compile.
    Unusable(String),
    /// The value does not match it (the first error).
    Invalid(String),
}

/// Checks `v` against `field`'s property schema, if it has one; secrets are
/// never checked (an error would quote the value).
pub(crate) fn schema_problem(field: &Field, v: &Value) -> Option<SchemaProblem> {
    let schema = field
        .schema
        .as_ref()
        .filter(|_| field.kind != Kind::Secret)?;
    match jsonschema::validator_for(schema) {
        Err(e) => Some(SchemaProblem::Unusable(e.to_string())),
        Ok(validator) => validator
            .iter_errors(v)
            .next()
            .map(|e| SchemaProblem::Invalid(e.to_string())),
    }
}

/// The first required setting that is not set (and visible under its
/// `show_when`), as the sentence that says how to set it.
fn first_missing(
    spec: &PluginSpec,
    schema: &ConfigSchema,
    cfg: &Map<String, Value>,
) -> Option<String> {
    let f = schema.fields.iter().find(|f| {
        f.required && !cfg.contains_key(&f.key) && show_when_holds(f.show_when.as_ref(), cfg)
    })?;
    let value = if f.kind == Kind::Secret { "-" } else { "VALUE" };
    Some(format!(
        "required setting {:?} is not set; set it with `plugd plugin config {} set {} {value}`",
        f.key, spec.id, f.key
    ))
}

/// Whether `spec` still waits for configuration: the sentence naming the
/// first required setting that is not set, or `None` when every required
/// setting has a value (or cannot be read: the start then says why).
pub(crate) async fn missing_required(store: &dyn StateStore, spec: &PluginSpec) -> Option<String> {
    let schema = schema_of(spec);
    if !schema.fields.iter().any(|f| f.required) {
        return None;
    }
    let stored = store.config_values(&spec.id).await.ok()?;
    let (cfg, _) = effective(spec, &schema, stored).ok()?;
    first_missing(spec, &schema, &cfg)
}

/// The configuration and secrets for one start of `spec`, or why it may not
/// start (a required setting missing, a secret that does not decrypt, the
/// effective object failing the native schema).
pub(crate) async fn launch_for(
    store: &dyn StateStore,
    spec: &PluginSpec,
) -> Result<Launch, String> {
    let stored = store
        .config_values(&spec.id)
        .await
        .map_err(|e| e.to_string())?;
    launch_from(spec, stored)
}

/// [`launch_for`] on the values read from the store.
fn launch_from(spec: &PluginSpec, stored: Vec<(String, StoredValue)>) -> Result<Launch, String> {
    let schema = schema_of(spec);
    if schema.fields.is_empty() && stored.is_empty() {
        return Ok(Launch::default());
    }
    let (cfg, redact) = effective(spec, &schema, stored)?;
    if let Some(missing) = first_missing(spec, &schema, &cfg) {
        return Err(missing);
    }
    let cfg = Value::Object(cfg);
    if let Some(json) = &schema.json {
        let validator = jsonschema::validator_for(json)
            .map_err(|e| format!("its config_schema is not usable: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(&cfg)
            .take(5)
            .map(|e| plugd_host::launch::scrub(&format!("{}: {e}", e.instance_path()), &redact))
            .collect();
        if !errors.is_empty() {
            return Err(format!(
                "its settings do not match its config_schema ({}); fix them with `plugd plugin config {} set KEY VALUE`",
                errors.join("; "),
                spec.id
            ));
        }
    }
    let config = if schema.vai {
        vai_config(spec, &schema, &cfg, &redact)?
    } else {
        cfg
    };
    // Other parts of the launch (containment, …) are filled by their owners.
    #[allow(clippy::needless_update)]
    Ok(Launch {
        config,
        redact,
        ..Launch::default()
    })
}

/// The VAI launch configuration: `{secret_slots: {slot: value}, exports:
/// {export: {property: value}}}`, each export's object checked against its
/// `config_schema`.
fn vai_config(
    spec: &PluginSpec,
    schema: &ConfigSchema,
    cfg: &Value,
    redact: &[String],
) -> Result<Value, String> {
    let flat = cfg.as_object().cloned().unwrap_or_default();
    let slots: Map<String, Value> = flat
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("secret_slots.")
                .map(|s| (s.to_owned(), v.clone()))
        })
        .collect();
    let mut exports = Map::new();
    for (id, export_schema) in &schema.exports {
        let prefix = format!("{id}.");
        let obj = Value::Object(
            flat.iter()
                .filter_map(|(k, v)| k.strip_prefix(&prefix).map(|p| (p.to_owned(), v.clone())))
                .collect(),
        );
        let validator = jsonschema::validator_for(export_schema)
            .map_err(|e| format!("the config_schema of export {id:?} is not usable: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(&obj)
            .take(5)
            .map(|e| plugd_host::launch::scrub(&format!("{}: {e}", e.instance_path()), redact))
            .collect();
        if !errors.is_empty() {
            return Err(format!(
                "the settings of export {id:?} do not match its config_schema ({}); fix them with `plugd plugin config {} set {id}.KEY VALUE`",
                errors.join("; "),
                spec.id
            ));
        }
        exports.insert(id.clone(), obj);
    }
    Ok(serde_json::json!({ "secret_slots": slots, "exports": exports }))
}

/// Defaults plus stored values (secrets opened), and the secret values.
fn effective(
    spec: &PluginSpec,
    schema: &ConfigSchema,
    stored: Vec<(String, StoredValue)>,
) -> Result<(Map<String, Value>, Vec<String>), String> {
    let mut cfg = Map::new();
    for f in &schema.fields {
        if let Some(d) = &f.default {
            cfg.insert(f.key.clone(), d.clone());
        }
    }
    let mut key: Option<MasterKey> = None;
    let mut redact = Vec::new();
    for (k, v) in stored {
        if schema.field(&k).is_none() {
            tracing::warn!(plugin = %spec.id, key = %k, "stored setting is no longer declared; ignored");
            continue;
        }
        match v {
            StoredValue::Plain(v) => {
                cfg.insert(k, v);
            }
            StoredValue::Secret(sealed) => {
                if key.is_none() {
                    let source = KeySource::from_env().map_err(|e| e.to_string())?;
                    key = Some(
                        source
                            .require()
                            .map_err(|e| format!("its secret {k:?} cannot be decrypted: {e}"))?,
                    );
                }
                let Some(master) = &key else { continue };
                let plain = match master.open(&spec.id, &k, &sealed) {
                    Ok(p) => p,
                    Err(e) => match staged_key(&sealed.key_id) {
                        Some(staged) => staged
                            .open(&spec.id, &k, &sealed)
                            .map_err(|e| e.to_string())?,
                        None => return Err(e.to_string()),
                    },
                };
                redact.push(plain.as_str().to_owned());
                cfg.insert(k, Value::String(plain.as_str().to_owned()));
            }
        }
    }
    Ok((cfg, redact))
}

/// The staged key of an interrupted rotation, when it is the one `key_id`
/// names (the database committed, the key file was not yet replaced).
pub(crate) fn staged_key(key_id: &str) -> Option<MasterKey> {
    match KeySource::from_env().ok()? {
        KeySource::File(p) => plugd_store::secrets::load_staged(&p)
            .ok()
            .flatten()
            .filter(|k| k.id() == key_id),
        KeySource::Env(_) => None,
    }
}

impl Runtime {
    /// The settings `id` declares.
    pub fn config_schema(&self, id: &str) -> Result<ConfigSchema, RuntimeError> {
        Ok(schema_of(self.supervised(id)?.spec()))
    }

    /// Every setting of `id` with its value (secrets as [`MASK`]).
    pub async fn config_show(&self, id: &str) -> Result<Vec<ConfigEntry>, RuntimeError> {
        let schema = self.config_schema(id)?;
        let stored: BTreeMap<String, StoredValue> = self
            .inner
            .state
            .config_values(id)
            .await?
            .into_iter()
            .collect();
        Ok(schema
            .fields
            .iter()
            .map(|f| {
                let secret = f.kind == Kind::Secret;
                let (value, source) = match (stored.get(&f.key), &f.default) {
                    // A secret, or any sealed value, is never shown.
                    (Some(_), _) if secret => (Value::String(MASK.to_owned()), "set"),
                    (Some(StoredValue::Secret(_)), _) => (Value::String(MASK.to_owned()), "set"),
                    (Some(StoredValue::Plain(v)), _) => (v.clone(), "set"),
                    (None, Some(d)) => (d.clone(), "default"),
                    (None, None) => (Value::Null, "unset"),
                };
                ConfigEntry {
                    key: f.key.clone(),
                    kind: f.kind.name(),
                    value,
                    source,
                    required: f.required,
                    secret,
                    options: match &f.kind {
                        Kind::Select(o) => o.clone(),
                        _ => Vec::new(),
                    },
                }
            })
            .collect())
    }

    /// One setting of `id` (a secret as [`MASK`]).
    pub async fn config_get(&self, id: &str, key: &str) -> Result<ConfigEntry, RuntimeError> {
        let schema = self.config_schema(id)?;
        if schema.field(key).is_none() {
            return Err(unknown_key(id, key, &schema));
        }
        self.config_show(id)
            .await?
            .into_iter()
            .find(|e| e.key == key)
            .ok_or_else(|| unknown_key(id, key, &schema))
    }

    /// Validates and stores `raw` as the value of `key` (sealed when it is a
    /// secret), then applies the change to the plugin if it is running.
    pub async fn config_set(
        &self,
        id: &str,
        key: &str,
        raw: &str,
    ) -> Result<Applied, RuntimeError> {
        let schema = self.config_schema(id)?;
        let field = schema
            .field(key)
            .ok_or_else(|| unknown_key(id, key, &schema))?;
        let value = coerce(id, field, raw)?;
        let store = &self.inner.state;
        if field.kind == Kind::Secret {
            // Sealed here, with the master key this process loads: the
            // store only ever sees the sealed box.
            let master = KeySource::from_env()
                .and_then(|s| s.load_or_create())
                .map_err(|e| config_err(id, format!("cannot store secret {key:?}: {e}")))?;
            let sealed = master
                .seal(id, key, raw.as_bytes())
                .map_err(plugd_store::StoreError::from)?;
            store.put_sealed(id, key, &sealed).await?;
        } else {
            store.config_set_plain(id, key, &value).await?;
        }
        self.config_apply(id).await
    }

    /// Removes the value of `key` (its default applies again), then applies
    /// the change. Unsetting a key that was not set is not an error.
    pub async fn config_unset(&self, id: &str, key: &str) -> Result<Applied, RuntimeError> {
        let schema = self.config_schema(id)?;
        if schema.field(key).is_none() {
            return Err(unknown_key(id, key, &schema));
        }
        self.inner.state.config_unset(id, key).await?;
        self.config_apply(id).await
    }

    /// Brings a running plugin up to date with its stored settings: Salmex
    /// plugins get `config/changed`, others are restarted. A plugin that is
    /// not running picks them up at its next start; a failed one has its
    /// failure cleared (as `plugd plugin restart` does).
    pub async fn config_apply(&self, id: &str) -> Result<Applied, RuntimeError> {
        let sup = self.supervised(id)?.clone();
        if self.operator_stopped(id).is_some() {
            // An operator stop holds: the new settings apply at the start.
            return Ok(Applied::NotRunning);
        }
        if matches!(sup.status(), Status::Failed { .. }) {
            // The operator changed the settings: that is the fix a refused
            // or crashing start waits for, so give the plugin a fresh budget.
            self.restart(id).await?;
            return Ok(Applied::NotRunning);
        }
        let Some(conn) = sup.current() else {
            return Ok(Applied::NotRunning);
        };
        let spec = sup.spec().clone();
        let dialect = plugd_dialects::of(spec.dialect);
        if dialect.capabilities().live_config {
            match launch_for(&*self.inner.state, &spec).await {
                Ok(launch) => {
                    conn.stderr.redact_more(&launch.redact);
                    self.inner.redactions.remember(id, &launch.redact);
                    if dialect.config_changed(&conn, launch.config) {
                        return Ok(Applied::Notified);
                    }
                }
                Err(reason) => {
                    // The new settings cannot run: stop rather than keep
                    // running on settings the operator replaced.
                    sup.stop().await;
                    return Err(config_err(id, format!("it was stopped: {reason}")));
                }
            }
        }
        drop(conn);
        sup.reset().await;
        if !matches!(sup.status(), Status::Starting | Status::Running { .. }) {
            sup.start();
        }
        Ok(Applied::Restarted)
    }

    /// Re-seals every stored secret under a new master key (`plugd secrets
    /// rotate`). With a key file, a fresh key is generated and the file
    /// replaced atomically after the database commits; with
    /// `PLUGD_MASTER_KEY`, the new key comes from `PLUGD_NEW_MASTER_KEY` and
    /// the operator swaps the variables afterwards.
    pub async fn rotate_secrets(&self) -> Result<plugd_store::secrets::Rotation, RuntimeError> {
        Ok(rotate(&*self.inner.state).await?)
    }
}

/// Re-seals every secret from `old` to `new` through
/// [`plugd_control::store::ConfigStore::reseal_secrets`] (one transaction):
/// the keys stay in this process.
async fn reseal(
    store: &dyn StateStore,
    old: &MasterKey,
    new: &MasterKey,
) -> Result<plugd_store::secrets::Rotation, plugd_store::StoreError> {
    use plugd_store::secrets::{Sealed, SecretError};
    if old.id() == new.id() {
        return Err(SecretError::Rotate(
            "the new master key is the same as the current one; use a fresh key".to_owned(),
        )
        .into());
    }
    store
        .reseal_secrets(
            old.id(),
            new.id(),
            &|plugin: &str, key: &str, sealed: &Sealed| {
                let plain = old.open(plugin, key, sealed)?;
                Ok(new.seal(plugin, key, plain.as_bytes())?)
            },
        )
        .await
}

async fn rotate(
    store: &dyn StateStore,
) -> Result<plugd_store::secrets::Rotation, plugd_store::StoreError> {
    use plugd_store::secrets::{
        NEW_MASTER_KEY_ENV, SecretError, commit_key_file, load_staged, stage_key_file, staged_path,
    };
    let source = KeySource::from_env()?;
    match &source {
        KeySource::Env(_) => {
            let old = source.require()?;
            let new_hex = std::env::var(NEW_MASTER_KEY_ENV).map_err(|_| {
                SecretError::Rotate(format!(
                    "the master key comes from PLUGD_MASTER_KEY, so set {NEW_MASTER_KEY_ENV} to the new key (`openssl rand -hex 32`) and run rotate again"
                ))
            })?;
            let new = MasterKey::from_hex(&new_hex, NEW_MASTER_KEY_ENV)?;
            reseal(store, &old, &new).await
        }
        KeySource::File(path) => {
            // An earlier rotation committed but did not rename: finish it.
            if let Some(staged) = load_staged(path)? {
                let used = store.secret_key_ids().await?;
                if used.iter().any(|k| k == staged.id()) {
                    commit_key_file(path)?;
                }
            }
            let old = source.load_or_create()?;
            let new = MasterKey::generate(path.display().to_string())?;
            stage_key_file(path, &new)?;
            let r = reseal(store, &old, &new).await?;
            commit_key_file(path).map_err(|e| {
                SecretError::Rotate(format!(
                    "the secrets were re-encrypted with key {} but {} could not replace the key file ({e}); rename it over {} by hand",
                    new.id(),
                    staged_path(path).display(),
                    path.display()
                ))
            })?;
            Ok(r)
        }
    }
}

#[cfg(test)]
mod tests {
    use plugd_manifest::LoadOptions;
    use plugd_manifest::salmex::parse_salmex;
    use serde_json::json;

    use super::*;
    use plugd_store::Store;

    /// [`launch_for`] on the SQLite store's synchronous read.
    fn launch(store: &Store, spec: &PluginSpec) -> Result<Launch, String> {
        launch_from(spec, store.config_values(&spec.id).unwrap())
    }

    fn salmex(props: Value) -> PluginSpec {
        let m = json!({
            "name": "p", "version": "0.1.0", "protocolVersion": "1.0",
            "interpreter": "python3", "main": "main.py",
            "capabilities": {"tools": [{"name": "t", "risk_level": "low"}]},
            "config": {"properties": props}
        });
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path().canonicalize().unwrap();
        std::fs::write(dir.join("main.py"), "").unwrap();
        parse_salmex(
            &m.to_string(),
            &dir.join("plugin.json"),
            &dir,
            &LoadOptions::default(),
        )
        .unwrap()
    }

    fn field(kind: Kind) -> Field {
        Field {
            key: "k".into(),
            kind,
            ..Field::default()
        }
    }

    #[test]
    fn command_line_text_is_coerced_to_the_field_type() {
        assert_eq!(
            coerce("p", &field(Kind::Boolean), "true").unwrap(),
            json!(true)
        );
        assert_eq!(
            coerce("p", &field(Kind::Integer), "-42").unwrap(),
            json!(-42)
        );
        assert_eq!(
            coerce("p", &field(Kind::Number), "1.5").unwrap(),
            json!(1.5)
        );
        assert_eq!(
            coerce("p", &field(Kind::String), "42").unwrap(),
            json!("42")
        );
        assert_eq!(coerce("p", &field(Kind::Json), "[1]").unwrap(), json!([1]));
        let sel = field(Kind::Select(vec!["a".into(), "b".into()]));
        assert_eq!(coerce("p", &sel, "b").unwrap(), json!("b"));
        for (f, raw, want) in [
            (
                field(Kind::Boolean),
                "yes",
                "\"k\" must be true or false, got \"yes\"",
            ),
            (field(Kind::Integer), "1.5", "\"k\" must be an integer"),
            (field(Kind::Number), "NaN", "\"k\" must be a number"),
            (sel, "c", "\"c\" is not an option of \"k\"; use one of a, b"),
            (field(Kind::Secret), "", "an empty secret for \"k\""),
        ] {
            let e = coerce("p", &f, raw).unwrap_err().to_string();
            assert!(e.starts_with("plugin \"p\" settings: "), "{e}");
            assert!(e.contains(want), "{raw}: {e}");
        }
        let mut f = field(Kind::Integer);
        f.schema = Some(json!({"type": "integer", "maximum": 10}));
        let e = coerce("p", &f, "11").unwrap_err().to_string();
        assert!(e.contains("\"11\" is not valid for \"k\""), "{e}");
    }

    #[test]
    fn launch_has_defaults_and_values_and_refuses_missing_required_fields() {
        let store = Store::open_in_memory().unwrap();
        let spec = salmex(json!([
            {"key": "units", "type": "select", "default": "metric",
             "options": [{"value": "metric"}, {"value": "imperial"}]},
            {"key": "url", "type": "string", "required": true},
            {"key": "mode", "type": "string"},
            {"key": "path", "type": "string", "required": true,
             "show_when": {"mode": "file"}}
        ]));
        let e = launch(&store, &spec).unwrap_err();
        assert_eq!(
            e,
            "required setting \"url\" is not set; set it with `plugd plugin config p set url VALUE`"
        );
        store
            .config_set_plain("p", "url", &json!("http://x"))
            .unwrap();
        let l = launch(&store, &spec).unwrap();
        assert_eq!(l.config, json!({"units": "metric", "url": "http://x"}));
        assert!(l.redact.is_empty());
        // `path` is required only while `mode` is "file".
        store.config_set_plain("p", "mode", &json!("file")).unwrap();
        let e = launch(&store, &spec).unwrap_err();
        assert!(e.contains("\"path\" is not set"), "{e}");
        store.config_set_plain("p", "mode", &json!("net")).unwrap();
        assert!(launch(&store, &spec).is_ok());
        // A stored key the manifest no longer declares is ignored.
        store.config_set_plain("p", "gone", &json!(1)).unwrap();
        assert!(launch(&store, &spec).unwrap().config.get("gone").is_none());
    }

    #[test]
    fn json_schema_properties_carry_titles_descriptions_options_and_secrets() {
        let fields = properties(&json!({
            "type": "object",
            "required": ["region"],
            "properties": {
                "region": {"type": "string", "title": "Region", "description": "Where it runs",
                           "enum": ["eu", "us"], "default": "eu"},
                "token": {"type": "string", "writeOnly": true, "title": "Token"},
                "depth": {"type": "integer"}
            }
        }));
        let f = |k: &str| fields.iter().find(|f| f.key == k).unwrap();
        let region = f("region");
        assert_eq!(region.kind, Kind::Select(vec!["eu".into(), "us".into()]));
        assert_eq!(region.label.as_deref(), Some("Region"));
        assert_eq!(region.description.as_deref(), Some("Where it runs"));
        assert_eq!(
            region.options,
            [("eu".into(), "eu".into()), ("us".into(), "us".into())]
        );
        assert!(region.required && region.default == Some(json!("eu")));
        assert_eq!(f("token").kind, Kind::Secret);
        assert_eq!(f("token").label.as_deref(), Some("Token"));
        assert_eq!(f("depth").kind, Kind::Integer);
        assert_eq!(f("depth").label, None);
    }

    #[test]
    fn salmex_fields_carry_labels_groups_and_option_labels() {
        let spec = salmex(json!([
            {"key": "units", "type": "select", "label": "Units", "group": "Display",
             "description": "How to show numbers",
             "options": [{"value": "metric", "label": "Metric"}, {"value": "imperial"}]}
        ]));
        let schema = schema_of(&spec);
        let f = &schema.fields[0];
        assert_eq!(f.label.as_deref(), Some("Units"));
        assert_eq!(f.group.as_deref(), Some("Display"));
        assert_eq!(f.description.as_deref(), Some("How to show numbers"));
        assert_eq!(
            f.options,
            [
                ("metric".into(), "Metric".into()),
                ("imperial".into(), "imperial".into())
            ]
        );
    }

    #[test]
    fn plugins_without_settings_get_an_empty_launch() {
        let store = Store::open_in_memory().unwrap();
        let spec = salmex(json!([]));
        let l = launch(&store, &spec).unwrap();
        assert!(l.config.is_null() && l.redact.is_empty());
    }
}
