//! Disabled tools and per-call approvals on PostgreSQL.
//!
//! Same operations and meaning as `plugd-store`'s `tool_state.rs`. Expiry is
//! judged by the database's clock ([`NOW_MS`]); deciding is one conditional
//! `UPDATE … WHERE state = 'pending'`, which takes the row lock, so of two
//! operators racing on one id exactly one wins and the other is told it was
//! decided already.

use plugd_control::store::tool_state::{
    ApprovalState, CallApproval, Decide, DisabledTool, NewCallApproval,
};

use crate::clock::{NOW_MS, NOW_RFC3339, ms_rfc3339, random_hex};
use crate::{PgError, PgStore};

const COLUMNS: &str = "id, tool, plugin_id, risk, args_preview, requested_at, expires_at_ms, state, decided_by, decided_at, reason, caller, surface, session_id, agent_id";

impl PgStore {
    /// Disables tool `tool` of `plugin_id`; `false` if it was disabled already.
    pub async fn tool_disable(
        &self,
        plugin_id: &str,
        tool: &str,
        by: &str,
    ) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &format!(
                    "INSERT INTO disabled_tools (plugin_id, tool, disabled_by, disabled_at)
                     VALUES ($1, $2, $3, {NOW_RFC3339}) ON CONFLICT (plugin_id, tool) DO NOTHING"
                ),
                &[&plugin_id, &tool, &by],
            )
            .await
            .map_err(|e| self.query_error(format!("disable tool {tool:?} of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Enables tool `tool` of `plugin_id` again; `false` if it was not disabled.
    pub async fn tool_enable(&self, plugin_id: &str, tool: &str) -> Result<bool, PgError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM disabled_tools WHERE plugin_id = $1 AND tool = $2",
                &[&plugin_id, &tool],
            )
            .await
            .map_err(|e| self.query_error(format!("enable tool {tool:?} of {plugin_id:?}"), e))?;
        Ok(n > 0)
    }

    /// Every disabled tool, by plugin and name.
    pub async fn disabled_tools(&self) -> Result<Vec<DisabledTool>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT plugin_id, tool, disabled_by, disabled_at FROM disabled_tools
                 ORDER BY plugin_id, tool",
                &[],
            )
            .await
            .map_err(|e| self.query_error("list disabled tools", e))?;
        Ok(rows
            .iter()
            .map(|r| DisabledTool {
                plugin_id: r.get(0),
                tool: r.get(1),
                disabled_by: r.get(2),
                disabled_at: r.get(3),
            })
            .collect())
    }

    /// Whether tool `tool` of `plugin_id` is disabled.
    pub async fn tool_disabled(&self, plugin_id: &str, tool: &str) -> Result<bool, PgError> {
        // Cached: every tool call asks.
        let action = || format!("read state of tool {tool:?}");
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT 1 FROM disabled_tools WHERE plugin_id = $1 AND tool = $2")
            .await
            .map_err(|e| self.query_error(action(), e))?;
        let row = client
            .query_opt(&stmt, &[&plugin_id, &tool])
            .await
            .map_err(|e| self.query_error(action(), e))?;
        Ok(row.is_some())
    }

    /// Records a pending call approval, requested now by the database's
    /// clock; returns it with its new id (`apr_` and 16 hex digits).
    pub async fn call_approval_request(
        &self,
        a: &NewCallApproval,
    ) -> Result<CallApproval, PgError> {
        let id = format!("apr_{}", random_hex(8)?);
        let client = self.client().await?;
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO call_approvals
                        (id, tool, plugin_id, risk, args_preview, requested_at, expires_at_ms, state,
                         caller, surface, session_id, agent_id)
                     VALUES ($1, $2, $3, $4, $5, {NOW_RFC3339}, $6, 'pending', $7, $8, $9, $10)
                     RETURNING {COLUMNS}"
                ),
                &[
                    &id,
                    &a.tool,
                    &a.plugin_id,
                    &a.risk,
                    &a.args_preview,
                    &a.expires_at_ms,
                    &a.caller,
                    &a.surface,
                    &a.session_id,
                    &a.agent_id,
                ],
            )
            .await
            .map_err(|e| {
                self.query_error(format!("record an approval request for tool {:?}", a.tool), e)
            })?;
        self.decode_call_approval(&row)
    }

    /// The call approval `id`, if any.
    pub async fn call_approval(&self, id: &str) -> Result<Option<CallApproval>, PgError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM call_approvals WHERE id = $1"),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(format!("read approval {id:?}"), e))?;
        row.map(|r| self.decode_call_approval(&r)).transpose()
    }

    /// Pending call approvals that have not expired (by the database's
    /// clock), oldest first.
    pub async fn call_approvals_pending(&self) -> Result<Vec<CallApproval>, PgError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM call_approvals
                     WHERE state = 'pending' AND expires_at_ms > {NOW_MS}
                     ORDER BY requested_at, id"
                ),
                &[],
            )
            .await
            .map_err(|e| self.query_error("list pending approvals", e))?;
        rows.iter().map(|r| self.decode_call_approval(r)).collect()
    }

    /// Decides the pending approval `id` (`Approved`, `Denied` or
    /// `TimedOut`), unless it was decided already or has expired by the
    /// database's clock (an expired one is recorded as timed out and
    /// reported as decided).
    pub async fn call_approval_decide(
        &self,
        id: &str,
        state: ApprovalState,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Decide, PgError> {
        let client = self.client().await?;
        let action = || format!("decide approval {id:?}");
        // A timeout may be recorded after expiry; an operator's decision may not.
        let decided = client
            .query_opt(
                &format!(
                    "UPDATE call_approvals
                     SET state = $2, decided_by = $3, decided_at = {NOW_RFC3339}, reason = $4
                     WHERE id = $1 AND state = 'pending'
                       AND ($2 = 'timed_out' OR expires_at_ms > {NOW_MS})
                     RETURNING {COLUMNS}"
                ),
                &[&id, &state.as_str(), &by, &reason],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        if let Some(row) = decided {
            return Ok(Decide::Decided(self.decode_call_approval(&row)?));
        }
        // Not decided now: unknown, decided before, or expired while nobody
        // recorded it (record the timeout now, unless someone just did).
        let timed_out = client
            .query_opt(
                &format!(
                    "UPDATE call_approvals
                     SET state = 'timed_out', decided_by = 'timeout', decided_at = {NOW_RFC3339}
                     WHERE id = $1 AND state = 'pending' AND expires_at_ms <= {NOW_MS}
                     RETURNING {COLUMNS}"
                ),
                &[&id],
            )
            .await
            .map_err(|e| self.query_error(action(), e))?;
        if let Some(row) = timed_out {
            return Ok(Decide::AlreadyDecided(self.decode_call_approval(&row)?));
        }
        Ok(match self.call_approval(id).await? {
            None => Decide::Unknown,
            Some(now) => Decide::AlreadyDecided(now),
        })
    }

    fn decode_call_approval(&self, r: &tokio_postgres::Row) -> Result<CallApproval, PgError> {
        let id: String = r.get(0);
        let state: String = r.get(7);
        let state = ApprovalState::parse(&state).ok_or_else(|| PgError::Damaged {
            db: self.label().to_owned(),
            what: format!("approval {id}"),
            detail: format!("unknown state {state:?}"),
        })?;
        let expires_at_ms: i64 = r.get(6);
        Ok(CallApproval {
            id,
            tool: r.get(1),
            plugin: r.get(2),
            risk: r.get(3),
            args_preview: r.get(4),
            requested_at: r.get(5),
            expires_at: ms_rfc3339(expires_at_ms),
            state,
            decided_by: r.get(8),
            decided_at: r.get(9),
            reason: r.get(10),
            caller: r.get(11),
            surface: r.get(12),
            session_id: r.get(13),
            agent_id: r.get(14),
        })
    }
}
