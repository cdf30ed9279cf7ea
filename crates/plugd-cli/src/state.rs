//! The state store a CLI command opens when it works on the workspace itself (no serve running): one place that picks the backend.

use std::path::Path;
use std::sync::Arc;

use plugd_store::{StateStore, Store, StoreError};

/// The state store of the workspace at `dir`, as the backend-neutral trait
/// object: the workspace's SQLite file (`DIR/.plugd/state.db`) for now.
pub fn open(dir: &Path) -> Result<Arc<dyn StateStore>, StoreError> {
    Ok(Arc::new(Store::open(&dir.join(".plugd"))?))
}
