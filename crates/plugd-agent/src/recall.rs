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
//! With one, [`MemoryExt::memory_add`] also writes the entry's embedding to the
//! vector backend (record id = memory id, metadata `{agent_id, tags}`), and
//! [`MemoryExt::memory_recall`] embeds the query, searches the backend filtered
//! by `agent_id`, drops matches scoring ≤ 0, and maps the rest back to the
//! stored entries (an id with no entry, or of another agent, is skipped).
//!
//! **No silent fallback**: when an embedder is configured and it or the
//! backend fails, the call fails with an error naming the cause; keyword
//! search is never used instead, so a misconfiguration cannot hide. An add
//! whose embedding or upsert fails is undone (the entry is deleted).
//!
//! The section is read on each call, so edits apply without a restart.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use plugd_host::extensions::VectorError;
use plugd_runtime::config::{CONFIG_FILE, ConfigError, PlugdConfig};
use plugd_runtime::{Runtime, RuntimeError};
use plugd_store::StoreError;
use plugd_store::memory::{DEFAULT_RECALL_LIMIT, MAX_RECALL_LIMIT, MemoryEntry};
use plugd_store::vectors::VectorRecord;
use serde_json::json;

use crate::embed::{EmbedError, Embedder, build_embedder};
use crate::vector::{VectorBackend, VectorExt};

pub use plugd_runtime::memory_config::{DEFAULT_COLLECTION, MemoryConfig, VectorTarget};

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

/// The semantic side, when an embedder is configured; errors when memory
/// is disabled.
fn semantic(rt: &Runtime) -> Result<Option<Semantic>, RecallError> {
    let config = rt.memory_config()?;
    if !config.enabled {
        return Err(RecallError::Disabled {
            path: rt.dir().join(CONFIG_FILE),
        });
    }
    let Some(embedder) = &config.embedder else {
        return Ok(None);
    };
    let embedder = build_embedder(embedder, rt)?;
    let backend = rt
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

/// Agent memory on a [`Runtime`]: `plugd memory add|search` and the
/// `memory.recall` service of native plugins.
pub trait MemoryExt {
    /// `plugd.yaml`'s `memory:` section, read now.
    fn memory_config(&self) -> Result<MemoryConfig, RecallError>;

    /// Stores a memory for `agent_id`; with an embedder configured, also
    /// writes its embedding to the vector backend (undone on failure).
    fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> impl Future<Output = Result<MemoryEntry, RecallError>> + Send;

    /// The memories of `agent_id` that best match `query`, best first, at
    /// most `limit` (default 10, capped at 1000): semantic when an embedder
    /// is configured, keyword (FTS5) otherwise.
    fn memory_recall(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> impl Future<Output = Result<Vec<MemoryEntry>, RecallError>> + Send;
}

impl MemoryExt for Runtime {
    /// `plugd.yaml`'s `memory:` section, read now.
    fn memory_config(&self) -> Result<MemoryConfig, RecallError> {
        Ok(PlugdConfig::load(self.dir())?.memory)
    }

    /// Stores a memory for `agent_id`; with an embedder configured, also
    /// writes its embedding to the vector backend (undone on failure).
    async fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, RecallError> {
        let semantic = semantic(self)?;
        let entry = self.state().memory_add(agent_id, content, tags).await?;
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
            if let Err(undo) = self.state().memory_delete(&entry.id).await {
                tracing::warn!(id = %entry.id, error = %undo, "could not undo a memory add");
            }
            return Err(e);
        }
        Ok(entry)
    }

    /// The memories of `agent_id` that best match `query`, best first, at
    /// most `limit` (default 10, capped at 1000): semantic when an embedder
    /// is configured, keyword (FTS5) otherwise.
    async fn memory_recall(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, RecallError> {
        let limit = limit
            .unwrap_or(DEFAULT_RECALL_LIMIT)
            .clamp(1, MAX_RECALL_LIMIT);
        let semantic = semantic(self)?;
        let store = self.state();
        let Some(sem) = semantic else {
            return Ok(store.memory_search(agent_id, query, Some(limit)).await?);
        };
        // A bad agent id gets the store's own refusal (a -32602 for plugins):
        // keyword search checks the id before it looks at the query.
        if !plugd_store::memory::valid_agent_id(agent_id) {
            return Ok(store.memory_search(agent_id, "", Some(limit)).await?);
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
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(e) = store.memory_get(&id).await?
                && e.agent_id == agent_id
            {
                out.push(e);
            }
        }
        Ok(out)
    }
}
