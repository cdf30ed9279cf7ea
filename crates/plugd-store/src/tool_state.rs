//! Per-tool state: which tools an operator disabled (`plugd tool disable`)
//! and the per-call approvals of risky tool calls (`/v1/approvals`).
//!
//! A disabled tool is keyed by its plugin and its registry name, so a tool of
//! the same name that another plugin registers later is not affected.
//!
//! A call approval is a row that a waiting call polls: `pending` until an
//! operator approves or denies it, or until `expires_at_ms` passes (the
//! waiting call then marks it `timed_out`). Deciding is one conditional
//! `UPDATE`, so two operators racing on one id get one winner and one
//! [`Decide::AlreadyDecided`].
//!
//! **API boundary:** plain data in and out; nothing SQLite-specific leaks.

use rusqlite::{OptionalExtension, params};

use crate::error::StoreError;
use crate::outbox::now_ms;
use crate::store::Store;

pub use plugd_control::store::tool_state::{
    ApprovalState, CallApproval, Decide, DisabledTool, NewCallApproval,
};

/// Schema step: disabled tools and per-call approvals.
pub(crate) const MIGRATION: &str = "
    CREATE TABLE disabled_tools (
        plugin_id   TEXT NOT NULL,
        tool        TEXT NOT NULL,
        disabled_by TEXT NOT NULL,
        disabled_at TEXT NOT NULL,
        PRIMARY KEY (plugin_id, tool)
    ) STRICT;
    CREATE TABLE call_approvals (
        id            TEXT PRIMARY KEY NOT NULL,
        tool          TEXT NOT NULL,
        plugin_id     TEXT NOT NULL,
        risk          TEXT NOT NULL,
        args_preview  TEXT NOT NULL,
        requested_at  TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        state         TEXT NOT NULL,
        decided_by    TEXT,
        decided_at    TEXT,
        reason        TEXT
    ) STRICT;
    CREATE INDEX call_approvals_by_state ON call_approvals (state, requested_at);
";

/// Schema step: who asks for a call approval (the caller as invocation
/// records name it, the surface, the session and the agent).
pub(crate) const ASKER_MIGRATION: &str = "
    ALTER TABLE call_approvals ADD COLUMN caller TEXT;
    ALTER TABLE call_approvals ADD COLUMN surface TEXT;
    ALTER TABLE call_approvals ADD COLUMN session_id TEXT;
    ALTER TABLE call_approvals ADD COLUMN agent_id TEXT;
";

const COLUMNS: &str = "id, tool, plugin_id, risk, args_preview, requested_at, expires_at_ms, state, decided_by, decided_at, reason, caller, surface, session_id, agent_id";

struct Raw {
    id: String,
    tool: String,
    plugin: String,
    risk: String,
    args_preview: String,
    requested_at: String,
    expires_at_ms: i64,
    state: String,
    decided_by: Option<String>,
    decided_at: Option<String>,
    reason: Option<String>,
    caller: Option<String>,
    surface: Option<String>,
    session_id: Option<String>,
    agent_id: Option<String>,
}

fn raw(r: &rusqlite::Row<'_>) -> rusqlite::Result<Raw> {
    Ok(Raw {
        id: r.get(0)?,
        tool: r.get(1)?,
        plugin: r.get(2)?,
        risk: r.get(3)?,
        args_preview: r.get(4)?,
        requested_at: r.get(5)?,
        expires_at_ms: r.get(6)?,
        state: r.get(7)?,
        decided_by: r.get(8)?,
        decided_at: r.get(9)?,
        reason: r.get(10)?,
        caller: r.get(11)?,
        surface: r.get(12)?,
        session_id: r.get(13)?,
        agent_id: r.get(14)?,
    })
}

fn ms_rfc3339(ms: i64) -> String {
    crate::time::format_unix_secs(u64::try_from(ms.max(0) / 1000).unwrap_or(0))
}

impl Store {
    /// Disables tool `tool` of `plugin_id`; `false` if it was disabled already.
    pub fn tool_disable(&self, plugin_id: &str, tool: &str, by: &str) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "INSERT INTO disabled_tools (plugin_id, tool, disabled_by, disabled_at)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (plugin_id, tool) DO NOTHING",
                params![plugin_id, tool, by, crate::now_rfc3339()],
            )
            .map_err(|e| self.query_error(format!("disable tool {tool:?} of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Enables tool `tool` of `plugin_id` again; `false` if it was not disabled.
    pub fn tool_enable(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError> {
        let n = self
            .lock()
            .execute(
                "DELETE FROM disabled_tools WHERE plugin_id = ?1 AND tool = ?2",
                params![plugin_id, tool],
            )
            .map_err(|e| self.query_error(format!("enable tool {tool:?} of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Every disabled tool, by plugin and name.
    pub fn disabled_tools(&self) -> Result<Vec<DisabledTool>, StoreError> {
        let conn = self.lock();
        let read = || -> rusqlite::Result<Vec<DisabledTool>> {
            let mut stmt = conn.prepare(
                "SELECT plugin_id, tool, disabled_by, disabled_at FROM disabled_tools
                 ORDER BY plugin_id, tool",
            )?;
            stmt.query_map([], |r| {
                Ok(DisabledTool {
                    plugin_id: r.get(0)?,
                    tool: r.get(1)?,
                    disabled_by: r.get(2)?,
                    disabled_at: r.get(3)?,
                })
            })?
            .collect()
        };
        read().map_err(|e| self.query_error("list disabled tools".to_owned(), e))
    }

    /// Whether tool `tool` of `plugin_id` is disabled.
    pub fn tool_disabled(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError> {
        self.lock()
            .query_row(
                "SELECT 1 FROM disabled_tools WHERE plugin_id = ?1 AND tool = ?2",
                params![plugin_id, tool],
                |_| Ok(()),
            )
            .optional()
            .map(|r| r.is_some())
            .map_err(|e| self.query_error(format!("read state of tool {tool:?}"), e))
    }

    /// Records a pending call approval; returns it with its new id.
    pub fn call_approval_request(&self, a: &NewCallApproval) -> Result<CallApproval, StoreError> {
        let action = || format!("record an approval request for tool {:?}", a.tool);
        let id: String = {
            let conn = self.lock();
            conn.query_row(
                "INSERT INTO call_approvals
                    (id, tool, plugin_id, risk, args_preview, requested_at, expires_at_ms, state,
                     caller, surface, session_id, agent_id)
                 VALUES ('apr_' || lower(hex(randomblob(8))), ?1, ?2, ?3, ?4, ?5, ?6, 'pending',
                         ?7, ?8, ?9, ?10)
                 RETURNING id",
                params![
                    a.tool,
                    a.plugin_id,
                    a.risk,
                    a.args_preview,
                    crate::now_rfc3339(),
                    a.expires_at_ms,
                    a.caller,
                    a.surface,
                    a.session_id,
                    a.agent_id
                ],
                |r| r.get(0),
            )
            .map_err(|e| self.query_error(action(), e))?
        };
        self.call_approval(&id)?.ok_or_else(|| StoreError::Invalid {
            what: format!("approval {id:?}"),
            problem: "it vanished right after it was stored; retry",
        })
    }

    /// The call approval `id`, if any.
    pub fn call_approval(&self, id: &str) -> Result<Option<CallApproval>, StoreError> {
        let row = self
            .lock()
            .query_row(
                &format!("SELECT {COLUMNS} FROM call_approvals WHERE id = ?1"),
                params![id],
                raw,
            )
            .optional()
            .map_err(|e| self.query_error(format!("read approval {id:?}"), e))?;
        row.map(|r| self.decode_approval(r)).transpose()
    }

    /// Pending call approvals that have not expired, oldest first.
    pub fn call_approvals_pending(&self) -> Result<Vec<CallApproval>, StoreError> {
        let rows = {
            let conn = self.lock();
            let read = || -> rusqlite::Result<Vec<Raw>> {
                let mut stmt = conn.prepare(&format!(
                    "SELECT {COLUMNS} FROM call_approvals
                     WHERE state = 'pending' AND expires_at_ms > ?1 ORDER BY requested_at, id"
                ))?;
                stmt.query_map(params![now_ms()], raw)?.collect()
            };
            read().map_err(|e| self.query_error("list pending approvals".to_owned(), e))?
        };
        rows.into_iter().map(|r| self.decode_approval(r)).collect()
    }

    /// Decides the pending approval `id` (`Approved`, `Denied` or
    /// `TimedOut`), unless it was decided already or has expired (an
    /// expired one is recorded as timed out and reported as decided).
    pub fn call_approval_decide(
        &self,
        id: &str,
        state: ApprovalState,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Decide, StoreError> {
        // A timeout may be recorded after expiry; an operator's decision may not.
        let deadline = if state == ApprovalState::TimedOut {
            i64::MIN
        } else {
            now_ms()
        };
        let n = self
            .lock()
            .execute(
                "UPDATE call_approvals SET state = ?2, decided_by = ?3, decided_at = ?4, reason = ?5
                 WHERE id = ?1 AND state = 'pending' AND expires_at_ms > ?6",
                params![
                    id,
                    state.as_str(),
                    by,
                    crate::now_rfc3339(),
                    reason,
                    deadline
                ],
            )
            .map_err(|e| self.query_error(format!("decide approval {id:?}"), e))?;
        let Some(now) = self.call_approval(id)? else {
            return Ok(Decide::Unknown);
        };
        if n > 0 {
            return Ok(Decide::Decided(now));
        }
        if now.state == ApprovalState::Pending {
            // Expired while nobody recorded it: record the timeout now.
            self.call_approval_decide(id, ApprovalState::TimedOut, "timeout", None)?;
            let now = self.call_approval(id)?.unwrap_or(now);
            return Ok(Decide::AlreadyDecided(now));
        }
        Ok(Decide::AlreadyDecided(now))
    }

    fn decode_approval(&self, r: Raw) -> Result<CallApproval, StoreError> {
        let state = ApprovalState::parse(&r.state).ok_or_else(|| StoreError::Corrupt {
            db: self.label().to_owned(),
            plugin_id: r.plugin.clone(),
            detail: format!("approval {} has unknown state {:?}", r.id, r.state),
        })?;
        Ok(CallApproval {
            id: r.id,
            tool: r.tool,
            plugin: r.plugin,
            risk: r.risk,
            args_preview: r.args_preview,
            requested_at: r.requested_at,
            expires_at: ms_rfc3339(r.expires_at_ms),
            state,
            decided_by: r.decided_by,
            decided_at: r.decided_at,
            reason: r.reason,
            caller: r.caller,
            surface: r.surface,
            session_id: r.session_id,
            agent_id: r.agent_id,
        })
    }
}
