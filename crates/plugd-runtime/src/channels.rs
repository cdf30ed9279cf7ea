//! Channel adapters (nexo §5.x): what the plugin core holds of channels.
//!
//! Every native plugin declaring `[plugin.extends].channels = [K, ...]` is the
//! adapter of kind `K`: [`Runtime::channel`] hands out a [`ChannelAdapter`]
//! that sends `channel.start`, `channel.stop` and `channel.send_outbound`
//! through the plugin's `Supervised` connection, looked up per call (a
//! restart is transparent), with the 30 s / 30 s / 60 s deadlines of
//! `plugd_host::extensions` (`NEXO_PLUGIN_CHANNEL_TIMEOUT_MS` overrides all
//! three). A built-in adapter would implement the same trait.
//!
//! The inbound path that makes them useful (the channel service `plugd
//! serve` runs: inbound events, `before_message`, an agent turn per session,
//! the reply out) is plugd-agent's (`plugd_agent::channels`); it reaches the
//! turn through [`ChannelTurn`]. What stays here is the adapters, the
//! per-kind counters ([`ChannelStats`]) and `dispatch`, the host side of a
//! microapp's `nexo/dispatch`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugd_host::extensions::{
    self, CHANNEL_CONTROL_TIMEOUT, CHANNEL_SEND_TIMEOUT, CHANNEL_TIMEOUT_ENV, ChannelError,
    OutboundMessage, SendReceipt,
};
use serde::Serialize;
use serde_json::Value;

use crate::hooks::{HookContext, HookPoint};
use crate::{Runtime, RuntimeError};

/// What an adapter returns.
pub type ChannelFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ChannelError>> + Send + 'a>>;

/// What [`ChannelTurn::turn_inbound`] returns: the turn's outcome, or why
/// it failed (for the log).
pub type TurnFuture<'a> = Pin<Box<dyn Future<Output = Result<InboundTurn, String>> + Send + 'a>>;

/// How the agent turn of an inbound message ended, as far as a channel
/// cares.
#[derive(Debug, Clone, PartialEq)]
pub enum InboundTurn {
    /// The model answered: the reply, if any, goes back to the sender.
    Completed {
        /// The reply.
        reply: Option<String>,
    },
    /// A hook blocked a step: the block message, if any, goes back.
    Blocked {
        /// The point that blocked.
        at: Option<HookPoint>,
        /// The block message.
        message: Option<String>,
    },
}

/// The agent turn as the channels reach it: the runtime defines it, the
/// agent (`plugd-agent`'s `Agent`) implements it, and whoever assembles the
/// node hands it to [`ChannelService::start`].
pub trait ChannelTurn: Send + Sync {
    /// The hook context every turn starts from (plugd.yaml `agent:`).
    fn defaults(&self) -> &HookContext;
    /// Runs one turn of `session_id` with `input`, a message that came in
    /// on a channel; `inbound` is the seed 001 inbound message reference
    /// that goes with every microapp `tools/call` of the turn.
    fn turn_inbound<'a>(
        &'a self,
        session_id: &'a str,
        input: &'a str,
        ctx: &'a HookContext,
        inbound: Value,
    ) -> TurnFuture<'a>;
}

/// A channel adapter of one kind.
pub trait ChannelAdapter: Send + Sync {
    /// Its kind (`webhook`, `slack`, ...).
    fn kind(&self) -> &str;
    /// Who serves it (a plugin id, or `builtin`), for logs.
    fn owner(&self) -> &str;
    /// `channel.start {kind, instance}`.
    fn start<'a>(&'a self, instance: Option<&'a str>) -> ChannelFuture<'a, ()>;
    /// `channel.stop {kind}`.
    fn stop(&self) -> ChannelFuture<'_, ()>;
    /// `channel.send_outbound {kind, msg}`.
    fn send_outbound(&self, msg: OutboundMessage) -> ChannelFuture<'_, SendReceipt>;
}

/// An adapter served by a native plugin.
#[derive(Debug, Clone)]
pub struct PluginChannel {
    runtime: Runtime,
    plugin: String,
    kind: String,
    control_timeout: Duration,
    send_timeout: Duration,
}

impl PluginChannel {
    async fn conn(&self, timeout: Duration) -> Result<Arc<plugd_host::Conn>, ChannelError> {
        let other = |message: String| ChannelError::Other {
            kind: self.kind.clone(),
            message,
        };
        let sup = self
            .runtime
            .supervised(&self.plugin)
            .map_err(|e| other(e.to_string()))?;
        sup.connection(Instant::now() + timeout)
            .await
            .map_err(|e| other(format!("plugin {:?}: {e}", self.plugin)))
    }
}

impl ChannelAdapter for PluginChannel {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn owner(&self) -> &str {
        &self.plugin
    }

    fn start<'a>(&'a self, instance: Option<&'a str>) -> ChannelFuture<'a, ()> {
        Box::pin(async move {
            let conn = self.conn(self.control_timeout).await?;
            extensions::channel_start(&conn.peer, &self.kind, instance, self.control_timeout).await
        })
    }

    fn stop(&self) -> ChannelFuture<'_, ()> {
        Box::pin(async move {
            let conn = self.conn(self.control_timeout).await?;
            extensions::channel_stop(&conn.peer, &self.kind, self.control_timeout).await
        })
    }

    fn send_outbound(&self, msg: OutboundMessage) -> ChannelFuture<'_, SendReceipt> {
        Box::pin(async move {
            let conn = self.conn(self.send_timeout).await?;
            extensions::channel_send(&conn.peer, &self.kind, &msg, self.send_timeout).await
        })
    }
}

impl Runtime {
    /// Every channel kind and the plugin that serves it, sorted by kind (the
    /// first plugin, by id, wins a kind two plugins declare).
    pub fn channel_kinds(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for (id, sup) in self.inner.plugins.iter() {
            let Some(extends) = sup.spec().native_extends() else {
                continue;
            };
            for kind in &extends.channels {
                if !out.iter().any(|(k, _)| k == kind) {
                    out.push((kind.clone(), id.clone()));
                }
            }
        }
        out.sort();
        out
    }

    /// The adapter of channel `kind`: the native plugin that declares it in
    /// `[plugin.extends].channels` (it starts on first use; it must be
    /// approved).
    pub fn channel(&self, kind: &str) -> Result<Arc<dyn ChannelAdapter>, RuntimeError> {
        let kinds = self.channel_kinds();
        let Some((_, plugin)) = kinds.iter().find(|(k, _)| k == kind) else {
            let known: Vec<&str> = kinds.iter().map(|(k, _)| k.as_str()).collect();
            return Err(RuntimeError::UnknownChannel {
                kind: kind.to_owned(),
                known: if known.is_empty() {
                    "none (no plugin declares [plugin.extends].channels)".to_owned()
                } else {
                    known.join(", ")
                },
            });
        };
        let control_timeout = extensions::deadline(CHANNEL_TIMEOUT_ENV, CHANNEL_CONTROL_TIMEOUT)
            .map_err(RuntimeError::Workspace)?;
        let send_timeout = extensions::deadline(CHANNEL_TIMEOUT_ENV, CHANNEL_SEND_TIMEOUT)
            .map_err(RuntimeError::Workspace)?;
        Ok(Arc::new(PluginChannel {
            runtime: self.clone(),
            plugin: plugin.clone(),
            kind: kind.to_owned(),
            control_timeout,
            send_timeout,
        }))
    }
}

/// Counters of one channel kind's inbound path (logged at shutdown, exported
/// by `GET /metrics`).
#[derive(Debug, Default)]
pub struct ChannelCounters {
    /// Inbound events received.
    pub received: AtomicU64,
    /// Replies sent.
    pub replied: AtomicU64,
    /// Messages blocked by a hook.
    pub blocked: AtomicU64,
    /// Events not handled: no `llm:` section.
    pub unhandled: AtomicU64,
    /// Malformed events, failed turns, failed sends.
    pub failed: AtomicU64,
    /// Events shed because the inbound queue (or a session's) was full.
    pub shed: AtomicU64,
}

/// A snapshot of [`ChannelCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ChannelStats {
    /// Inbound events received.
    pub received: u64,
    /// Replies sent.
    pub replied: u64,
    /// Messages blocked by a hook.
    pub blocked: u64,
    /// Events not handled (no `llm:` section).
    pub unhandled: u64,
    /// Malformed events, failed turns, failed sends.
    pub failed: u64,
    /// Events shed (inbound queue full).
    pub shed: u64,
}

impl ChannelCounters {
    /// The values now.
    pub fn snapshot(&self) -> ChannelStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ChannelStats {
            received: g(&self.received),
            replied: g(&self.replied),
            blocked: g(&self.blocked),
            unhandled: g(&self.unhandled),
            failed: g(&self.failed),
            shed: g(&self.shed),
        }
    }
}

/// The inbound counters of every channel kind, kept on the [`Runtime`] (so
/// `GET /metrics` reads them).
pub(crate) type CounterMap = Mutex<BTreeMap<String, Arc<ChannelCounters>>>;

impl Runtime {
    /// The inbound counters of channel `kind` (created on first use).
    pub fn channel_counters(&self, kind: &str) -> Arc<ChannelCounters> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind.to_owned())
            .or_default()
            .clone()
    }

    /// The inbound counters of every channel kind seen, by kind.
    pub fn channel_stats(&self) -> BTreeMap<String, ChannelStats> {
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, c)| (k.clone(), c.snapshot()))
            .collect()
    }
}

/// The host side of microapp `nexo/dispatch {to, channel, body}`: a text
/// message out through `channel`'s adapter.
pub(crate) async fn dispatch(
    runtime: &Runtime,
    channel: &str,
    msg: OutboundMessage,
) -> Result<SendReceipt, ChannelError> {
    let adapter = runtime.channel(channel).map_err(|e| ChannelError::Other {
        kind: channel.to_owned(),
        message: match e {
            RuntimeError::UnknownChannel { kind, known } => {
                format!("no channel {kind:?} is available in this plugd (channels here: {known})")
            }
            other => other.to_string(),
        },
    })?;
    adapter.send_outbound(msg).await
}
