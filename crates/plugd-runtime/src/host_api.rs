//! The runtime's side of the services native plugins call (nexo contract
//! §5.1-§5.4): the bus and its counters, the host-service deny list and
//! broker grants, microapp administration and channel dispatch. Long-term
//! memory (`memory.recall`) and `llm.complete` are answered by the agent
//! side, through [`crate::agent_seam::AgentParts`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use plugd_host::bus::Bus;
use plugd_host::extensions::{ChannelError, OutboundMessage};
use plugd_host::native_host::{
    AdminFuture, ApiFuture, BrokerCounters, CompleteRequest, Completion, DispatchFuture, HostApi,
    ServiceError,
};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::config::PlugdConfig;
use crate::{RtInner, Runtime};

/// The services a [`Runtime`] offers its native plugins.
pub(crate) struct RuntimeApi {
    /// The bus [`Runtime::open_with`] was given (the in-process
    /// [`plugd_host::bus::LocalBus`] unless the node chose another backend).
    bus: Arc<dyn Bus>,
    counters: Mutex<HashMap<String, Arc<BrokerCounters>>>,
    runtime: OnceLock<Weak<RtInner>>,
    next_event: AtomicU64,
}

impl RuntimeApi {
    pub(crate) fn new(bus: Arc<dyn Bus>) -> RuntimeApi {
        RuntimeApi {
            bus,
            counters: Mutex::new(HashMap::new()),
            runtime: OnceLock::new(),
            next_event: AtomicU64::new(0),
        }
    }

    /// Binds the runtime (for plugin LLM providers and the workspace
    /// configuration); called once [`Runtime::open`] built it.
    pub(crate) fn bind(&self, runtime: &Runtime) {
        let _ = self.runtime.set(Arc::downgrade(&runtime.inner));
    }

    pub(crate) fn shared_bus(&self) -> &Arc<dyn Bus> {
        &self.bus
    }

    /// The broker counters of every plugin seen so far.
    pub(crate) fn counters_of(&self, plugin: &str) -> Option<Arc<BrokerCounters>> {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(plugin)
            .cloned()
    }

    /// The runtime these services belong to, unless it is shutting down.
    fn live(&self) -> Option<Runtime> {
        self.runtime
            .get()
            .and_then(Weak::upgrade)
            .map(|inner| Runtime { inner })
    }
}

impl HostApi for RuntimeApi {
    fn memory_recall(
        &self,
        plugin: &str,
        agent_id: String,
        query: String,
        limit: usize,
    ) -> ApiFuture<Vec<Value>> {
        // Keyword or semantic recall as plugd.yaml's `memory:` says, by the
        // agent side (crate::agent_seam).
        match self.live() {
            Some(rt) => rt
                .inner
                .agent
                .clone()
                .memory_recall(rt, plugin, agent_id, query, limit),
            None => Box::pin(async {
                Err(ServiceError::NotConfigured(
                    "memory not available: the runtime is shutting down".into(),
                ))
            }),
        }
    }

    fn llm_complete(
        &self,
        plugin: &str,
        request: CompleteRequest,
        deltas: Option<mpsc::UnboundedSender<String>>,
    ) -> ApiFuture<Completion> {
        // The provider is resolved by the agent side (crate::agent_seam).
        match self.live() {
            Some(rt) => rt
                .inner
                .agent
                .clone()
                .llm_complete(rt, plugin, request, deltas),
            None => Box::pin(async {
                Err(ServiceError::NotConfigured(
                    "llm not configured: the runtime is shutting down".into(),
                ))
            }),
        }
    }

    fn microapp_admin(&self, plugin: &str, method: &str, params: Value) -> AdminFuture {
        let runtime = self.live();
        let plugin = plugin.to_owned();
        let method = method.to_owned();
        Box::pin(async move {
            let Some(runtime) = runtime else {
                return Err(plugd_wire::ErrorObject::new(
                    plugd_wire::codes::INTERNAL_ERROR,
                    format!("{method}: the runtime is shutting down"),
                ));
            };
            let parts = runtime.agent_parts().clone();
            parts.microapp_admin(runtime, plugin, method, params).await
        })
    }

    fn dispatch(&self, plugin: &str, channel: &str, msg: OutboundMessage) -> DispatchFuture {
        let runtime = self.live();
        let plugin = plugin.to_owned();
        let channel = channel.to_owned();
        Box::pin(async move {
            let Some(runtime) = runtime else {
                return Err(ChannelError::Other {
                    kind: channel,
                    message: "the runtime is shutting down".into(),
                });
            };
            let sent = crate::channels::dispatch(&runtime, &channel, msg).await;
            if let Err(e) = &sent {
                tracing::warn!(%plugin, kind = %channel, "nexo/dispatch failed: {e}");
            }
            sent
        })
    }

    fn denied_services(&self, spec: &plugd_manifest::PluginSpec) -> Vec<String> {
        let Some(runtime) = self.runtime.get().and_then(Weak::upgrade) else {
            return Vec::new();
        };
        match PlugdConfig::load(&runtime.dir) {
            Ok(config) => config.host_services.denied(&spec.id),
            Err(e) => {
                // Fail closed: an operator who wrote a deny list meant it.
                tracing::warn!(plugin = %spec.id, "plugd.yaml unreadable, so every host service is denied until it is fixed: {e}");
                plugd_host::native_host::HOST_SERVICES
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect()
            }
        }
    }

    fn allowlist(&self, spec: &plugd_manifest::PluginSpec) -> plugd_host::bus::Allowlist {
        let base =
            plugd_host::bus::Allowlist::for_channels(&plugd_host::native_host::channel_kinds(spec));
        let Some(runtime) = self.runtime.get().and_then(Weak::upgrade) else {
            return base;
        };
        // Read at each start, so a changed grant applies on the next restart.
        match PlugdConfig::load(&runtime.dir) {
            Ok(config) => config.broker.extend(&spec.id, base),
            Err(e) => {
                tracing::warn!(plugin = %spec.id, "plugd.yaml unreadable, so no broker grants apply: {e}");
                base
            }
        }
    }

    fn bus(&self) -> Arc<dyn Bus> {
        self.bus.clone()
    }

    fn broker_counters(&self, plugin: &str) -> Arc<BrokerCounters> {
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(plugin.to_owned())
            .or_default()
            .clone()
    }

    fn event_id(&self) -> String {
        // A UUID v4, as nexo's `Event.id` (§5.1). Without randomness (never
        // expected) the counter and the clock still make it unique here.
        let mut b = [0u8; 16];
        if getrandom::fill(&mut b).is_err() {
            let n = self.next_event.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            b[..8].copy_from_slice(&n.to_be_bytes());
            b[8..].copy_from_slice(&(nanos as u64).to_be_bytes());
        }
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }

    fn now(&self) -> String {
        plugd_store::now_rfc3339()
    }
}
