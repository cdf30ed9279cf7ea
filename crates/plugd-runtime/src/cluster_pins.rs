//! Consent across a cluster's nodes: approval pins shared through the cluster's blob store, and approvals made on another node followed here.
//!
//! With a blob store ([`Runtime::share_pins`], NATS JetStream's Object Store
//! when `plugd serve --nats`), an approval here also publishes its pin, and
//! a node whose pin of an approval is missing takes it from the store,
//! verified by the approval's digest (`Pins::adopt`). When the control
//! epoch moves ([`crate::consent`]), [`Runtime::follow_approvals`] lists
//! the tools of plugins approved elsewhere: from this node's copy when its
//! files digest to the approval, else from the pin taken from the cluster
//! (the plugin is then loaded from that read-only pin). A plugin whose
//! approval is withdrawn elsewhere stops here and, if it came from the
//! cluster, disappears.
//!
//! PostgreSQL is the truth: the blob store is trusted for availability
//! only, and what it lacks or corrupts refuses a start naming the plugin.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use plugd_store::pin::{PinError, Pins};
use plugd_store::pin_share::{PinBlobs, max_archive_bytes};

use crate::{Runtime, RuntimeError, ToolDef, changes, read, write};

/// The cluster's blob store for pins, once the node has given one.
#[derive(Default)]
pub(crate) struct SharedPins {
    blobs: OnceLock<Arc<dyn PinBlobs>>,
    /// Pin names this process stored or found in the blob store.
    published: Mutex<HashSet<String>>,
    /// (plugin, approval digest, catalog) last followed here without being
    /// listed (its files here differ, no pin to take), so an
    /// unchanged approval is not digested again at every epoch.
    followed: Mutex<HashMap<String, String>>,
    /// A round of [`Runtime::share_packages`] is under way.
    pub(crate) sharing_packages: std::sync::atomic::AtomicBool,
    /// When to follow the approvals again although the epoch did not move:
    /// a pin could not be taken yet (its node had not finished sharing it).
    /// (when, the pause that led to it: doubled at each miss, 1 s to 60 s).
    retry_at: Mutex<Option<(std::time::Instant, std::time::Duration)>>,
}

impl SharedPins {
    pub(crate) fn blobs(&self) -> Option<&Arc<dyn PinBlobs>> {
        self.blobs.get()
    }

    /// Whether a pin that could not be taken is due to be tried again.
    pub(crate) fn retry_due(&self) -> bool {
        self.retry_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|(at, _)| std::time::Instant::now() >= at)
    }

    /// Whether this process stored or found blob `name`.
    pub(crate) fn was_published(&self, name: &str) -> bool {
        self.published().contains(name)
    }

    /// Notes that blob `name` is in the blob store.
    pub(crate) fn mark_published(&self, name: String) {
        self.published().insert(name);
    }

    /// `true` once the node gave a blob store.
    pub(crate) fn enabled(&self) -> bool {
        self.blobs.get().is_some()
    }

    fn published(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the pin of `plugin` approved at `dir_digest` in the blob
    /// store (once per process); failures are logged (the next start of
    /// the plugin tries again).
    pub(crate) async fn publish(&self, pins: &Pins, plugin: &str, dir_digest: &str) {
        let Some(blobs) = self.blobs() else { return };
        let name = Pins::blob_name(dir_digest);
        if self.published().contains(&name) {
            return;
        }
        let (p, id, d) = (pins.clone(), plugin.to_owned(), dir_digest.to_owned());
        let archive = tokio::task::spawn_blocking(move || p.archive(&id, &d)).await;
        let result = match archive {
            Ok(Ok(tar)) => blobs.put(&name, tar).await,
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(()) => {
                self.published().insert(name);
            }
            Err(e) => {
                tracing::warn!(plugin, error = %e, "could not share the approval's pin with the cluster; other nodes cannot start it until this node starts it again")
            }
        }
    }

    /// The pin of `plugin` approved at `dir_digest`, taken from the blob
    /// store and verified; the error names what is missing or wrong.
    pub(crate) async fn fetch(
        &self,
        pins: &Pins,
        plugin: &str,
        dir_digest: &str,
    ) -> Result<PathBuf, PinError> {
        let fetched = |reason: String| PinError::Fetched {
            plugin: plugin.to_owned(),
            reason,
        };
        let Some(blobs) = self.blobs() else {
            return Err(fetched("this node has no cluster blob store".into()));
        };
        let name = Pins::blob_name(dir_digest);
        let tar = blobs
            .get(&name, max_archive_bytes())
            .await
            .map_err(fetched)?
            .ok_or_else(|| {
                fetched(format!(
                    "no node has shared pin {name} (approved on a node without --nats, or its upload failed)"
                ))
            })?;
        let (p, id, d) = (pins.clone(), plugin.to_owned(), dir_digest.to_owned());
        let path = tokio::task::spawn_blocking(move || p.adopt(&id, &d, &tar))
            .await
            .map_err(|e| fetched(e.to_string()))??;
        self.published().insert(name);
        tracing::info!(plugin, pin = %path.display(), "took the approval's pin from the cluster, verified by its digest");
        Ok(path)
    }
}

impl Runtime {
    /// Shares approval pins with the other nodes through `blobs` (see the
    /// module). Set once, by the node, before serving; the pins of the
    /// plugins approved here are published in the background.
    pub fn share_pins(&self, blobs: Arc<dyn PinBlobs>) {
        if self.inner.shared_pins.blobs.set(blobs).is_err() {
            return;
        }
        self.share_packages();
        let rt = self.clone();
        tokio::spawn(async move {
            let Ok(approvals) = rt.inner.state.approvals().await else {
                return;
            };
            for a in approvals {
                if let Ok(sup) = rt.supervised(&a.plugin_id)
                    && sup.spec().pin_dir
                    && let Some(pin) = rt.inner.pins.current(&a.plugin_id)
                    && let Some(name) = pin.file_name().and_then(|n| n.to_str())
                {
                    let digest = format!("{}{name}", plugd_store::digest::DIGEST_PREFIX);
                    rt.inner
                        .shared_pins
                        .publish(&rt.inner.pins, &a.plugin_id, &digest)
                        .await;
                }
            }
        });
    }

    /// Lists here the tools of plugins approved through another process or
    /// node since the last epoch, taking their pins from the cluster when
    /// this node has no copy of them (see the module).
    pub(crate) async fn follow_approvals(&self) -> Result<(), RuntimeError> {
        // An install moved the epoch too: share what this node has.
        self.share_packages();
        let approvals = self.inner.state.approvals().await?;
        let holding: BTreeSet<String> = read(&self.inner.registry)
            .list()
            .into_iter()
            .map(|t| t.plugin.clone())
            .collect();
        let state_dir = self.inner.dir.join(".plugd");
        let mut adopted_any = false;
        let mut not_taken = false;
        for approval in approvals {
            let id = approval.plugin_id.clone();
            let key = format!("{}\0{}", approval.digest, approval.catalog);
            if holding.contains(&id)
                || self
                    .inner
                    .shared_pins
                    .followed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&id)
                    == Some(&key)
            {
                continue;
            }
            let lock = self.approval_lock(&id);
            let _serial = lock.lock().await;
            let Some(approval) = self.inner.state.approval(&id).await? else {
                continue;
            };
            // Only what could not be listed is remembered: a plugin listed
            // here and withdrawn later is listed again when re-approved
            // with the same content.
            let mut listed = false;
            let mut failed = false;
            match self.supervised(&id) {
                Ok(sup) => {
                    let spec = sup.spec().clone();
                    let digest = {
                        let (spec, a, dir) = (spec.clone(), approval.clone(), state_dir.clone());
                        tokio::task::spawn_blocking(move || {
                            changes::display_digest(&spec, Some(&a), &dir)
                        })
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()))
                    };
                    if digest.as_ref() == Ok(&approval.digest) {
                        listed = true;
                        let tools: Vec<ToolDef> =
                            serde_json::from_value(approval.catalog.clone()).unwrap_or_default();
                        write(&self.inner.registry).set_plugin_tools(&id, &tools);
                        self.inner.withheld.remove(&id);
                        self.inner
                            .digests
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id.clone(), digest);
                        tracing::info!(plugin = %id, tools = tools.len(), "approved through another node: its tools are listed here");
                        self.plugin_changed(&id);
                    } else if self.is_adopted(&spec.dir) && self.inner.shared_pins.blobs().is_some()
                    {
                        // Re-approved elsewhere at new content: drop the
                        // old pin's plugin and take the new one.
                        self.forget_adopted(&id).await;
                        let took = self.adopt(&id, &approval.digest).await;
                        adopted_any |= took;
                        failed = !took;
                    }
                }
                Err(RuntimeError::UnknownPlugin(_)) if self.inner.shared_pins.blobs().is_some() => {
                    let took = self.adopt(&id, &approval.digest).await;
                    adopted_any |= took;
                    failed = !took;
                }
                Err(_) => {}
            }
            let mut followed = self
                .inner
                .shared_pins
                .followed
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // A pin not taken (not shared yet, NATS away) is tried again.
            if listed || failed {
                followed.remove(&id);
            } else {
                followed.insert(id, key);
            }
            not_taken |= failed;
        }
        {
            let mut retry = self
                .inner
                .shared_pins
                .retry_at
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            *retry = not_taken.then(|| {
                let pause = retry.map_or(std::time::Duration::from_secs(1), |(_, p)| {
                    (p * 2).min(std::time::Duration::from_secs(60))
                });
                (std::time::Instant::now() + pause, pause)
            });
        }
        if adopted_any {
            self.rescan().await;
        }
        Ok(())
    }

    /// Takes the pin of `id` approved at `digest` from the cluster and
    /// marks it for discovery; `false` (logged) when it cannot.
    async fn adopt(&self, id: &str, digest: &str) -> bool {
        let pins = &self.inner.pins;
        match self.inner.shared_pins.fetch(pins, id, digest).await {
            Ok(_) => match pins.mark_adopted(id, digest) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(plugin = %id, error = %e, "cannot record the pin taken from the cluster");
                    false
                }
            },
            Err(e) => {
                tracing::debug!(plugin = %id, error = %e, "approved elsewhere; not listed here");
                false
            }
        }
    }

    fn is_adopted(&self, dir: &std::path::Path) -> bool {
        dir.starts_with(self.inner.pins.root())
    }

    /// Removes plugin `id`, loaded from a pin taken from the cluster, from
    /// this node (its approval was withdrawn or replaced): stopped, its
    /// tools and pin gone. Caller holds its approval lock.
    pub(crate) async fn forget_adopted(&self, id: &str) {
        let Ok(sup) = self.supervised(id) else { return };
        if !self.is_adopted(&sup.spec().dir) {
            return;
        }
        write(&self.inner.registry).remove_plugin(id);
        self.inner.withheld.remove(id);
        sup.stop().await;
        self.inner.pins.unmark_adopted(id);
        self.release_pin(id);
        self.inner.plugins.update(|current| {
            let mut map = current.map.clone();
            map.remove(id);
            let broken = current.broken.clone();
            (crate::plugin_set::PluginSet { map, broken }, ())
        });
        self.inner
            .shared_pins
            .followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        self.plugin_changed(id);
    }
}
