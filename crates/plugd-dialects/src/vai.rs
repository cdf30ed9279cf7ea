//! The VAI dialect: VAI gateway packages speaking `vai.rpc.v1` (seed 003).
//!
//! * Envelope: [`codec::VaiRpc`], Content-Length frames with `protocol` and
//!   `type`; host ids travel as `req_<n>`.
//! * Handshake: `hello` both ways. The host sends its `hello`; the plugin's
//!   `hello` (before or after the host's) reaches [`VaiHandler`], and the
//!   handshake checks its `package_id` and `version` against the installed
//!   manifest ([`HandshakeError::IdentityMismatch`] otherwise: the plugin is
//!   killed and refused). The tool catalog comes from the manifest's tool
//!   exports, named `<package_id>/<export_id>` (wire name: the export id).
//! * Invocations: `tool.invoke`, `hook.handle`, `compactor.compact`,
//!   `harness.run` requests whose body carries the export id and the
//!   invocation `context` (ids, scope, `deadline_at`, a fresh `scratch_dir`
//!   removed afterwards; plugd adds `secrets`, the bound secret slots the
//!   export declares, and `config`, the export's settings). `ok=false` responses are protocol failures; business
//!   outcomes are `ok=true` with a terminal `status`. `event` frames reach the
//!   caller's progress sink. A caller that gives up (or hits its deadline)
//!   sends `cancel`; the plugin must answer the cancelled request within
//!   [`CANCEL_GRACE`] or it is killed.
//! * `max_concurrency` is enforced per export with a semaphore in the
//!   connection state ([`VaiState`]); excess calls wait in a bounded queue.
//! * Shutdown: a `shutdown` frame; the supervisor kills after its grace.
//! * The plugin's `hello` lands in a slot of the connection state, shared by
//!   the handler and [`handshake`].
//!
//! **Why one file** (~960 product lines): one contract's dialect. Its
//! envelope is already apart (`vai/codec.rs`); what is left (the `hello`
//! handshake, the invocation context with its scratch directory, terminal
//! statuses, per-export concurrency, and the hook, compactor and harness
//! calls) shares `invoke` and the connection's `VaiState`.

pub mod codec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plugd_manifest::PluginSpec;
use plugd_manifest::vai::{ExportKind, ProcessRole, VaiExport, WORKER_GROUP};
use plugd_wire::ErrorObject;
use serde_json::{Map, Value, json};
use tokio::sync::{Semaphore, watch};

use plugd_host::dialect::{
    CallContext, CallFuture, Capabilities, Dialect, DialectFuture, DialectState, HandshakeArgs,
    HandshakeFuture, HostServices, Setup, SetupArgs, ToolCall,
};
use plugd_host::model::{Handshake, HandshakeError, ToolDef, ToolError, fresh_id, map_tool_error};
use plugd_host::peer::{CallError, CancelPolicy, Handler, Peer};
use plugd_host::supervisor::Conn;

pub use codec::VaiRpc;

/// How long a plugin has to answer a cancelled request (with any terminal
/// response, e.g. status `cancelled`) before it is killed.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Calls that may wait for a free slot of an export, per unit of its
/// `max_concurrency`; one more is refused at once.
pub const QUEUE_PER_SLOT: usize = 8;

/// The name the host gives in its `hello`.
pub const HOST_NAME: &str = "plugd";

/// Why a VAI invocation did not produce a result.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum InvokeError {
    /// The package has no export with that id.
    #[error("package {plugin:?} has no export {export:?}; `plugd plugin show {plugin}` lists them")]
    UnknownExport {
        /// Plugin (package) id.
        plugin: String,
        /// The export id asked for.
        export: String,
    },
    /// The export is of another kind than the operation needs.
    #[error("export {export:?} of package {plugin:?} is a {kind}, not a {expected}")]
    WrongKind {
        /// Plugin id.
        plugin: String,
        /// Export id.
        export: String,
        /// Its kind.
        kind: &'static str,
        /// The kind the operation needs.
        expected: &'static str,
    },
    /// The export's concurrency limit is reached and its queue is full.
    #[error(
        "export {export:?} of package {plugin:?} is busy: {max_concurrency} invocation(s) running (its max_concurrency) and {queued} queued; try again later"
    )]
    Busy {
        /// Plugin id.
        plugin: String,
        /// Export id.
        export: String,
        /// The limit.
        max_concurrency: u32,
        /// Calls already waiting.
        queued: usize,
    },
    /// The call waited for a free slot until its deadline.
    #[error(
        "export {export:?} of package {plugin:?} stayed at its max_concurrency ({max_concurrency}) for {waited:?}, the whole deadline of the call; it was not sent"
    )]
    QueueTimeout {
        /// Plugin id.
        plugin: String,
        /// Export id.
        export: String,
        /// The limit.
        max_concurrency: u32,
        /// How long it waited.
        waited: Duration,
    },
    /// The per-invocation scratch directory could not be created.
    #[error("package {plugin:?}: cannot create the scratch directory {path:?}: {error}")]
    Scratch {
        /// Plugin id.
        plugin: String,
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        error: String,
    },
    /// The request failed: timeout, crash, or an `ok=false` protocol failure
    /// (its string code and message are in the error's message).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The response body does not have the contract's shape.
    #[error("package {plugin:?} answered {op} with a malformed body: {reason}")]
    Malformed {
        /// Plugin id.
        plugin: String,
        /// The operation.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// The invocation ran and ended with a non-success terminal status.
    #[error(
        "export {export:?} of package {plugin:?} ended with status {status:?} (retryable: {retryable}): {message}"
    )]
    Failed {
        /// Plugin id.
        plugin: String,
        /// Export id.
        export: String,
        /// `failed`, `cancelled` or `retryable_failure`.
        status: String,
        /// Whether a retry may succeed.
        retryable: bool,
        /// The plugin's explanation.
        message: String,
    },
}

// --- connection state -------------------------------------------------------

/// The concurrency limit of one export.
#[derive(Debug)]
struct Limit {
    sem: Arc<Semaphore>,
    max: u32,
    queued: AtomicUsize,
}

/// Per-connection state of a VAI plugin: one semaphore per export that
/// declares `max_concurrency`, and the slot the plugin's `hello` lands in.
#[derive(Debug)]
pub struct VaiState {
    limits: HashMap<String, Limit>,
    hello: Arc<HelloSlot>,
}

/// Where the plugin's `hello` lands until the handshake picks it up.
#[derive(Debug)]
struct HelloSlot {
    plugin: String,
    tx: watch::Sender<Option<Value>>,
}

/// Serves what a VAI plugin sends on its own: its `hello`. Plugin requests
/// are answered `ok=false` with `protocol.unsupported_op`.
#[derive(Debug)]
pub struct VaiHandler {
    hello: Arc<HelloSlot>,
}

impl Handler for VaiHandler {
    fn notification(&self, method: String, params: Option<Value>) {
        match method.as_str() {
            "hello" => {
                let first = self.hello.tx.send_if_modified(|slot| {
                    if slot.is_none() {
                        *slot = Some(params.unwrap_or(Value::Null));
                        true
                    } else {
                        false
                    }
                });
                if !first {
                    tracing::warn!(plugin = %self.hello.plugin, "plugin sent hello again; ignored");
                }
            }
            other => {
                tracing::debug!(plugin = %self.hello.plugin, frame = other, "unexpected frame from plugin; ignored");
            }
        }
    }
}

/// Envelope, handler, cancel policy and per-export semaphores.
fn setup(a: SetupArgs<'_>) -> Setup {
    let SetupArgs { spec, .. } = a;
    let slot = Arc::new(HelloSlot {
        plugin: spec.id.clone(),
        tx: watch::channel(None).0,
    });
    let limits = spec
        .vai
        .iter()
        .flat_map(|v| &v.exports)
        .filter_map(|e| {
            let max = e.max_concurrency?;
            Some((
                e.id.clone(),
                Limit {
                    sem: Arc::new(Semaphore::new(max as usize)),
                    max,
                    queued: AtomicUsize::new(0),
                },
            ))
        })
        .collect();
    Setup {
        protocol: Arc::new(VaiRpc),
        handler: Arc::new(VaiHandler {
            hello: slot.clone(),
        }),
        cancel: Some(CancelPolicy {
            grace: CANCEL_GRACE,
            expects_ack: true,
        }),
        state: Some(Arc::new(VaiState {
            limits,
            hello: slot,
        })),
    }
}

// --- handshake --------------------------------------------------------------

/// Sends the host `hello`, waits for the plugin's and checks its identity.
pub async fn handshake(
    peer: &Peer,
    spec: &PluginSpec,
    _services: &HostServices,
    state: Option<&DialectState>,
    timeout: Duration,
) -> Result<Handshake, HandshakeError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    let slot = state
        .and_then(|s| s.downcast_ref::<VaiState>())
        .map(|s| s.hello.clone());
    let Some(slot) = slot else {
        return Err(malformed(
            "internal: no hello slot for this connection (setup was not called)".into(),
        ));
    };
    let hello = codec::encode_frame(
        "hello",
        Some(json!({
            "role": "host",
            "host": {"name": HOST_NAME, "version": env!("CARGO_PKG_VERSION")},
        })),
    );
    let timed_out = || {
        HandshakeError::Call(CallError::Timeout {
            plugin: peer.plugin().clone(),
            method: "hello".into(),
            after: timeout,
            id: 0,
        })
    };
    match tokio::time::timeout_at(deadline, peer.send_payload(hello)).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(closed)) => return Err(HandshakeError::Call(CallError::Closed(closed))),
        Ok(Ok(())) => {}
    }
    let mut rx = slot.tx.subscribe();
    let got = async {
        loop {
            if let Some(v) = rx.borrow_and_update().clone() {
                return v;
            }
            if rx.changed().await.is_err() {
                // The slot outlives this wait (we hold it), so this cannot end.
                std::future::pending::<()>().await;
            }
        }
    };
    let reply = tokio::select! {
        v = tokio::time::timeout_at(deadline, got) => v.map_err(|_| timed_out())?,
        closed = peer.wait_closed() => return Err(HandshakeError::Call(CallError::Closed(closed))),
    };
    check_hello(spec, &reply)
}

/// Validates a plugin `hello` frame against the installed manifest.
pub fn check_hello(spec: &PluginSpec, frame: &Value) -> Result<Handshake, HandshakeError> {
    let malformed = |reason: String| HandshakeError::Malformed {
        plugin: spec.id.clone(),
        reason,
    };
    match frame.get("role") {
        None => {}
        Some(Value::String(r)) if r == "plugin" => {}
        Some(other) => {
            return Err(malformed(format!(
                "hello has role {}, expected \"plugin\"",
                short(other)
            )));
        }
    }
    let plugin = frame
        .get("plugin")
        .and_then(Value::as_object)
        .ok_or_else(|| malformed("hello has no \"plugin\" object".into()))?;
    let package_id = plugin
        .get("package_id")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("hello has no string plugin.package_id".into()))?;
    let version = plugin
        .get("version")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("hello has no string plugin.version".into()))?;
    if package_id != spec.id || version != spec.version {
        return Err(HandshakeError::IdentityMismatch {
            expected: format!("{}@{}", spec.id, spec.version),
            got: format!("{}@{}", clip(package_id), clip(version)),
        });
    }
    let tools = spec.tools.iter().map(|t| declared_tool(spec, t)).collect();
    Ok(Handshake {
        server_version: Some(version.to_owned()),
        tools,
        warnings: Vec::new(),
    })
}

/// A tool export as a catalog entry: its `display_name` as the title and
/// its output schema (what `structured_output` must match), when declared.
pub fn declared_tool(spec: &PluginSpec, t: &plugd_manifest::DeclaredTool) -> ToolDef {
    let mut def = ToolDef::declared(t);
    let export = spec
        .vai
        .as_ref()
        .and_then(|v| v.exports.iter().find(|e| e.id == t.wire_name));
    if let Some(export) = export {
        let meta = plugd_host::model::ToolMeta {
            title: export.display_name.clone(),
            output_schema: export
                .tool
                .as_ref()
                .and_then(|tool| tool.output_schema_json.clone()),
            ..Default::default()
        };
        if meta != plugd_host::model::ToolMeta::default() {
            def.meta = Some(Box::new(meta));
        }
    }
    def
}

fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

fn short(v: &Value) -> String {
    clip(&v.to_string())
}

// --- invocations ------------------------------------------------------------

/// `t` as RFC 3339 UTC with second precision (`2026-03-12T20:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Removes the scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove scratch directory");
        }
    }
}

/// The scratch directory of invocation `invocation_id` in a process of
/// `spec` whose state directory is `state_dir`: the one directory a
/// per-invocation process was started with; under `scratch/worker/` for the
/// package's worker process (its only writable root); under `scratch/`
/// for an isolated process.
pub fn scratch_dir(spec: &PluginSpec, state_dir: &Path, invocation_id: &str) -> PathBuf {
    let root = state_dir.join("scratch");
    match spec.process_role() {
        Some(ProcessRole {
            scratch: Some(dir), ..
        }) => dir,
        Some(r) if r.isolated_export().is_some() => root.join(invocation_id),
        _ => root.join(WORKER_GROUP).join(invocation_id),
    }
}

fn create_scratch(dir: PathBuf) -> std::io::Result<Scratch> {
    std::fs::create_dir_all(&dir)?;
    Ok(Scratch(dir))
}

fn vai_state(conn: &Conn) -> Option<Arc<VaiState>> {
    conn.state.clone()?.downcast::<VaiState>().ok()
}

fn find_export<'a>(
    spec: &'a PluginSpec,
    export_id: &str,
    expected: ExportKind,
) -> Result<&'a VaiExport, InvokeError> {
    let export = spec
        .vai
        .as_ref()
        .and_then(|v| v.export(export_id))
        .ok_or_else(|| InvokeError::UnknownExport {
            plugin: spec.id.clone(),
            export: export_id.to_owned(),
        })?;
    if export.kind != expected {
        return Err(InvokeError::WrongKind {
            plugin: spec.id.clone(),
            export: export_id.to_owned(),
            kind: export.kind.as_str(),
            expected: expected.as_str(),
        });
    }
    Ok(export)
}

/// Sends one invocation request `op` for `export_id` with `fields` plus the
/// export id and the invocation context; returns the `ok=true` body, which
/// is checked to carry a string `status`.
async fn invoke(
    conn: &Conn,
    export_id: &str,
    kind: ExportKind,
    op: &str,
    mut fields: Map<String, Value>,
    ctx: &CallContext,
    timeout: Duration,
) -> Result<Value, InvokeError> {
    let spec = &conn.spec;
    let export = find_export(spec, export_id, kind)?;
    let timeout = export.default_timeout.map_or(timeout, |d| d.min(timeout));
    let started = Instant::now();
    let deadline = started + timeout;

    // Concurrency: a bounded queue in front of the export's semaphore.
    let state = vai_state(conn);
    let limit = state.as_ref().and_then(|s| s.limits.get(export_id));
    let _permit = match limit {
        None => None,
        Some(limit) => {
            let permit = match limit.sem.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    let max_queued = QUEUE_PER_SLOT * limit.max as usize;
                    let queued = limit.queued.fetch_add(1, Ordering::SeqCst);
                    if queued >= max_queued {
                        limit.queued.fetch_sub(1, Ordering::SeqCst);
                        return Err(InvokeError::Busy {
                            plugin: spec.id.clone(),
                            export: export_id.to_owned(),
                            max_concurrency: limit.max,
                            queued,
                        });
                    }
                    let got =
                        tokio::time::timeout_at(deadline.into(), limit.sem.clone().acquire_owned())
                            .await;
                    limit.queued.fetch_sub(1, Ordering::SeqCst);
                    match got {
                        Ok(Ok(p)) => p,
                        _ => {
                            return Err(InvokeError::QueueTimeout {
                                plugin: spec.id.clone(),
                                export: export_id.to_owned(),
                                max_concurrency: limit.max,
                                waited: started.elapsed(),
                            });
                        }
                    }
                }
            };
            Some(permit)
        }
    };

    let invocation_id = ctx.invocation_id.clone().unwrap_or_else(|| fresh_id("inv"));
    let state_dir = conn.services.state_dir(&spec.id);
    let dir = scratch_dir(spec, &state_dir, &invocation_id);
    let scratch = create_scratch(dir.clone()).map_err(|e| InvokeError::Scratch {
        plugin: spec.id.clone(),
        path: dir,
        error: e.to_string(),
    })?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let deadline_at = SystemTime::now() + left;
    // A call through a binding carries the binding's config and secrets as
    // they are now; the secrets are scrubbed from the plugin's stderr from
    // this call on (it may print what it was given).
    let (secrets, config) = match &ctx.bound {
        Some(b) => {
            conn.stderr.redact_more(&b.secret_values());
            (Value::Object(b.secrets.clone()), b.config.clone())
        }
        None => (
            slot_secrets(spec, export_id, &conn.launch.config),
            conn.launch
                .config
                .get("exports")
                .and_then(|e| e.get(export_id))
                .cloned()
                .unwrap_or_else(|| json!({})),
        ),
    };
    let context = json!({
        "invocation_id": invocation_id,
        // The OpenTelemetry trace this call is part of, when traces are on
        // (32 hex digits, W3C), so the plugin's own telemetry joins it.
        "trace_id": plugd_telemetry::trace_id().or_else(|| ctx.trace_id.clone()).unwrap_or_else(|| fresh_id("tr")),
        "org_id": ctx.org_id,
        "project_id": ctx.project_id,
        "session_id": ctx.session_id,
        "chain_id": ctx.chain_id,
        "run_id": ctx.run_id,
        "deadline_at": rfc3339(deadline_at),
        "scratch_dir": scratch.0.display().to_string(),
        "gateway": match &ctx.gateway {
            Some(g) => json!({"base_url": g.base_url, "delegation_token": g.delegation_token, "scopes": g.scopes}),
            None => json!({"base_url": null, "delegation_token": null, "scopes": []}),
        },
        "secrets": secrets,
        "config": config,
    });
    fields.insert("export_id".into(), json!(export_id));
    fields.insert("context".into(), context);
    let result = conn
        .peer
        .call_with(op, Some(Value::Object(fields)), left, ctx.progress.clone())
        .await;
    if matches!(result, Err(CallError::Timeout { .. })) {
        // The plugin has the cancel grace to stop using the directory.
        tokio::spawn(async move {
            tokio::time::sleep(CANCEL_GRACE).await;
            drop(scratch);
        });
    } else {
        drop(scratch);
    }
    let body = result?;
    match body.get("status") {
        Some(Value::String(_)) => Ok(body),
        _ => Err(InvokeError::Malformed {
            plugin: spec.id.clone(),
            op: op.to_owned(),
            reason: format!("no string \"status\" in {}", clip(&body.to_string())),
        }),
    }
}

/// A non-success terminal status as [`InvokeError::Failed`].
fn failure(spec: &PluginSpec, export_id: &str, body: &Value) -> InvokeError {
    let status = body
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let result = body.get("result");
    let retryable = result
        .and_then(|r| r.get("retryable"))
        .and_then(Value::as_bool)
        .unwrap_or(status == "retryable_failure");
    let text: Vec<&str> = result
        .and_then(|r| r.get("content"))
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    let message = if !text.is_empty() {
        text.join(" ")
    } else if let Some(m) = body
        .get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
    {
        m.to_owned()
    } else {
        "no details given".to_owned()
    };
    InvokeError::Failed {
        plugin: spec.id.clone(),
        export: export_id.to_owned(),
        status,
        retryable,
        message: message.chars().take(1000).collect(),
    }
}

const FAILED_STATUSES: [&str; 3] = ["failed", "cancelled", "retryable_failure"];

/// Turns a body into its `result` for `succeeded`, an error for the other
/// terminal statuses, and a malformed error for anything else.
fn terminal(
    spec: &PluginSpec,
    export_id: &str,
    op: &str,
    body: Value,
    success: &[&str],
) -> Result<Value, InvokeError> {
    let status = body.get("status").and_then(Value::as_str).unwrap_or("");
    if success.contains(&status) {
        return Ok(body);
    }
    if FAILED_STATUSES.contains(&status) {
        return Err(failure(spec, export_id, &body));
    }
    Err(InvokeError::Malformed {
        plugin: spec.id.clone(),
        op: op.to_owned(),
        reason: format!(
            "unknown status {:?}; expected one of {:?}",
            clip(status),
            success
                .iter()
                .chain(FAILED_STATUSES.iter())
                .collect::<Vec<_>>()
        ),
    })
}

/// Calls a tool export with `tool.invoke`: `succeeded` → the `result` object
/// (`content`, `structured_output`, `is_error`, `retryable`); `failed`,
/// `cancelled`, `retryable_failure` → [`ToolError::ExecutionFailed`] naming
/// the status and whether it is retryable.
/// The `context.secrets` of one invocation of `export_id`: the bound secret
/// slots (`launch_config.secret_slots`, decrypted by the runtime) that this
/// export declares in `permissions.secret_slots`, by slot name. Slots of
/// other exports and unbound slots are left out.
pub fn slot_secrets(spec: &PluginSpec, export_id: &str, launch_config: &Value) -> Value {
    let declared = spec
        .vai
        .as_ref()
        .and_then(|v| v.exports.iter().find(|e| e.id == export_id))
        .map(|e| e.permissions.secret_slots.as_slice())
        .unwrap_or_default();
    let bound = launch_config.get("secret_slots").and_then(Value::as_object);
    let mut out = Map::new();
    if let Some(bound) = bound {
        for slot in declared {
            if let Some(v) = bound.get(slot) {
                out.insert(slot.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The VAI gateway package contract (`vai.rpc.v1`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Vai;

impl Dialect for Vai {
    fn name(&self) -> &'static str {
        "vai"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            catalog_in_manifest: true,
            sends_invocation_id: true,
            ..Capabilities::default()
        }
    }

    fn declared_tool(
        &self,
        spec: &PluginSpec,
        tool: &plugd_manifest::DeclaredTool,
    ) -> Option<ToolDef> {
        Some(declared_tool(spec, tool))
    }

    fn setup(&self, a: SetupArgs<'_>) -> Setup {
        setup(a)
    }

    fn handshake<'a>(&'a self, a: HandshakeArgs<'a>) -> HandshakeFuture<'a> {
        Box::pin(handshake(a.peer, a.spec, a.services, a.state, a.timeout))
    }

    fn call_tool<'a>(&'a self, call: ToolCall<'a>) -> CallFuture<'a> {
        let (conn, spec, tool, args, ctx, timeout) = call.into_parts();
        Box::pin(async move {
            let export_id = tool.wire();
            let mut fields = Map::new();
            fields.insert("tool_execution_id".into(), json!(fresh_id("toolx")));
            fields.insert("input".into(), args);
            let plugin: Arc<str> = spec.id.as_str().into();
            let outcome = async {
                let body = invoke(
                    conn,
                    export_id,
                    ExportKind::Tool,
                    "tool.invoke",
                    fields,
                    ctx,
                    timeout,
                )
                .await?;
                let mut body = terminal(spec, export_id, "tool.invoke", body, &["succeeded"])?;
                match body.get_mut("result").map(Value::take) {
                    Some(result @ Value::Object(_)) => Ok(result),
                    _ => Err(InvokeError::Malformed {
                        plugin: spec.id.clone(),
                        op: "tool.invoke".into(),
                        reason: "status \"succeeded\" without a \"result\" object".into(),
                    }),
                }
            }
            .await;
            outcome.map_err(|e| tool_error(&plugin, &tool.name, e))
        })
    }

    /// Sends the `shutdown` frame; the supervisor then waits its grace and kills.
    fn shutdown<'a>(&'a self, conn: &'a Conn, reply_timeout: Duration) -> DialectFuture<'a, ()> {
        Box::pin(async move {
            let frame = codec::encode_frame("shutdown", None);
            let _ = tokio::time::timeout(reply_timeout, conn.peer.send_payload(frame)).await;
        })
    }
}

fn tool_error(plugin: &Arc<str>, tool: &str, e: InvokeError) -> ToolError {
    let plugin = plugin.clone();
    let tool = tool.to_owned();
    match e {
        InvokeError::Call(e) => map_tool_error(&plugin, &tool, e),
        InvokeError::Failed {
            status,
            retryable,
            message,
            ..
        } => ToolError::ExecutionFailed {
            plugin,
            tool,
            message: format!("status {status:?} (retryable: {retryable}): {message}"),
        },
        e @ (InvokeError::Busy { .. }
        | InvokeError::QueueTimeout { .. }
        | InvokeError::Scratch { .. }) => ToolError::Unavailable {
            plugin,
            tool,
            message: e.to_string(),
            retry_after_ms: None,
        },
        e @ (InvokeError::UnknownExport { .. } | InvokeError::WrongKind { .. }) => {
            ToolError::NotFound {
                plugin,
                tool,
                message: e.to_string(),
            }
        }
        e @ InvokeError::Malformed { .. } => {
            let method = "tool.invoke".to_owned();
            ToolError::Call(CallError::Remote {
                plugin: plugin.clone(),
                method,
                error: Box::new(ErrorObject {
                    code: codec::PROTOCOL_FAILURE,
                    message: e.to_string(),
                    data: None,
                }),
            })
        }
    }
}

/// Delivers one semantic event to a hook export (`hook.handle`). Returns the
/// body (status `ack`); `failed`, `cancelled`, `retryable_failure` are
/// [`InvokeError::Failed`]. Deliveries are retried by `delivery_id`, with
/// `attempt` counting from 1.
pub async fn handle_hook(
    conn: &Conn,
    export_id: &str,
    delivery_id: &str,
    attempt: u32,
    event: Value,
    ctx: &CallContext,
    timeout: Duration,
) -> Result<Value, InvokeError> {
    let mut fields = Map::new();
    fields.insert("delivery_id".into(), json!(delivery_id));
    fields.insert("attempt".into(), json!(attempt));
    fields.insert("event".into(), event);
    let body = invoke(
        conn,
        export_id,
        ExportKind::Hook,
        "hook.handle",
        fields,
        ctx,
        timeout,
    )
    .await?;
    terminal(
        &conn.spec,
        export_id,
        "hook.handle",
        body,
        &["ack", "succeeded"],
    )
}

/// A `compactor.compact` request.
#[derive(Debug, Clone)]
pub struct CompactRequest {
    /// `compaction_id`.
    pub compaction_id: String,
    /// `source`: the chain and its projection.
    pub source: Value,
    /// `target`: token budget and model.
    pub target: Value,
    /// `policy`.
    pub policy: Value,
}

/// Runs a compactor export (`compactor.compact`); returns the `result`
/// (`seed_blocks`, `summary`, `diagnostics`) of a `succeeded` body.
pub async fn compact(
    conn: &Conn,
    export_id: &str,
    request: CompactRequest,
    ctx: &CallContext,
    timeout: Duration,
) -> Result<Value, InvokeError> {
    let mut fields = Map::new();
    fields.insert("compaction_id".into(), json!(request.compaction_id));
    fields.insert("source".into(), request.source);
    fields.insert("target".into(), request.target);
    fields.insert("policy".into(), request.policy);
    let op = "compactor.compact";
    let body = invoke(
        conn,
        export_id,
        ExportKind::Compactor,
        op,
        fields,
        ctx,
        timeout,
    )
    .await?;
    let mut body = terminal(&conn.spec, export_id, op, body, &["succeeded"])?;
    Ok(body
        .get_mut("result")
        .map(Value::take)
        .unwrap_or(Value::Null))
}

/// A `harness.run` request.
#[derive(Debug, Clone)]
pub struct HarnessRequest {
    /// `mode`, e.g. `start`.
    pub mode: String,
    /// `target`: session, chain, execution.
    pub target: Value,
    /// `trigger`: what started the run.
    pub trigger: Value,
    /// `policy`: depth and run budgets.
    pub policy: Value,
}

/// Runs a harness export (`harness.run`); returns the `result`
/// (`checkpoint`, `summary`, `artifacts`) of a `succeeded` body.
pub async fn run_harness(
    conn: &Conn,
    export_id: &str,
    request: HarnessRequest,
    ctx: &CallContext,
    timeout: Duration,
) -> Result<Value, InvokeError> {
    let mut fields = Map::new();
    fields.insert("mode".into(), json!(request.mode));
    fields.insert("target".into(), request.target);
    fields.insert("trigger".into(), request.trigger);
    fields.insert("policy".into(), request.policy);
    let op = "harness.run";
    let body = invoke(
        conn,
        export_id,
        ExportKind::Harness,
        op,
        fields,
        ctx,
        timeout,
    )
    .await?;
    let mut body = terminal(&conn.spec, export_id, op, body, &["succeeded"])?;
    Ok(body
        .get_mut("result")
        .map(Value::take)
        .unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_773_345_600);
        assert_eq!(rfc3339(t), "2026-03-12T20:00:00Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400 + 86_399);
        assert_eq!(rfc3339(leap), "2000-02-29T23:59:59Z");
    }

    #[test]
    fn hello_identity_is_checked() {
        let spec = PluginSpec {
            id: "acme/devkit".into(),
            version: "0.1.0".into(),
            ..PluginSpec::base()
        };
        let ok = json!({"protocol":"vai.rpc.v1","type":"hello","role":"plugin","plugin":{"package_id":"acme/devkit","version":"0.1.0"}});
        let hs = check_hello(&spec, &ok).unwrap();
        assert_eq!(hs.server_version.as_deref(), Some("0.1.0"));
        let other = json!({"role":"plugin","plugin":{"package_id":"evil/kit","version":"0.1.0"}});
        assert!(matches!(
            check_hello(&spec, &other),
            Err(HandshakeError::IdentityMismatch { ref got, .. }) if got == "evil/kit@0.1.0"
        ));
        let old = json!({"plugin":{"package_id":"acme/devkit","version":"0.0.9"}});
        assert!(matches!(
            check_hello(&spec, &old),
            Err(HandshakeError::IdentityMismatch { ref expected, .. }) if expected == "acme/devkit@0.1.0"
        ));
        let host = json!({"role":"host","plugin":{"package_id":"acme/devkit","version":"0.1.0"}});
        assert!(matches!(
            check_hello(&spec, &host),
            Err(HandshakeError::Malformed { ref reason, .. }) if reason.contains("expected \"plugin\"")
        ));
        assert!(matches!(
            check_hello(&spec, &json!({"role":"plugin"})),
            Err(HandshakeError::Malformed { ref reason, .. }) if reason.contains("no \"plugin\" object")
        ));
    }

    #[test]
    fn failures_name_status_and_retryable() {
        let spec = PluginSpec {
            id: "a/b".into(),
            ..PluginSpec::base()
        };
        let body = json!({"status":"retryable_failure","result":{"content":[{"type":"text","text":"rate limited"}],"is_error":true}});
        let e = failure(&spec, "t", &body);
        assert_eq!(
            e.to_string(),
            "export \"t\" of package \"a/b\" ended with status \"retryable_failure\" (retryable: true): rate limited"
        );
        let e = terminal(
            &spec,
            "t",
            "tool.invoke",
            json!({"status":"weird"}),
            &["succeeded"],
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown status \"weird\""), "{e}");
    }
}
