//! plugd's host layer: starting plugin processes, talking to them, keeping them alive.
//!
//! * [`spawn`]: the one audited way to start a child (process group, cleared
//!   environment, pidfd exit watch, kill-and-reap on drop).
//! * [`peer`]: a multiplexed bidirectional JSON-RPC connection over any byte
//!   transport (reader task + writer task, deadlines, bounded queue).
//! * [`stderr`]: a plugin's stderr into `tracing` (rate limited per plugin), with a tail for crash reports.
//! * [`throttle`]: repeated warnings as one line per interval with a count.
//! * [`dialect`]: the [`dialect::Dialect`] trait every contract implements (the
//!   contracts themselves are in `plugd-dialects`), and what the host hands them.
//! * [`model`]: what every dialect shares (tool definitions, handshakes, typed tool errors).
//! * [`native_llm`]: nexo `llm.chat` for plugin LLM providers (sync and streaming).
//! * [`sandbox`]: containment of a start (bubblewrap, the Landlock + seccomp
//!   fallback, resource limits) and exits explained by the limit hit.
//! * [`supervisor`]: lazy/eager start, crash detection, restart with backoff,
//!   graceful shutdown, handles that survive restarts.

pub mod bus;
pub mod cgroup;
pub mod dialect;
pub mod extensions;
pub mod groups;
pub mod launch;
pub mod log_ring;
pub mod log_stats;
pub mod model;
pub mod native_host;
pub mod native_llm;
pub mod peer;
mod peer_out;
pub mod procs;
pub mod protocol;
mod remote;
pub mod sandbox;
pub mod spawn;
pub mod stderr;
pub mod supervisor;
#[cfg(test)]
use plugd_wire::test_json;
pub mod throttle;
pub mod user_sessions;

pub use dialect::{Dialect, Dialects};
pub use launch::Launch;
pub use model::{Handshake, HandshakeError, ToolDef, ToolError};
pub use peer::{CallError, Closed, Handler, Peer, PeerConfig, PeerStats};
pub use supervisor::{
    CallToolError, Conn, ExportConn, HostConfig, NoObserver, Observer, PluginError, StartGate,
    Status, Supervised,
};
