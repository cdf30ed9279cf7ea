//! MCP tasks (protocol 2025-11-25, `io.modelcontextprotocol/tasks`): plugd as
//! the requestor of task-augmented `tools/call`.
//!
//! * Which tools: a tool whose `execution.taskSupport` is `"required"`, on a
//!   server whose capabilities declare `tasks.requests.tools.call`
//!   ([`runs_tool_tasks`]). Such a tool without the capability cannot be
//!   called at all (the spec forbids the task, the server refuses the plain
//!   call), so `tools/list` hides it with a warning. `"optional"` tools are
//!   called the plain way.
//! * The call ([`call_as_task`]): `tools/call` with `task: {ttl}` (the call
//!   timeout), the `CreateTaskResult` awaited, then `tasks/get` every
//!   `pollInterval` (clamped to [`MIN_POLL_INTERVAL`]..[`MAX_POLL_INTERVAL`];
//!   [`DEFAULT_POLL_INTERVAL`] when absent) or as soon as
//!   `notifications/tasks/status` names the task ([`TaskWatchers`]; a hint
//!   only: `tasks/get` stays the source of truth), and `tasks/result` once it
//!   is `completed`, `failed` or `input_required` (then the server sends its
//!   elicitation/sampling requests while `tasks/result` blocks; they are
//!   routed like any other). A server that answers `tools/call` with a plain
//!   result despite the `task` field is taken at its word.
//! * Progress: the `tools/call` progress token stays valid for the task's
//!   life, so its events keep reaching the caller until the call ends
//!   ([`plugd_host::peer::Peer::call_routed`]).
//! * Bounds: the whole call, polls and result included, stays within the
//!   call timeout; when plugd gives up (deadline, caller gone, a broken
//!   reply) on a task that is not terminal, it sends `tasks/cancel` when the
//!   server declares `tasks.cancel` (else the task lapses at its ttl).
//!   Every failure names the server, the task and the cause.
//! * Not implemented: plugd receives no tasks itself (no task-augmented
//!   sampling or elicitation, no `tasks/list` to answer), so `initialize`
//!   declares no client `tasks` capability; `tasks/list` is not used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::time::Instant;

use plugd_host::dialect::CallContext;
use plugd_host::model::{ToolDef, ToolError};
use plugd_host::peer::{CallError, Peer};

/// Wait between polls when the server suggests none (the TypeScript SDK's).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(1000);

/// Shortest wait between two `tasks/get` (a `pollInterval` of 0 or a flood
/// of status notifications does not turn into a flood of polls).
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Longest wait between two `tasks/get`, whatever the server suggests.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// Longest task id accepted, in bytes.
pub const MAX_TASK_ID: usize = 256;

/// How long a `tasks/cancel` sent for an abandoned task may take.
pub const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `caps` (a server's `initialize` capabilities) declare
/// task-augmented `tools/call`.
pub fn runs_tool_tasks(caps: &Value) -> bool {
    caps.pointer("/tasks/requests/tools/call")
        .is_some_and(|v| !v.is_null())
}

/// Whether `caps` declare `tasks/cancel`.
pub fn cancels_tasks(caps: &Value) -> bool {
    caps.pointer("/tasks/cancel").is_some_and(|v| !v.is_null())
}

/// A tool's `execution.taskSupport` as listed, when it is a string.
pub fn task_support(raw_tool: &Value) -> Option<&str> {
    raw_tool.pointer("/execution/taskSupport")?.as_str()
}

/// Whether plugd calls `tool` task-augmented (its listed
/// `execution.taskSupport` is `"required"`).
pub fn requires_task(tool: &ToolDef) -> bool {
    tool.meta
        .as_ref()
        .and_then(|m| m.execution.as_ref())
        .and_then(|e| e.get("taskSupport"))
        .and_then(Value::as_str)
        == Some("required")
}

/// The calls waiting on a task of one connection, woken by
/// `notifications/tasks/status`. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct TaskWatchers(Arc<Mutex<HashMap<String, Arc<Notify>>>>);

impl TaskWatchers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `notifications/tasks/status` arrived: the call waiting on its task
    /// polls now. `false` when no call waits on it (ignored).
    pub fn status_changed(&self, params: Option<&Value>) -> bool {
        let Some(id) = params.and_then(|p| p.get("taskId")).and_then(Value::as_str) else {
            return false;
        };
        match self.map().get(id) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Watches `task_id` until the guard drops; `None` when a call in
    /// flight already watches it (the server handed one task id out twice).
    fn watch(&self, task_id: &str) -> Option<Watch> {
        let mut map = self.map();
        if map.contains_key(task_id) {
            return None;
        }
        let notify = Arc::new(Notify::new());
        map.insert(task_id.to_owned(), notify.clone());
        Some(Watch {
            watchers: self.clone(),
            task_id: task_id.to_owned(),
            notify,
        })
    }

    /// How many calls wait on a task.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no call waits on a task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Watch {
    watchers: TaskWatchers,
    task_id: String,
    notify: Arc<Notify>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.watchers.map().remove(&self.task_id);
    }
}

/// A task status (2025-11-25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `working`.
    Working,
    /// `input_required`: the server has requests for the client.
    InputRequired,
    /// `completed` (terminal).
    Completed,
    /// `failed` (terminal).
    Failed,
    /// `cancelled` (terminal).
    Cancelled,
}

impl Status {
    fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "working" => Status::Working,
            "input_required" => Status::InputRequired,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// What plugd reads of a `Task` object.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskState {
    /// `taskId`.
    pub id: String,
    /// `status`.
    pub status: Status,
    /// `statusMessage`, at most 512 characters.
    pub message: Option<String>,
    /// `pollInterval`, clamped.
    pub poll: Duration,
}

/// Reads a `Task` object; `expect_id` is the id it must carry (a
/// `tasks/get` reply for another task is a lie). The error says what is
/// wrong with it.
pub fn parse_task(v: &Value, expect_id: Option<&str>) -> Result<TaskState, String> {
    let Some(obj) = v.as_object() else {
        return Err(format!(
            "expected a Task object, got {}",
            crate::mcp::preview(v)
        ));
    };
    let id = match obj.get("taskId") {
        Some(Value::String(id)) if !id.is_empty() && id.len() <= MAX_TASK_ID => id.clone(),
        Some(Value::String(id)) if id.is_empty() => return Err("its \"taskId\" is empty".into()),
        Some(Value::String(_)) => {
            return Err(format!("its \"taskId\" is over {MAX_TASK_ID} bytes"));
        }
        // A tasks/get reply may leave the id out: the request named it.
        None if expect_id.is_some() => expect_id.unwrap_or_default().to_owned(),
        other => {
            return Err(format!(
                "its \"taskId\" must be a string, got {}",
                other
                    .map(crate::mcp::preview)
                    .unwrap_or_else(|| "nothing".into())
            ));
        }
    };
    if let Some(want) = expect_id
        && id != want
    {
        return Err(format!(
            "it describes task {:?}, not the task asked about",
            id.chars().take(64).collect::<String>()
        ));
    }
    let status = match obj.get("status") {
        Some(Value::String(s)) => Status::parse(s).ok_or_else(|| {
            format!(
                "its status {:?} is none of working, input_required, completed, failed, cancelled",
                s.chars().take(64).collect::<String>()
            )
        })?,
        other => {
            return Err(format!(
                "its \"status\" must be a string, got {}",
                other
                    .map(crate::mcp::preview)
                    .unwrap_or_else(|| "nothing".into())
            ));
        }
    };
    let message = obj
        .get("statusMessage")
        .and_then(Value::as_str)
        .map(|m| m.chars().take(512).collect());
    let poll = obj
        .get("pollInterval")
        .and_then(Value::as_f64)
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| Duration::from_millis(ms.min(u32::MAX as f64) as u64))
        .unwrap_or(DEFAULT_POLL_INTERVAL)
        .clamp(MIN_POLL_INTERVAL, MAX_POLL_INTERVAL);
    Ok(TaskState {
        id,
        status,
        message,
        poll,
    })
}

/// Sends `tasks/cancel` for a task plugd gives up on, unless disarmed (the
/// task ended) or the server has no `tasks/cancel`.
struct CancelOnDrop {
    peer: Peer,
    task_id: String,
    armed: bool,
    why: &'static str,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let peer = self.peer.clone();
        let task_id = std::mem::take(&mut self.task_id);
        let why = self.why;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let plugin = peer.plugin().clone();
            match peer
                .call("tasks/cancel", Some(json!({"taskId": task_id})), CANCEL_TIMEOUT)
                .await
            {
                Ok(_) => {
                    tracing::info!(plugin = %plugin, task = %task_id, "task cancelled ({why})")
                }
                Err(e) => {
                    tracing::info!(plugin = %plugin, task = %task_id, "tasks/cancel ({why}) failed: {e}")
                }
            }
        });
    }
}

/// Calls `tool` task-augmented and returns its `CallToolResult` (the caller
/// checks `isError`). `tools_call_error` maps an error answer to the
/// `tools/call` itself (or to `tasks/result`, which answers what the call
/// would have). `cancel` says whether the server declared `tasks/cancel`.
#[allow(clippy::too_many_arguments)]
pub async fn call_as_task(
    peer: &Peer,
    tool: &ToolDef,
    args: Value,
    ctx: &CallContext,
    timeout: Duration,
    cancel: bool,
    watchers: Option<&TaskWatchers>,
    tools_call_error: impl Fn(CallError) -> ToolError,
) -> Result<Value, ToolError> {
    let plugin = peer.plugin().clone();
    let deadline = Instant::now() + timeout;
    let ttl = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let fail = |message: String| ToolError::ExecutionFailed {
        plugin: plugin.clone(),
        tool: tool.name.clone(),
        message,
    };
    // Progress keeps its token for the task's life; a caller without a
    // progress sink gets a route nobody reads.
    let sink = ctx
        .progress
        .clone()
        .unwrap_or_else(|| tokio::sync::mpsc::unbounded_channel().0);
    let (created, route) = peer
        .call_routed(
            "tools/call",
            Some(crate::mcp::with_trace(
                json!({"name": tool.wire(), "arguments": args, "task": {"ttl": ttl}}),
            )),
            timeout,
            sink,
        )
        .await
        .map_err(&tools_call_error)?;
    let Some(task) = created.get("task") else {
        // Processed normally after all: what the server may do.
        return Ok(created);
    };
    let mut state = parse_task(task, None).map_err(|why| {
        fail(format!(
            "the server answered the task-augmented tools/call with a malformed CreateTaskResult: {why}"
        ))
    })?;
    let task_id = state.id.clone();
    let describe = |why: String| {
        format!(
            "task {:?}: {why}",
            task_id.chars().take(64).collect::<String>()
        )
    };
    let mut guard = CancelOnDrop {
        peer: peer.clone(),
        task_id: task_id.clone(),
        armed: cancel,
        why: "plugd gave up on it",
    };
    let watch = match watchers {
        Some(w) => Some(w.watch(&task_id).ok_or_else(|| {
            guard.armed = false; // not ours to cancel
            fail(describe(
                "the server gave this id to another call still in flight".into(),
            ))
        })?),
        None => None,
    };
    tracing::debug!(plugin = %plugin, task = %task_id, "task created for {}", tool.name);
    let timed_out = |status: Status| {
        ToolError::Call(CallError::Timeout {
            plugin: plugin.clone(),
            method: format!(
                "tools/call (task {:?}, last status {})",
                task_id.chars().take(64).collect::<String>(),
                status.name()
            ),
            after: timeout,
            id: route.id(),
        })
    };
    let mut last_poll = Instant::now();
    loop {
        match state.status {
            Status::Working => {
                let due = (last_poll + state.poll).min(deadline);
                match &watch {
                    Some(w) => {
                        tokio::select! {
                            _ = tokio::time::sleep_until(due) => {}
                            _ = w.notify.notified() => {
                                // A hint: poll now, but not faster than the floor.
                                tokio::time::sleep_until((last_poll + MIN_POLL_INTERVAL).min(deadline)).await;
                            }
                        }
                    }
                    None => tokio::time::sleep_until(due).await,
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(timed_out(state.status));
                }
                last_poll = now;
                let got = peer
                    .call(
                        "tasks/get",
                        Some(json!({"taskId": task_id})),
                        deadline - now,
                    )
                    .await;
                let got = match got {
                    Ok(v) => v,
                    Err(CallError::Timeout { .. }) => return Err(timed_out(state.status)),
                    Err(CallError::Remote { error, .. }) => {
                        return Err(fail(describe(format!(
                            "tasks/get answered error {}: {}",
                            error.code,
                            error.message.chars().take(512).collect::<String>()
                        ))));
                    }
                    Err(e) => return Err(ToolError::Call(e)),
                };
                let next = parse_task(&got, Some(&task_id)).map_err(|why| {
                    fail(describe(format!(
                        "the server's tasks/get reply is malformed: {why}"
                    )))
                })?;
                if next.status != state.status || next.message != state.message {
                    tracing::debug!(plugin = %plugin, task = %task_id, status = next.status.name(), "task {}", next.message.as_deref().unwrap_or(""));
                }
                state = next;
            }
            Status::Cancelled => {
                guard.armed = false;
                return Err(fail(describe(format!(
                    "the server cancelled the task{}",
                    state
                        .message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                ))));
            }
            status @ (Status::Completed | Status::Failed | Status::InputRequired) => {
                if status != Status::InputRequired {
                    guard.armed = false; // terminal: nothing to cancel
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(timed_out(status));
                }
                // Blocks until the task is terminal; an input_required
                // task's requests arrive meanwhile.
                let got = peer
                    .call("tasks/result", Some(json!({"taskId": task_id})), left)
                    .await;
                let result = match got {
                    Ok(v) => v,
                    Err(CallError::Timeout { .. }) => return Err(timed_out(status)),
                    Err(e @ CallError::Remote { .. }) => {
                        guard.armed = false;
                        return Err(match (status, e) {
                            (Status::Failed, CallError::Remote { error, .. }) => {
                                fail(describe(format!(
                                    "failed{}; tasks/result answered error {}: {}",
                                    state
                                        .message
                                        .as_deref()
                                        .map(|m| format!(" ({m})"))
                                        .unwrap_or_default(),
                                    error.code,
                                    error.message.chars().take(512).collect::<String>()
                                )))
                            }
                            (_, e) => tools_call_error(e),
                        });
                    }
                    Err(e) => return Err(ToolError::Call(e)),
                };
                guard.armed = false;
                if !result.is_object() || result.get("task").is_some() {
                    return Err(fail(describe(format!(
                        "tasks/result is not a tool result: {}",
                        crate::mcp::preview(&result)
                    ))));
                }
                if status == Status::Failed
                    && result.get("isError").and_then(Value::as_bool) != Some(true)
                {
                    return Err(fail(describe(format!(
                        "failed{}",
                        state
                            .message
                            .as_deref()
                            .map(|m| format!(": {m}"))
                            .unwrap_or_default()
                    ))));
                }
                return Ok(result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_and_support_are_read_where_the_spec_puts_them() {
        let caps = json!({"tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}});
        assert!(runs_tool_tasks(&caps));
        assert!(cancels_tasks(&caps));
        assert!(!runs_tool_tasks(&json!({"tasks": {"list": {}}})));
        assert!(!runs_tool_tasks(
            &json!({"tasks": {"requests": {"tools": {"call": null}}}})
        ));
        assert!(!cancels_tasks(&json!({})));
        assert_eq!(
            task_support(&json!({"execution": {"taskSupport": "required"}})),
            Some("required")
        );
        assert_eq!(
            task_support(&json!({"execution": {"taskSupport": 1}})),
            None
        );
    }

    #[test]
    fn a_task_is_checked_and_its_poll_interval_bounded() {
        let t = parse_task(
            &json!({"taskId": "t1", "status": "working", "pollInterval": 0}),
            None,
        )
        .unwrap();
        assert_eq!(t.poll, MIN_POLL_INTERVAL);
        let t = parse_task(
            &json!({"taskId": "t1", "status": "input_required", "pollInterval": 1e300}),
            Some("t1"),
        )
        .unwrap();
        assert_eq!(
            (t.status, t.poll),
            (Status::InputRequired, MAX_POLL_INTERVAL)
        );
        let t = parse_task(&json!({"status": "completed"}), Some("t1")).unwrap();
        assert_eq!((t.id.as_str(), t.poll), ("t1", DEFAULT_POLL_INTERVAL));
        for (bad, why) in [
            (
                json!({"taskId": "t2", "status": "working"}),
                "not the task asked about",
            ),
            (json!({"taskId": "t1", "status": "done"}), "none of working"),
            (json!({"taskId": "t1"}), "\"status\" must be a string"),
            (json!([]), "expected a Task object"),
        ] {
            let err = parse_task(&bad, Some("t1")).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let err = parse_task(&json!({"status": "working"}), None).unwrap_err();
        assert!(err.contains("\"taskId\" must be a string"), "{err}");
        let long = "x".repeat(MAX_TASK_ID + 1);
        let err = parse_task(&json!({"taskId": long, "status": "working"}), None).unwrap_err();
        assert!(err.contains("over 256 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_status_notification_wakes_only_the_call_on_that_task() {
        let w = TaskWatchers::default();
        let watch = w.watch("a").unwrap();
        assert!(w.watch("a").is_none(), "one task id, one call");
        assert!(!w.status_changed(Some(&json!({"taskId": "b"}))));
        assert!(!w.status_changed(Some(&json!({"taskId": 1}))));
        assert!(!w.status_changed(None));
        assert!(w.status_changed(Some(&json!({"taskId": "a", "status": "completed"}))));
        // The permit is kept until the call waits.
        watch.notify.notified().await;
        drop(watch);
        assert!(w.is_empty());
        assert!(!w.status_changed(Some(&json!({"taskId": "a"}))));
    }
}
