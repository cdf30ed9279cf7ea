//! Agent memory as configured by `plugd.yaml`'s `memory:` section: keyword
//! (FTS5) or semantic recall, for `plugd memory add|search` and the
//! `memory.recall` service of native plugins.
//!
//! ```yaml
//! memory:
//!   enabled: true                 # false: memory.recall answers -32603 "memory disabled"
//!   vector: {backend: builtin, collection: memories}
//!   embedder: {provider: openai, base_url: "http://127.0.0.1:8080/v1", model: m}
//! ```
//!
//! Without `embedder`, recall is keyword search of the state store (FTS5).
//! With one, [`Runtime::memory_add`] also writes the entry's embedding to the
//! vector backend (record id = memory id, metadata `{agent_id, tags}`), and
//! [`Runtime::memory_recall`] embeds the query, searches the backend filtered
//! by `agent_id`, drops matches scoring ≤ 0, and maps the rest back to the
//! stored entries (an id with no entry, or of another agent, is skipped).
//!
//! **No silent fallback**: when an embedder is configured and it or the
//! backend fails, the call fails with an error naming the cause; keyword
//! search is never used instead, so a misconfiguration cannot hide. An add
//! whose embedding or upsert fails is undone (the entry is deleted).
//!
//! The section is read on each call, so edits apply without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use plugd_host::extensions::VectorError;
use plugd_store::StoreError;
use plugd_store::memory::{DEFAULT_RECALL_LIMIT, MAX_RECALL_LIMIT, MemoryEntry};
use plugd_store::vectors::VectorRecord;
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_saphyr::Spanned;

use crate::config::{CONFIG_FILE, ConfigError, PlugdConfig};
use crate::embed::{EmbedError, Embedder, EmbedderConfig, MAX_EMBED_DIMENSION, build_embedder};
use crate::vector::{BUILTIN_BACKEND, VectorBackend};
use crate::{Runtime, RuntimeError};

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
                if timeout_ms.is_some_and(|t| t == 0 || t > crate::config::MAX_TIMEOUT_MS) {
                    return Err(invalid(
                        "memory.embedder.timeout_ms",
                        line,
                        format!(
                            "must be between 1 and {} (the default is 30000)",
                            crate::config::MAX_TIMEOUT_MS
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

/// Why a memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecallError {
    /// `memory.enabled: false`.
    #[error(
        "memory disabled: {} sets memory.enabled: false; set it to true to store and recall memories",
        path.display()
    )]
    Disabled {
        /// The configuration file.
        path: PathBuf,
    },
    /// `plugd.yaml` is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The embedder failed (semantic recall is configured; no fallback).
    #[error("semantic memory: {0}")]
    Embed(#[from] EmbedError),
    /// The vector backend failed.
    #[error("semantic memory: vector backend {backend:?}, collection {collection:?}: {error}")]
    Vector {
        /// The backend (`memory.vector.backend`).
        backend: String,
        /// The collection.
        collection: String,
        /// What it said.
        error: VectorError,
    },
    /// The vector backend named in `memory.vector.backend` does not exist.
    #[error("semantic memory: memory.vector.backend: {0}")]
    Backend(String),
}

/// The configured semantic side: embedder and backend.
struct Semantic {
    embedder: Arc<dyn Embedder>,
    backend: Arc<dyn VectorBackend>,
    target: VectorTarget,
}

impl Semantic {
    fn vector_error(&self, error: VectorError) -> RecallError {
        RecallError::Vector {
            backend: self.target.backend.clone(),
            collection: self.target.collection.clone(),
            error,
        }
    }

    async fn embed_one(&self, text: &str) -> Result<Vec<f32>, RecallError> {
        let texts = [text.to_owned()];
        let mut v = self.embedder.embed(&texts).await?;
        // `check_embeddings` guarantees one vector per text.
        v.pop().ok_or_else(|| {
            RecallError::Embed(EmbedError::Malformed {
                embedder: self.embedder.name().to_owned(),
                message: "no embedding".into(),
            })
        })
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, RecallError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| {
            RecallError::Store(StoreError::Invalid {
                what: format!("the store task ({e})"),
                problem: "it failed; see the log",
            })
        })?
        .map_err(RecallError::Store)
}

impl Runtime {
    /// `plugd.yaml`'s `memory:` section, read now.
    pub fn memory_config(&self) -> Result<MemoryConfig, RecallError> {
        Ok(PlugdConfig::load(self.dir())?.memory)
    }

    /// The semantic side, when an embedder is configured; errors when memory
    /// is disabled.
    fn semantic(&self) -> Result<Option<Semantic>, RecallError> {
        let config = self.memory_config()?;
        if !config.enabled {
            return Err(RecallError::Disabled {
                path: self.dir().join(CONFIG_FILE),
            });
        }
        let Some(embedder) = &config.embedder else {
            return Ok(None);
        };
        let embedder = build_embedder(embedder, self)?;
        let backend = self
            .vector_backend(&config.vector.backend)
            .map_err(|e| match e {
                RuntimeError::UnknownVectorBackend { .. } => RecallError::Backend(e.to_string()),
                other => RecallError::Backend(other.to_string()),
            })?;
        Ok(Some(Semantic {
            embedder,
            backend,
            target: config.vector,
        }))
    }

    /// Stores a memory for `agent_id`; with an embedder configured, also
    /// writes its embedding to the vector backend (undone on failure).
    pub async fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, RecallError> {
        let semantic = self.semantic()?;
        let store = self.store().clone();
        let (agent, text, labels) = (agent_id.to_owned(), content.to_owned(), tags.to_vec());
        let entry = blocking(move || store.memory_add(&agent, &text, &labels)).await?;
        let Some(sem) = semantic else {
            return Ok(entry);
        };
        let written = async {
            let embedding = sem.embed_one(&entry.content).await?;
            let record = VectorRecord {
                id: entry.id.clone(),
                content: entry.content.clone(),
                embedding,
                metadata: json!({"agent_id": entry.agent_id, "tags": entry.tags}),
            };
            sem.backend
                .upsert(&sem.target.collection, vec![record])
                .await
                .map_err(|e| sem.vector_error(e))
        }
        .await;
        if let Err(e) = written {
            let store = self.store().clone();
            let id = entry.id.clone();
            if let Err(undo) = blocking(move || store.memory_delete(&id)).await {
                tracing::warn!(id = %entry.id, error = %undo, "could not undo a memory add");
            }
            return Err(e);
        }
        Ok(entry)
    }

    /// The memories of `agent_id` that best match `query`, best first, at
    /// most `limit` (default 10, capped at 1000): semantic when an embedder
    /// is configured, keyword (FTS5) otherwise.
    pub async fn memory_recall(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, RecallError> {
        let limit = limit
            .unwrap_or(DEFAULT_RECALL_LIMIT)
            .clamp(1, MAX_RECALL_LIMIT);
        let semantic = self.semantic()?;
        let store = self.store().clone();
        let agent = agent_id.to_owned();
        let Some(sem) = semantic else {
            let query = query.to_owned();
            return blocking(move || store.memory_search(&agent, &query, Some(limit))).await;
        };
        // A bad agent id gets the store's own refusal (a -32602 for plugins):
        // keyword search checks the id before it looks at the query.
        if !plugd_store::memory::valid_agent_id(agent_id) {
            return blocking(move || store.memory_search(&agent, "", Some(limit))).await;
        }
        if query.trim().is_empty() {
            return Ok(Vec::new());
        }
        let embedding = sem.embed_one(query).await?;
        let matches = match sem
            .backend
            .search(
                &sem.target.collection,
                embedding,
                limit,
                Some(json!({ "agent_id": agent_id })),
            )
            .await
        {
            Ok(m) => m,
            // Nothing embedded yet.
            Err(VectorError::CollectionNotFound { .. }) => Vec::new(),
            Err(e) => return Err(sem.vector_error(e)),
        };
        let ids: Vec<String> = matches
            .into_iter()
            .filter(|m| m.score > 0.0)
            .map(|m| m.id)
            .collect();
        blocking(move || {
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(e) = store.memory_get(&id)?
                    && e.agent_id == agent
                {
                    out.push(e);
                }
            }
            Ok(out)
        })
        .await
    }
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
            Some(crate::embed::EmbedderConfig::Openai {
                dimensions: Some(4),
                ..
            })
        ));
        let c = parse("memory:\n  embedder: {provider: plugin, plugin: sem}\n").unwrap();
        assert!(matches!(
            c.embedder,
            Some(crate::embed::EmbedderConfig::Plugin { .. })
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
