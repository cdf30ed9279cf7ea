//! A live connection to one run of a plugin ([`Conn`]): what the supervisor
//! hands out to callers and what every [`Dialect`](super::Dialect) method
//! works on (the peer, the process, the handshake, the launch, the
//! dialect's own state). It lives beside the trait so that the supervisor
//! uses the dialect interface and the interface never reaches back into the
//! supervisor.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugd_manifest::PluginSpec;

use super::{DialectState, HostServices};
use crate::launch::Launch;
use crate::model::Handshake;
use crate::peer::{Closed, Peer};
use crate::spawn::ProcessHandle;
use crate::stderr::StderrTail;

/// A live connection to one run of a plugin.
#[derive(Debug)]
pub struct Conn {
    /// The JSON-RPC peer.
    pub peer: Peer,
    /// Signals the process group.
    pub process: ProcessHandle,
    /// What the handshake established.
    pub handshake: Handshake,
    /// The stderr tail.
    pub stderr: StderrTail,
    /// The plugin's spec (its dialect decides the shutdown).
    pub spec: Arc<PluginSpec>,
    /// What the host offers this plugin (workspace, state directories).
    pub services: HostServices,
    /// The dialect's per-connection state, from [`super::Setup::state`].
    pub state: Option<DialectState>,
    /// What the host decided for this start (configuration, containment).
    pub launch: Arc<Launch>,
    pub(crate) started: Instant,
    /// Set when the host killed this run for working on past a cancel (a
    /// deliberate stop, not a crash).
    pub(crate) runaway: Arc<std::sync::atomic::AtomicBool>,
    /// The tool calls this run timed out on (and so cancelled): host
    /// request id → tool, the newest [`MAX_CANCELLED_CALLS`], so the calls a
    /// runaway kill fails can be told which call ignored its cancel.
    pub(crate) cancelled_calls: Mutex<std::collections::VecDeque<(i64, String)>>,
}

/// Most cancelled tool calls a [`Conn`] remembers by tool name.
pub const MAX_CANCELLED_CALLS: usize = 64;

impl Conn {
    /// How long this run has been up.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether the host killed this run because it kept working on a
    /// cancelled call.
    pub fn killed_as_runaway(&self) -> bool {
        self.runaway.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Remembers that the call with host request id `id`, of `tool`, was
    /// given up on (and so cancelled).
    pub(crate) fn note_cancelled(&self, id: i64, tool: &str) {
        let mut calls = self
            .cancelled_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if calls.len() >= MAX_CANCELLED_CALLS {
            calls.pop_front();
        }
        calls.push_back((id, tool.to_owned()));
    }

    /// Which call ignored its cancel, for the calls a runaway kill failed:
    /// `call N of tool "T"`, or `request N` when it was not a tool call.
    pub(crate) fn runaway_culprit(&self) -> String {
        let Some(id) = self.peer.runaway_request() else {
            return "a cancelled request".into();
        };
        let calls = self
            .cancelled_calls
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match calls.iter().find(|(i, _)| *i == id) {
            Some((_, tool)) => format!("call {id} of tool {tool:?}"),
            None => format!("request {id}"),
        }
    }

    /// Graceful stop: `shutdown`, wait for the reply, `grace` for the exit,
    /// then SIGKILL to the process group. Resolves once the process is reaped.
    pub async fn shutdown(&self, reply_timeout: Duration, grace: Duration) -> Arc<Closed> {
        if self.peer.closed_reason().is_none() {
            self.services
                .dialects
                .of(self.spec.dialect)
                .shutdown(self, reply_timeout)
                .await;
            if tokio::time::timeout(grace, self.peer.wait_closed())
                .await
                .is_err()
            {
                tracing::warn!(plugin = %self.peer.plugin(), "plugin did not exit after shutdown; killing its process group");
                self.process.kill_group();
            }
        }
        self.peer.wait_closed().await
    }
}
