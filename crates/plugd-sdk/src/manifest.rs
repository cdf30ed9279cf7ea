//! Just enough of `nexo-plugin.toml` for a child: id, version, declared tools, and a JSON copy to echo.

use std::fmt;

use serde_json::{Map, Value};

/// Why a manifest or a tool catalog was refused before serving.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SdkError {
    /// The TOML text does not parse.
    Parse(String),
    /// A required field is missing or has the wrong type.
    MissingField(&'static str),
    /// `plugin.id` does not match `^[a-z][a-z0-9_]{0,31}$`.
    BadId(String),
    /// `plugin.version` is not `MAJOR.MINOR.PATCH[-pre][+build]`.
    BadVersion(String),
    /// A registered tool is not listed in `[plugin.extends] tools`.
    UndeclaredTool(String),
    /// A registered tool is not namespaced `<id>_*` / `ext_<id>_*`.
    UnnamespacedTool {
        /// The offending tool name.
        tool: String,
        /// This plugin's id.
        plugin_id: String,
    },
    /// The same tool name was registered twice.
    DuplicateTool(String),
}

impl fmt::Display for SdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SdkError::Parse(e) => write!(f, "manifest does not parse as TOML: {e}"),
            SdkError::MissingField(field) => {
                write!(
                    f,
                    "manifest is missing string `{field}`; add it under [plugin]"
                )
            }
            SdkError::BadId(id) => write!(
                f,
                "manifest plugin.id {id:?} must match ^[a-z][a-z0-9_]{{0,31}}$; use a lower-case slug"
            ),
            SdkError::BadVersion(v) => write!(
                f,
                "manifest plugin.version {v:?} is not semver; use MAJOR.MINOR.PATCH such as \"0.1.0\""
            ),
            SdkError::UndeclaredTool(t) => write!(
                f,
                "tool {t:?} is not in the manifest's [plugin.extends] tools; declare it there or the host refuses the plugin"
            ),
            SdkError::UnnamespacedTool { tool, plugin_id } => write!(
                f,
                "tool {tool:?} must be named {plugin_id}_<name> or ext_{plugin_id}_<name> (at most 32 characters of [a-z0-9_])"
            ),
            SdkError::DuplicateTool(t) => {
                write!(f, "tool {t:?} is registered twice; register each tool once")
            }
        }
    }
}

impl std::error::Error for SdkError {}

/// The parsed manifest.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    pub(crate) id: String,
    pub(crate) version: String,
    pub(crate) declared_tools: Vec<String>,
    pub(crate) json: Value,
}

impl Manifest {
    pub(crate) fn parse(text: &str) -> Result<Manifest, SdkError> {
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| SdkError::Parse(e.to_string().trim().to_owned()))?;
        let plugin = doc
            .get("plugin")
            .and_then(toml::Value::as_table)
            .ok_or(SdkError::MissingField("plugin"))?;
        let id = plugin
            .get("id")
            .and_then(toml::Value::as_str)
            .ok_or(SdkError::MissingField("plugin.id"))?;
        if !is_slug(id) {
            return Err(SdkError::BadId(id.to_owned()));
        }
        let version = plugin
            .get("version")
            .and_then(toml::Value::as_str)
            .ok_or(SdkError::MissingField("plugin.version"))?;
        if !is_semver(version) {
            return Err(SdkError::BadVersion(version.to_owned()));
        }
        let declared_tools = plugin
            .get("extends")
            .and_then(|e| e.get("tools"))
            .and_then(toml::Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Manifest {
            id: id.to_owned(),
            version: version.to_owned(),
            declared_tools,
            json: Value::Object(table_to_json(&doc)),
        })
    }
}

/// `^[a-z][a-z0-9_]{0,31}$`, by hand (no regex dependency in plugins).
pub(crate) fn is_slug(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// `<id>_x` or `ext_<id>_x`, and a slug.
pub(crate) fn is_namespaced(tool: &str, id: &str) -> bool {
    let rest = tool.strip_prefix("ext_").unwrap_or(tool);
    let own = rest
        .strip_prefix(id)
        .and_then(|r| r.strip_prefix('_'))
        .is_some_and(|r| !r.is_empty());
    let plain = tool
        .strip_prefix(id)
        .and_then(|r| r.strip_prefix('_'))
        .is_some_and(|r| !r.is_empty());
    is_slug(tool) && (own || plain)
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|c| c.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
        })
        && !v.ends_with(['-', '+'])
}

fn table_to_json(t: &toml::Table) -> Map<String, Value> {
    t.iter()
        .map(|(k, v)| (k.clone(), toml_to_json(v)))
        .collect()
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => {
            serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number)
        }
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(table_to_json(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_and_namespace_rules() {
        assert!(is_slug("a"));
        assert!(is_slug("hello_rust2"));
        assert!(!is_slug("Hello"));
        assert!(!is_slug("1abc"));
        assert!(!is_slug(&"a".repeat(33)));
        assert!(is_namespaced("demo_greet", "demo"));
        assert!(is_namespaced("ext_demo_greet", "demo"));
        assert!(!is_namespaced("demo_", "demo"));
        assert!(!is_namespaced("demogreet", "demo"));
        assert!(!is_namespaced("other_greet", "demo"));
    }

    #[test]
    fn semver_rule() {
        for ok in ["0.1.0", "1.2.3-alpha.1", "10.0.0+build"] {
            assert!(is_semver(ok), "{ok}");
        }
        for bad in ["1.2", "01.2.3", "1.2.x", "", "1.2.3-"] {
            assert!(!is_semver(bad), "{bad}");
        }
    }

    #[test]
    fn manifest_keeps_everything_as_json() {
        let m = Manifest::parse(
            "[plugin]\nid = \"demo\"\nversion = \"0.1.0\"\nwhen = 1979-05-27\n[plugin.extends]\ntools = [\"demo_a\"]\n",
        )
        .unwrap();
        assert_eq!(m.id, "demo");
        assert_eq!(m.declared_tools, ["demo_a"]);
        assert_eq!(m.json["plugin"]["when"], "1979-05-27");
        assert_eq!(m.json["plugin"]["extends"]["tools"][0], "demo_a");
    }

    #[test]
    fn manifest_errors_say_what_to_do() {
        let e = Manifest::parse("[plugin]\nid = \"Bad\"\nversion = \"0.1.0\"\n").unwrap_err();
        assert_eq!(e, SdkError::BadId("Bad".into()));
        assert!(e.to_string().contains("\"Bad\""));
        let e = Manifest::parse("[plugin]\nid = \"ok\"\n").unwrap_err();
        assert_eq!(e, SdkError::MissingField("plugin.version"));
        assert!(matches!(
            Manifest::parse("[plugin"),
            Err(SdkError::Parse(_))
        ));
    }
}
