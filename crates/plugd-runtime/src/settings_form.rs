//! A plugin's settings as a form (`GET` / `PUT /v1/plugins/{id}/config`):
//! every field of any dialect with its label, description, group, options
//! and current value, and a whole-form update that validates every value
//! before it stores any.
//!
//! Values here are typed JSON (a boolean is `true`, an integer `3`), unlike
//! the command line's text ([`crate::plugin_config::coerce`]). `null`
//! unsets a key; a secret sent as `""` is left as it is (a write-only field
//! left empty); keys not sent are left alone. All changes are written in one
//! transaction, then applied once ([`Runtime::config_apply`]).
//!
//! **Architecture invariant**: a secret's value never appears in a
//! [`SettingsForm`] (its `value` is always `null`, `set` says whether one is
//! stored) nor in a [`Problem`] message.

use std::collections::BTreeMap;

use plugd_store::secrets::{ConfigWrite, KeySource, StoredValue};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::plugin_config::{Applied, ConfigSchema, Field, Kind, SchemaProblem};
use crate::{Runtime, RuntimeError};

/// One choice of a select.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FormOption {
    /// The value stored and sent to the plugin.
    pub value: String,
    /// What the form shows.
    pub label: String,
}

/// One field of the form.
#[derive(Debug, Clone, Serialize)]
pub struct FormField {
    /// The key the plugin receives the value under.
    pub key: String,
    /// `string`, `secret`, `boolean`, `integer`, `number`, `select`, `json`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The label (the key when the manifest gives none).
    pub label: String,
    /// What it is for.
    pub description: Option<String>,
    /// The section it belongs to.
    pub group: Option<String>,
    /// Needed before the plugin may start (when shown).
    pub required: bool,
    /// The manifest's default (`null` for secrets).
    pub default: Value,
    /// Salmex conditional visibility as written, `null` if none.
    pub show_when: Value,
    /// A select's options (absent for other types).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<FormOption>>,
    /// The native / VAI property schema, `null` if none.
    pub schema: Value,
    /// The current value; `null` for secrets, always.
    pub value: Value,
    /// `set`, `default` or `unset`.
    pub source: &'static str,
    /// Whether it is a secret.
    pub secret: bool,
    /// Whether a value is stored (what a secret shows instead of its value).
    pub set: bool,
}

/// The settings form of one plugin.
#[derive(Debug, Clone, Serialize)]
pub struct SettingsForm {
    /// The plugin id.
    pub plugin: String,
    /// Its manifest dialect.
    pub dialect: String,
    /// Its fields, in manifest order.
    pub fields: Vec<FormField>,
    /// The group names, in manifest order.
    pub groups: Vec<String>,
}

/// What is wrong with one value of an update.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    /// The key.
    pub key: String,
    /// What is wrong and what would do (never the secret's value).
    pub message: String,
}

/// Why an update was not stored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PutError {
    /// Some values are invalid; nothing was stored.
    #[error(
        "plugin {plugin:?} settings: nothing was stored: {}",
        problems.iter().map(|p| format!("{}: {}", p.key, p.message)).collect::<Vec<_>>().join("; ")
    )]
    Invalid {
        /// The plugin.
        plugin: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
    /// Reading, storing or applying failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

impl From<plugd_store::StoreError> for PutError {
    fn from(e: plugd_store::StoreError) -> Self {
        PutError::Runtime(e.into())
    }
}

/// Checks the typed `value` against `field`: the value to store, or why not.
pub fn check_value(field: &Field, value: &Value) -> Result<Value, String> {
    let got = || match value {
        Value::String(_) => "a string".to_owned(),
        Value::Bool(_) => "a boolean".to_owned(),
        Value::Number(n) => format!("the number {n}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
        Value::Null => "null".to_owned(),
    };
    let v = match &field.kind {
        Kind::String => match value {
            Value::String(_) => value.clone(),
            _ => return Err(format!("must be a string, got {}", got())),
        },
        // A secret's message names the type sent, never its value.
        Kind::Secret => match value {
            Value::String(s) if !s.is_empty() => value.clone(),
            Value::Number(_) => return Err("must be a non-empty string, got a number".into()),
            _ => return Err(format!("must be a non-empty string, got {}", got())),
        },
        Kind::Boolean => match value {
            Value::Bool(_) => value.clone(),
            _ => return Err(format!("must be true or false, got {}", got())),
        },
        Kind::Integer => match value.as_i64() {
            Some(n) => Value::from(n),
            None => match value.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
                _ => return Err(format!("must be an integer, got {}", got())),
            },
        },
        Kind::Number => match value {
            Value::Number(_) => value.clone(),
            _ => return Err(format!("must be a number, got {}", got())),
        },
        Kind::Select(opts) => match value.as_str() {
            Some(s) if opts.iter().any(|o| o == s) => value.clone(),
            Some(s) => {
                return Err(format!(
                    "{s:?} is not one of its options ({})",
                    opts.join(", ")
                ));
            }
            None => {
                return Err(format!(
                    "must be one of its options ({}), got {}",
                    opts.join(", "),
                    got()
                ));
            }
        },
        Kind::Json => value.clone(),
    };
    match crate::plugin_config::schema_problem(field, &v) {
        None => Ok(v),
        Some(SchemaProblem::Unusable(e)) => Err(format!("its schema is not usable: {e}")),
        Some(SchemaProblem::Invalid(e)) => Err(format!("{v} is not valid: {e}")),
    }
}

async fn form_of(
    rt: &Runtime,
    id: &str,
    schema: &ConfigSchema,
) -> Result<SettingsForm, RuntimeError> {
    let sup = rt.supervised(id)?;
    let stored: BTreeMap<String, StoredValue> =
        rt.state().config_values(id).await?.into_iter().collect();
    let mut groups: Vec<String> = Vec::new();
    let fields = schema
        .fields
        .iter()
        .map(|f| {
            if let Some(g) = &f.group
                && !groups.contains(g)
            {
                groups.push(g.clone());
            }
            let secret = f.kind == Kind::Secret;
            let stored = stored.get(&f.key);
            let (value, source) = match (stored, &f.default) {
                (Some(_), _) if secret => (Value::Null, "set"),
                (Some(StoredValue::Secret(_)), _) => (Value::Null, "set"),
                (Some(StoredValue::Plain(v)), _) => (v.clone(), "set"),
                (None, Some(d)) if !secret => (d.clone(), "default"),
                (None, _) => (Value::Null, "unset"),
            };
            FormField {
                key: f.key.clone(),
                kind: f.kind.name(),
                label: f.label.clone().unwrap_or_else(|| f.key.clone()),
                description: f.description.clone(),
                group: f.group.clone(),
                required: f.required,
                default: if secret {
                    Value::Null
                } else {
                    f.default.clone().unwrap_or(Value::Null)
                },
                show_when: f.show_when.clone().unwrap_or(Value::Null),
                options: matches!(f.kind, Kind::Select(_)).then(|| {
                    f.options
                        .iter()
                        .map(|(value, label)| FormOption {
                            value: value.clone(),
                            label: label.clone(),
                        })
                        .collect()
                }),
                schema: f.schema.clone().unwrap_or(Value::Null),
                value,
                source,
                secret,
                set: stored.is_some(),
            }
        })
        .collect();
    Ok(SettingsForm {
        plugin: id.to_owned(),
        dialect: sup.spec().dialect.to_string(),
        fields,
        groups,
    })
}

impl Runtime {
    /// The settings form of `id` (secrets without their values).
    pub async fn config_form(&self, id: &str) -> Result<SettingsForm, RuntimeError> {
        let schema = self.config_schema(id)?;
        form_of(self, id, &schema).await
    }

    /// Validates every value of `values` (`null`: unset; `""` for a secret:
    /// unchanged), stores them all in one transaction, applies them once,
    /// and returns the new form. Nothing is stored when any value is
    /// invalid.
    pub async fn config_put(
        &self,
        id: &str,
        values: &Map<String, Value>,
    ) -> Result<(SettingsForm, Applied), PutError> {
        let schema = self.config_schema(id)?;
        let mut problems = Vec::new();
        let mut writes: Vec<(String, ConfigWrite)> = Vec::new();
        let mut secrets: Vec<(String, String)> = Vec::new();
        for (key, value) in values {
            let Some(field) = schema.field(key) else {
                problems.push(Problem {
                    key: key.clone(),
                    message: if schema.fields.is_empty() {
                        "the plugin declares no settings".to_owned()
                    } else {
                        format!(
                            "no such setting; its settings are: {}",
                            schema
                                .fields
                                .iter()
                                .map(|f| f.key.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                });
                continue;
            };
            if value.is_null() {
                writes.push((key.clone(), ConfigWrite::Unset));
                continue;
            }
            if field.kind == Kind::Secret && value.as_str() == Some("") {
                continue;
            }
            match check_value(field, value) {
                Ok(_) if field.kind == Kind::Secret => {
                    secrets.push((key.clone(), value.as_str().unwrap_or_default().to_owned()));
                }
                Ok(v) => writes.push((key.clone(), ConfigWrite::Plain(v))),
                Err(message) => problems.push(Problem {
                    key: key.clone(),
                    message,
                }),
            }
        }
        if !problems.is_empty() {
            return Err(PutError::Invalid {
                plugin: id.to_owned(),
                problems,
            });
        }
        if !secrets.is_empty() {
            let master = KeySource::from_env()
                .and_then(|s| s.load_or_create())
                .map_err(|e| RuntimeError::Config {
                    plugin: id.to_owned(),
                    message: format!("cannot store its secrets: {e}"),
                })?;
            for (key, plain) in secrets {
                let sealed =
                    master
                        .seal(id, &key, plain.as_bytes())
                        .map_err(|e| RuntimeError::Config {
                            plugin: id.to_owned(),
                            message: format!("cannot seal secret {key:?}: {e}"),
                        })?;
                writes.push((key, ConfigWrite::Sealed(sealed)));
            }
        }
        self.state().config_write_all(id, &writes).await?;
        self.plugin_changed(id);
        let applied = self.config_apply(id).await?;
        Ok((form_of(self, id, &schema).await?, applied))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field(kind: Kind) -> Field {
        Field {
            key: "k".into(),
            kind,
            ..Field::default()
        }
    }

    #[test]
    fn typed_values_are_checked_against_their_field() {
        assert_eq!(
            check_value(&field(Kind::Integer), &json!(3)).unwrap(),
            json!(3)
        );
        assert_eq!(
            check_value(&field(Kind::Integer), &json!(3.0)).unwrap(),
            json!(3)
        );
        assert_eq!(
            check_value(&field(Kind::Boolean), &json!(false)).unwrap(),
            json!(false)
        );
        let sel = field(Kind::Select(vec!["a".into(), "b".into()]));
        assert_eq!(check_value(&sel, &json!("b")).unwrap(), json!("b"));
        for (f, v, want) in [
            (
                field(Kind::Integer),
                json!("3"),
                "must be an integer, got a string",
            ),
            (field(Kind::Integer), json!(1.5), "must be an integer"),
            (field(Kind::Boolean), json!("true"), "must be true or false"),
            (
                field(Kind::String),
                json!({"a": 1}),
                "must be a string, got an object",
            ),
            (
                field(Kind::Number),
                json!([1]),
                "must be a number, got an array",
            ),
            (
                sel.clone(),
                json!("c"),
                "\"c\" is not one of its options (a, b)",
            ),
            (
                sel,
                json!(1),
                "must be one of its options (a, b), got the number 1",
            ),
            (field(Kind::Secret), json!(7), "must be a non-empty string"),
        ] {
            let e = check_value(&f, &v).unwrap_err();
            assert!(e.contains(want), "{v}: {e}");
        }
        let mut f = field(Kind::Integer);
        f.schema = Some(json!({"type": "integer", "maximum": 10}));
        assert!(
            check_value(&f, &json!(11))
                .unwrap_err()
                .contains("is not valid")
        );
    }
}
