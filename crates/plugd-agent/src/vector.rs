//! Vector memory backends behind one trait: the built-in index in the state
//! store (`builtin`, exact cosine search) and plugins that declare
//! `[plugin.extends].memory_backends` (nexo §5.w).
//!
//! A plugin backend is looked up per call through its `Supervised`, so a
//! restart swaps the connection underneath; it starts on first use (it must
//! be approved).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugd_host::extensions::{
    self, MEMORY_TIMEOUT_ENV, VECTOR_SEARCH_TIMEOUT, VECTOR_WRITE_TIMEOUT, VectorError,
};
use plugd_store::StateStore;
use plugd_store::vectors::{VectorMatch, VectorRecord, VectorStoreError};
use serde_json::{Value, json};

use plugd_runtime::{Runtime, RuntimeError};

pub use plugd_runtime::memory_config::BUILTIN_BACKEND;

/// What a backend returns.
pub type VectorFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, VectorError>> + Send + 'a>>;

/// A vector memory backend.
pub trait VectorBackend: Send + Sync {
    /// Its name (`builtin`, or the name a plugin declares).
    fn name(&self) -> &str;
    /// Inserts or replaces records; the count written.
    fn upsert<'a>(
        &'a self,
        collection: &'a str,
        records: Vec<VectorRecord>,
    ) -> VectorFuture<'a, u64>;
    /// The `limit` best matches for `embedding` whose metadata matches `filter`.
    fn search<'a>(
        &'a self,
        collection: &'a str,
        embedding: Vec<f32>,
        limit: usize,
        filter: Option<Value>,
    ) -> VectorFuture<'a, Vec<VectorMatch>>;
    /// Deletes records; the count deleted.
    fn delete<'a>(&'a self, collection: &'a str, ids: Vec<String>) -> VectorFuture<'a, u64>;
}

fn from_store(e: VectorStoreError) -> VectorError {
    match e {
        VectorStoreError::CollectionNotFound { collection } => {
            VectorError::CollectionNotFound { collection }
        }
        VectorStoreError::DimensionMismatch { expected, got } => VectorError::DimensionMismatch {
            expected: expected as u64,
            got: got as u64,
        },
        VectorStoreError::Invalid(message) => VectorError::Invalid { message },
        other => VectorError::WriteFailed {
            message: other.to_string(),
        },
    }
}

/// The built-in backend: the state store's vector index. **Scaling limit**:
/// exact search reads the whole collection (see `plugd_store::vectors`).
#[derive(Debug, Clone)]
pub struct StoreBackend {
    store: Arc<dyn StateStore>,
}

impl StoreBackend {
    /// The backend over `store`.
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        StoreBackend { store }
    }
}

impl VectorBackend for StoreBackend {
    fn name(&self) -> &str {
        BUILTIN_BACKEND
    }

    fn upsert<'a>(
        &'a self,
        collection: &'a str,
        records: Vec<VectorRecord>,
    ) -> VectorFuture<'a, u64> {
        Box::pin(async move {
            self.store
                .vector_upsert(collection, &records)
                .await
                .map(|n| n as u64)
                .map_err(from_store)
        })
    }

    fn search<'a>(
        &'a self,
        collection: &'a str,
        embedding: Vec<f32>,
        limit: usize,
        filter: Option<Value>,
    ) -> VectorFuture<'a, Vec<VectorMatch>> {
        Box::pin(async move {
            self.store
                .vector_search(collection, &embedding, limit, filter.as_ref())
                .await
                .map_err(from_store)
        })
    }

    fn delete<'a>(&'a self, collection: &'a str, ids: Vec<String>) -> VectorFuture<'a, u64> {
        Box::pin(async move {
            self.store
                .vector_delete(collection, &ids)
                .await
                .map(|n| n as u64)
                .map_err(from_store)
        })
    }
}

/// A backend served by a native plugin.
#[derive(Debug, Clone)]
pub struct PluginBackend {
    runtime: Runtime,
    plugin: String,
    name: String,
    write_timeout: Duration,
    search_timeout: Duration,
}

impl PluginBackend {
    async fn conn(&self, timeout: Duration) -> Result<Arc<plugd_host::Conn>, VectorError> {
        let sup = self
            .runtime
            .supervised(&self.plugin)
            .map_err(|e| VectorError::Other {
                message: e.to_string(),
            })?;
        sup.connection(Instant::now() + timeout)
            .await
            .map_err(|e| VectorError::Other {
                message: format!("backend {:?}: {e}", self.name),
            })
    }
}

impl VectorBackend for PluginBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn upsert<'a>(
        &'a self,
        collection: &'a str,
        records: Vec<VectorRecord>,
    ) -> VectorFuture<'a, u64> {
        Box::pin(async move {
            let conn = self.conn(self.write_timeout).await?;
            let records = serde_json::to_value(&records).unwrap_or(Value::Null);
            extensions::vector_upsert(
                &conn.peer,
                &self.name,
                collection,
                records,
                self.write_timeout,
            )
            .await
        })
    }

    fn search<'a>(
        &'a self,
        collection: &'a str,
        embedding: Vec<f32>,
        limit: usize,
        filter: Option<Value>,
    ) -> VectorFuture<'a, Vec<VectorMatch>> {
        Box::pin(async move {
            let conn = self.conn(self.search_timeout).await?;
            let query = json!({"embedding": embedding, "limit": limit, "filter": filter});
            let matches = extensions::vector_search(
                &conn.peer,
                &self.name,
                collection,
                query,
                self.search_timeout,
            )
            .await?;
            serde_json::from_value(matches.clone()).map_err(|e| VectorError::Other {
                message: format!(
                    "backend {:?} answered matches that are not [{{id, content, score, metadata}}]: {e}",
                    self.name
                ),
            })
        })
    }

    fn delete<'a>(&'a self, collection: &'a str, ids: Vec<String>) -> VectorFuture<'a, u64> {
        Box::pin(async move {
            let conn = self.conn(self.write_timeout).await?;
            extensions::vector_delete(&conn.peer, &self.name, collection, &ids, self.write_timeout)
                .await
        })
    }
}

/// The vector backends of a [`Runtime`].
pub trait VectorExt {
    /// The vector backend `name`: `builtin`, or the native plugin that
    /// declares it in `[plugin.extends].memory_backends`.
    fn vector_backend(&self, name: &str) -> Result<Arc<dyn VectorBackend>, RuntimeError>;
}

impl VectorExt for Runtime {
    fn vector_backend(&self, name: &str) -> Result<Arc<dyn VectorBackend>, RuntimeError> {
        if name == BUILTIN_BACKEND {
            return Ok(Arc::new(StoreBackend::new(self.state().clone())));
        }
        let mut declared = vec![BUILTIN_BACKEND.to_owned()];
        for (id, sup) in self.supervised_plugins() {
            let Some(extends) = sup.spec().native_extends() else {
                continue;
            };
            if extends.memory_backends.iter().any(|b| b == name) {
                let write_timeout = extensions::deadline(MEMORY_TIMEOUT_ENV, VECTOR_WRITE_TIMEOUT)
                    .map_err(RuntimeError::Workspace)?;
                let search_timeout =
                    extensions::deadline(MEMORY_TIMEOUT_ENV, VECTOR_SEARCH_TIMEOUT)
                        .map_err(RuntimeError::Workspace)?;
                return Ok(Arc::new(PluginBackend {
                    runtime: self.clone(),
                    plugin: id.clone(),
                    name: name.to_owned(),
                    write_timeout,
                    search_timeout,
                }));
            }
            declared.extend(extends.memory_backends.iter().cloned());
        }
        Err(RuntimeError::UnknownVectorBackend {
            name: name.to_owned(),
            known: declared.join(", "),
        })
    }
}
