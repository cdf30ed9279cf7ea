//! `plugd.yaml`'s `memory:` section as configuration: [`MemoryConfig`],
//! its vector target and embedder settings, and their validation. What
//! memory does with it (keyword or semantic recall, embedders, vector
//! backends) is plugd-agent's `recall`, `embed` and `vector`.
//!
//! ```yaml
//! memory:
//!   enabled: true                 # false: memory.recall answers -32603 "memory disabled"
//!   vector: {backend: builtin, collection: memories}
//!   embedder: {provider: openai, base_url: "http://127.0.0.1:8080/v1", model: m}
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use plugd_governance::plugd_yaml::ConfigError;

/// `memory.embedder` in `plugd.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case", deny_unknown_fields)]
pub enum EmbedderConfig {
    /// An OpenAI-compatible `/embeddings` endpoint.
    Openai {
        /// Base URL, e.g. `https://api.openai.com/v1`; `/embeddings` is appended.
        base_url: String,
        /// Model name, e.g. `text-embedding-3-small`.
        model: String,
        /// Environment variable holding the API key (none for local servers).
        #[serde(default)]
        api_key_env: Option<String>,
        /// Expected vector length; replies of another length are refused.
        #[serde(default)]
        dimensions: Option<usize>,
        /// Request timeout in milliseconds (default 30 000).
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// A native plugin answering the plugd extension `embed.texts`.
    Plugin {
        /// The plugin id.
        plugin: String,
        /// A model name passed to the plugin (it may ignore it).
        #[serde(default)]
        model: Option<String>,
        /// Expected vector length; replies of another length are refused.
        #[serde(default)]
        dimensions: Option<usize>,
    },
}

impl EmbedderConfig {
    /// The name errors give the embedder.
    pub fn label(&self) -> String {
        match self {
            EmbedderConfig::Openai { model, .. } => format!("openai:{model}"),
            EmbedderConfig::Plugin { plugin, .. } => format!("plugin:{plugin}"),
        }
    }
}

/// The name of the built-in vector backend.
pub const BUILTIN_BACKEND: &str = "builtin";

/// Longest embedding accepted (the built-in vector index's limit).
pub const MAX_EMBED_DIMENSION: usize = plugd_store::vectors::MAX_DIMENSION;

/// The collection memories are embedded into by default.
pub const DEFAULT_COLLECTION: &str = "memories";

/// `memory:` in `plugd.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryConfig {
    /// `enabled` (default `true`); `false` turns recall and adds off.
    pub enabled: bool,
    /// `vector`: where embeddings go (default `builtin` / `memories`).
    pub vector: VectorTarget,
    /// `embedder`: semantic recall when set, keyword recall otherwise.
    pub embedder: Option<EmbedderConfig>,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            enabled: true,
            vector: VectorTarget::default(),
            embedder: None,
        }
    }
}

/// `memory.vector`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VectorTarget {
    /// `builtin`, or a backend a plugin declares in `[plugin.extends].memory_backends`.
    pub backend: String,
    /// The collection.
    pub collection: String,
}

impl Default for VectorTarget {
    fn default() -> Self {
        VectorTarget {
            backend: BUILTIN_BACKEND.to_owned(),
            collection: DEFAULT_COLLECTION.to_owned(),
        }
    }
}

/// `memory:` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMemory {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    vector: Option<Spanned<RawVector>>,
    #[serde(default)]
    embedder: Option<Spanned<EmbedderConfig>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVector {
    #[serde(default)]
    backend: Option<Spanned<String>>,
    #[serde(default)]
    collection: Option<Spanned<String>>,
}

/// Validates `memory:` (`path` names the file in errors).
pub(crate) fn parse_config(
    raw: Spanned<RawMemory>,
    path: &Path,
) -> Result<MemoryConfig, ConfigError> {
    let invalid = |field: &str, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field: field.to_owned(),
        line,
        message,
    };
    let raw_line = raw.referenced.line();
    let raw = raw.value;
    let mut config = MemoryConfig {
        enabled: raw.enabled.unwrap_or(true),
        ..MemoryConfig::default()
    };
    let name_ok =
        |s: &str| !s.trim().is_empty() && s.len() <= 128 && !s.chars().any(char::is_control);
    if let Some(vector) = raw.vector {
        if raw.embedder.is_none() {
            return Err(invalid(
                "memory.vector",
                vector.referenced.line(),
                "is set but memory.embedder is not; semantic recall needs an embedder (add memory.embedder, or remove memory.vector for keyword recall)".into(),
            ));
        }
        let vector_line = raw_line.max(vector.referenced.line());
        if let Some(b) = vector.value.backend {
            if !name_ok(&b.value) {
                return Err(invalid(
                    "memory.vector.backend",
                    b.referenced.line().max(vector_line),
                    format!(
                        "{:?} is not a backend name; use builtin or a name a plugin declares in [plugin.extends].memory_backends",
                        b.value
                    ),
                ));
            }
            config.vector.backend = b.value;
        }
        if let Some(c) = vector.value.collection {
            if !name_ok(&c.value) {
                return Err(invalid(
                    "memory.vector.collection",
                    c.referenced.line().max(vector_line),
                    format!(
                        "{:?} is not a collection name; use 1-128 characters without control characters",
                        c.value
                    ),
                ));
            }
            config.vector.collection = c.value;
        }
    }
    if let Some(embedder) = raw.embedder {
        let line = embedder.referenced.line();
        let dims = match &embedder.value {
            EmbedderConfig::Openai {
                base_url,
                model,
                timeout_ms,
                dimensions,
                ..
            } => {
                let base = base_url.trim();
                if !(base.starts_with("http://") || base.starts_with("https://")) {
                    return Err(invalid(
                        "memory.embedder.base_url",
                        line,
                        format!(
                            "{base_url:?} must start with http:// or https:// (e.g. \"https://api.openai.com/v1\")"
                        ),
                    ));
                }
                if model.trim().is_empty() {
                    return Err(invalid(
                        "memory.embedder.model",
                        line,
                        "is empty; name the embedding model, e.g. text-embedding-3-small".into(),
                    ));
                }
                if timeout_ms.is_some_and(|t| t == 0 || t > crate::hooks::MAX_TIMEOUT_MS) {
                    return Err(invalid(
                        "memory.embedder.timeout_ms",
                        line,
                        format!(
                            "must be between 1 and {} (the default is 30000)",
                            crate::hooks::MAX_TIMEOUT_MS
                        ),
                    ));
                }
                *dimensions
            }
            EmbedderConfig::Plugin {
                plugin, dimensions, ..
            } => {
                if plugin.trim().is_empty() {
                    return Err(invalid(
                        "memory.embedder.plugin",
                        line,
                        "is empty; name the plugin that answers embed.texts".into(),
                    ));
                }
                *dimensions
            }
        };
        if dims.is_some_and(|d| d == 0 || d > MAX_EMBED_DIMENSION) {
            return Err(invalid(
                "memory.embedder.dimensions",
                line,
                format!("must be between 1 and {MAX_EMBED_DIMENSION}"),
            ));
        }
        config.embedder = Some(embedder.value);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use crate::config::PlugdConfig;
    use std::path::Path;

    fn parse(text: &str) -> Result<super::MemoryConfig, String> {
        PlugdConfig::parse(text, Path::new("/ws/plugd.yaml"), Path::new("/ws"))
            .map(|c| c.memory)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_full_sections() {
        let c = parse("").unwrap();
        assert!(c.enabled && c.embedder.is_none());
        assert_eq!(
            (c.vector.backend.as_str(), c.vector.collection.as_str()),
            ("builtin", "memories")
        );
        let c = parse("memory: {enabled: false}\n").unwrap();
        assert!(!c.enabled);
        let c = parse(
            "memory:\n  vector: {backend: pyvec, collection: kb}\n  embedder:\n    provider: openai\n    base_url: http://127.0.0.1:9/v1\n    model: m\n    api_key_env: K\n    dimensions: 4\n",
        )
        .unwrap();
        assert_eq!(c.vector.backend, "pyvec");
        assert_eq!(c.vector.collection, "kb");
        assert!(matches!(
            c.embedder,
            Some(super::EmbedderConfig::Openai {
                dimensions: Some(4),
                ..
            })
        ));
        let c = parse("memory:\n  embedder: {provider: plugin, plugin: sem}\n").unwrap();
        assert!(matches!(
            c.embedder,
            Some(super::EmbedderConfig::Plugin { .. })
        ));
    }

    #[test]
    fn the_schema_describes_the_section() {
        let ok = "memory:\n  enabled: true\n  vector: {backend: pyvec, collection: kb}\n  embedder: {provider: openai, base_url: \"http://h/v1\", model: m, api_key_env: K, dimensions: 3, timeout_ms: 5}\n";
        assert_eq!(
            crate::config::schema_violations(ok).unwrap(),
            Vec::<String>::new()
        );
        let ok = "memory: {embedder: {provider: plugin, plugin: p, model: m}}\n";
        assert_eq!(
            crate::config::schema_violations(ok).unwrap(),
            Vec::<String>::new()
        );
        for bad in [
            "memory: {enabled: 1}\n",
            "memory: {recall: x}\n",
            "memory: {embedder: {provider: plugin}}\n",
            "memory: {embedder: {provider: openai, base_url: u, model: m, dimensions: 0}}\n",
        ] {
            assert!(
                !crate::config::schema_violations(bad).unwrap().is_empty(),
                "{bad}"
            );
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_sections_are_named_with_their_line() {
        let e = parse("memory:\n  enabled: true\n  vector: {backend: builtin}\n").unwrap_err();
        assert!(
            e.contains("memory.vector: is set but memory.embedder is not") && e.contains("line 3"),
            "{e}"
        );
        let e = parse(
            "memory:\n  embedder:\n    provider: openai\n    base_url: localhost:1\n    model: m\n",
        )
        .unwrap_err();
        assert!(
            e.contains("memory.embedder.base_url: \"localhost:1\" must start with http://")
                && e.contains("line 3"),
            "{e}"
        );
        let e = parse("memory:\n  embedder: {provider: plugin, plugin: p, dimensions: 0}\n")
            .unwrap_err();
        assert!(
            e.contains("memory.embedder.dimensions: must be between 1 and 8192"),
            "{e}"
        );
        let e = parse("memory:\n  embedder: {provider: cohere, model: m}\n").unwrap_err();
        assert!(e.contains("cohere") && e.contains("line 2"), "{e}");
        let e = parse("memory:\n  recall: semantic\n").unwrap_err();
        assert!(e.contains("recall") && e.contains("line 2"), "{e}");
        let e = parse(
            "memory:\n  vector: {collection: \"\"}\n  embedder: {provider: plugin, plugin: p}\n",
        )
        .unwrap_err();
        assert!(
            e.contains("memory.vector.collection: \"\" is not a collection name"),
            "{e}"
        );
    }
}
