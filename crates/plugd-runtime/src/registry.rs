//! The tool registry: every callable tool, its plugin, and its argument schema.
//!
//! Entries point at a plugin by id, never at a connection. Arguments are
//! validated against the tool's JSON Schema (2020-12 unless the schema's
//! `$schema` names draft-07 or another draft) before the plugin is called; a
//! schema that does not compile makes the tool uncallable with a clear error,
//! never a panic. Remote `$ref`s are not fetched.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use plugd_host::ToolDef;
use serde::Serialize;
use serde_json::Value;

/// One callable tool.
#[derive(Debug, Serialize)]
pub struct ToolEntry {
    /// The name `plugd tool call` accepts (namespaced).
    pub name: String,
    /// The plugin that serves it.
    pub plugin: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: Value,
    /// Risk level, when the plugin declares one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<String>,
    /// Title, annotations, output schema and icons, when the plugin gave
    /// any (MCP tools).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Box<plugd_host::model::ToolMeta>>,
    /// The definition as the plugin gave it (wire name included).
    #[serde(skip)]
    pub def: ToolDef,
    #[serde(skip)]
    validator: OnceLock<Result<jsonschema::Validator, String>>,
    #[serde(skip)]
    output_validator: OnceLock<Result<jsonschema::Validator, String>>,
}

/// One argument that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// JSON Pointer to the offending value (`""` for the whole object).
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

/// Why arguments were refused before the call.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// The arguments do not match the schema.
    #[error("arguments for {tool:?} (plugin {plugin:?}) do not match its input schema: {}", describe(.errors))]
    Invalid {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
        /// Each offending field.
        errors: Vec<FieldError>,
    },
    /// The plugin advertised a schema that does not compile.
    #[error(
        "tool {tool:?} (plugin {plugin:?}) has an invalid input schema and cannot be called: {reason}"
    )]
    BadSchema {
        /// The tool.
        tool: String,
        /// Its plugin.
        plugin: String,
        /// The compile error.
        reason: String,
    },
}

fn describe(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| {
            if e.path.is_empty() {
                e.message.clone()
            } else {
                format!("{}: {}", e.path, e.message)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Errors listed per call at most (a hostile schema could produce thousands).
const MAX_FIELD_ERRORS: usize = 20;

impl ToolEntry {
    /// An entry for `def`, served by `plugin`.
    pub fn new(plugin: &str, def: &ToolDef) -> Self {
        ToolEntry {
            name: def.name.clone(),
            plugin: plugin.to_owned(),
            description: def.description.clone(),
            input_schema: def.input_schema.clone(),
            risk_level: def.risk_level.clone(),
            meta: def.meta.clone(),
            def: def.clone(),
            validator: OnceLock::new(),
            output_validator: OnceLock::new(),
        }
    }

    /// Checks a result's `structuredContent` (a VAI result's
    /// `structured_output`) against the tool's declared output schema (MCP
    /// `outputSchema`, VAI `output_schema`): `Ok` when it declares none or
    /// the result is an error result or a 2026-07-28 `input_required` one;
    /// otherwise why it does not conform,
    /// each offending place named by its JSON Pointer under the field.
    pub fn check_output(&self, result: &Value) -> Result<(), String> {
        let Some(schema) = self.def.output_schema() else {
            return Ok(());
        };
        let flag = result.get("isError").or_else(|| result.get("is_error"));
        if flag.and_then(Value::as_bool) == Some(true) {
            return Ok(());
        }
        // A 2026-07-28 question for the client (passed through the gateway)
        // is not the tool's result yet.
        if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
            return Ok(());
        }
        let validator = self
            .output_validator
            .get_or_init(|| jsonschema::validator_for(schema).map_err(|e| e.to_string()));
        let validator = validator
            .as_ref()
            .map_err(|e| format!("its outputSchema does not compile ({e})"))?;
        let (field, structured) = match (
            result.get("structuredContent"),
            result.get("structured_output"),
        ) {
            (Some(s), _) => ("structuredContent", s),
            (None, Some(s)) => ("structured_output", s),
            (None, None) => {
                return Err(
                    "it declares an outputSchema but the result has no structuredContent".into(),
                );
            }
        };
        let errors: Vec<String> = validator
            .iter_errors(structured)
            .take(MAX_FIELD_ERRORS)
            .map(|e| format!("{field}{}: {e}", e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "its {field} does not match its outputSchema: {}",
                errors.join("; ")
            ))
        }
    }

    /// Checks `args` against the input schema.
    pub fn validate(&self, args: &Value) -> Result<(), ArgsError> {
        let validator = self.validator.get_or_init(|| {
            jsonschema::validator_for(&self.input_schema).map_err(|e| e.to_string())
        });
        let validator = validator.as_ref().map_err(|reason| ArgsError::BadSchema {
            tool: self.name.clone(),
            plugin: self.plugin.clone(),
            reason: reason.clone(),
        })?;
        let errors: Vec<FieldError> = validator
            .iter_errors(args)
            .take(MAX_FIELD_ERRORS)
            .map(|e| FieldError {
                path: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ArgsError::Invalid {
                tool: self.name.clone(),
                plugin: self.plugin.clone(),
                errors,
            })
        }
    }
}

/// All tools of the approved plugins, by name.
#[derive(Debug)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<ToolEntry>>,
    /// The names each plugin holds, so per-plugin work is not O(all tools).
    by_plugin: BTreeMap<String, Vec<String>>,
    /// Bumped at every change of the tools or of their enabled state, for
    /// surfaces that tell their clients (MCP `tools/list_changed`).
    changes: tokio::sync::watch::Sender<u64>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        ToolRegistry {
            tools: BTreeMap::new(),
            by_plugin: BTreeMap::new(),
            changes: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl ToolRegistry {
    /// Replaces every tool of `plugin` with `defs`. Names already taken by
    /// another plugin are refused (logged), so no plugin can shadow another's
    /// tool.
    pub fn set_plugin_tools(&mut self, plugin: &str, defs: &[ToolDef]) {
        self.remove_plugin(plugin);
        self.touch();
        let mut names = Vec::new();
        for def in defs {
            match self.tools.get(&def.name) {
                Some(existing) => tracing::error!(
                    plugin,
                    tool = %def.name,
                    owner = %existing.plugin,
                    "tool name already registered by another plugin; ignored"
                ),
                None => {
                    self.tools
                        .insert(def.name.clone(), Arc::new(ToolEntry::new(plugin, def)));
                    names.push(def.name.clone());
                }
            }
        }
        if !names.is_empty() {
            self.by_plugin.insert(plugin.to_owned(), names);
        }
    }

    /// Removes every tool of `plugin`.
    pub fn remove_plugin(&mut self, plugin: &str) {
        if let Some(names) = self.by_plugin.remove(plugin) {
            for name in names {
                self.tools.remove(&name);
            }
            self.touch();
        }
    }

    /// Tells subscribers that the tools (or their enabled state) changed.
    pub fn touch(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees every later change ([`ToolRegistry::touch`]).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The tools of `plugin`, sorted by name.
    pub fn plugin_tools(&self, plugin: &str) -> Vec<Arc<ToolEntry>> {
        let mut out: Vec<Arc<ToolEntry>> = self
            .by_plugin
            .get(plugin)
            .into_iter()
            .flatten()
            .filter_map(|n| self.tools.get(n).cloned())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The tool called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<ToolEntry>> {
        self.tools.get(name).cloned()
    }

    /// The tools of `plugin`, sorted by name, without copying the rest
    /// (listing every plugin stays linear in the tools, not quadratic).
    pub fn of_plugin<'a>(&'a self, plugin: &'a str) -> impl Iterator<Item = &'a Arc<ToolEntry>> {
        self.tools.values().filter(move |t| t.plugin == plugin)
    }

    /// Every tool, sorted by name.
    pub fn list(&self) -> Vec<Arc<ToolEntry>> {
        self.tools.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(schema: Value) -> ToolEntry {
        ToolEntry::new("p", &ToolDef::new("p_t", "", schema))
    }

    #[test]
    fn lists_every_offending_field() {
        let e = entry(json!({
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
            "additionalProperties": false
        }));
        assert!(e.validate(&json!({"city": "Oslo", "days": 2})).is_ok());
        let err = e.validate(&json!({"days": 0, "extra": true})).unwrap_err();
        let ArgsError::Invalid { errors, .. } = &err else {
            panic!("{err:?}")
        };
        let paths: Vec<&str> = errors.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"/days"), "{paths:?}");
        assert!(
            paths.contains(&""),
            "missing `city` is reported on the object: {paths:?}"
        );
        let text = err.to_string();
        assert!(text.contains("city") && text.contains("extra"), "{text}");
    }

    #[test]
    fn draft_07_schemas_are_honoured() {
        // In draft-07 `items` as an array is tuple validation; in 2020-12 it is not allowed.
        let e = entry(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "number"}]}}
        }));
        assert!(e.validate(&json!({"pair": ["a", 1]})).is_ok());
        assert!(e.validate(&json!({"pair": [1, "a"]})).is_err());
    }

    #[test]
    fn a_broken_schema_refuses_calls_without_panicking() {
        let e = entry(json!({"type": "no-such-type"}));
        assert!(matches!(
            e.validate(&json!({})),
            Err(ArgsError::BadSchema { .. })
        ));
        let remote = entry(json!({"$ref": "https://example.invalid/schema.json"}));
        assert!(matches!(
            remote.validate(&json!({})),
            Err(ArgsError::BadSchema { .. })
        ));
    }

    #[test]
    fn a_plugin_cannot_take_another_plugins_tool_name() {
        let mut reg = ToolRegistry::default();
        let def = |name: &str| ToolDef::new(name, "", json!({}));
        reg.set_plugin_tools("a", &[def("a_x")]);
        reg.set_plugin_tools("b", &[def("a_x"), def("b_y")]);
        assert_eq!(reg.get("a_x").unwrap().plugin, "a");
        assert_eq!(reg.list().len(), 2);
        reg.set_plugin_tools("a", &[]);
        assert!(reg.get("a_x").is_none());
    }
}
