//! The workspace's plugins as the runtime knows them: a set replaced whole
//! when serve finds a plugin directory added after it started
//! ([`crate::Runtime::rescan`]), so readers hold a consistent snapshot and
//! a handle to a plugin never changes under them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use plugd_host::supervisor::Supervised;

use crate::workspace::BrokenPlugin;

/// One snapshot: the valid plugins by id and the broken manifests.
#[derive(Default)]
pub(crate) struct PluginSet {
    /// Supervised plugins by id.
    pub map: BTreeMap<String, Supervised>,
    /// Plugins whose manifest does not load.
    pub broken: Vec<BrokenPlugin>,
}

/// The current [`PluginSet`], copy on write.
pub(crate) struct PluginMap {
    set: RwLock<Arc<PluginSet>>,
}

impl PluginMap {
    pub(crate) fn new(set: PluginSet) -> PluginMap {
        PluginMap {
            set: RwLock::new(Arc::new(set)),
        }
    }

    /// The current set.
    pub(crate) fn snapshot(&self) -> Arc<PluginSet> {
        self.set.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Plugin `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Supervised> {
        self.snapshot().map.get(id).cloned()
    }

    /// Every plugin id, sorted.
    pub(crate) fn keys(&self) -> std::vec::IntoIter<String> {
        let keys: Vec<String> = self.snapshot().map.keys().cloned().collect();
        keys.into_iter()
    }

    /// Every plugin with its id, sorted by id.
    pub(crate) fn iter(&self) -> std::vec::IntoIter<(String, Supervised)> {
        let pairs: Vec<(String, Supervised)> = self
            .snapshot()
            .map
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        pairs.into_iter()
    }

    /// Every plugin.
    pub(crate) fn values(&self) -> std::vec::IntoIter<Supervised> {
        let all: Vec<Supervised> = self.snapshot().map.values().cloned().collect();
        all.into_iter()
    }

    /// Replaces the set with `f(current)`; returns what `f` returned.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&PluginSet) -> (PluginSet, T)) -> T {
        let mut guard = self.set.write().unwrap_or_else(|p| p.into_inner());
        let (next, out) = f(&guard);
        *guard = Arc::new(next);
        out
    }
}
