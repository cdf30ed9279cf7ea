//! The SQLite [`Store`] as every state trait of `plugd_control::store`: each method answers at once from the synchronous one of the same name.

use std::time::Duration;

use async_trait::async_trait;
use plugd_control::bindings::*;
use plugd_control::chains::*;
use plugd_control::invocations::*;
use plugd_control::packages::*;
use plugd_control::store::outbox::*;
use plugd_control::store::tool_state::*;
use plugd_control::store::*;
use serde_json::Value;

use crate::store::Store;

#[async_trait]
impl ApprovalStore for Store {
    async fn approve(&self, a: &Approval) -> Result<(), StoreError> {
        Store::approve(self, a)
    }
    async fn approve_clearing_failure(&self, a: &Approval) -> Result<(), StoreError> {
        Store::approve_clearing_failure(self, a)
    }
    async fn revoke_exact(&self, a: &Approval) -> Result<bool, StoreError> {
        Store::revoke_exact(self, a)
    }
    async fn approval(&self, plugin_id: &str) -> Result<Option<Approval>, StoreError> {
        Store::approval(self, plugin_id)
    }
    async fn approvals(&self) -> Result<Vec<Approval>, StoreError> {
        Store::approvals(self)
    }
    async fn revoke(&self, plugin_id: &str) -> Result<bool, StoreError> {
        Store::revoke(self, plugin_id)
    }
    async fn update_catalog(
        &self,
        plugin_id: &str,
        digest: &str,
        catalog: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        Store::update_catalog(self, plugin_id, digest, catalog)
    }
    async fn mark_failed(&self, plugin_id: &str, reason: &str) -> Result<(), StoreError> {
        Store::mark_failed(self, plugin_id, reason)
    }
    async fn failure(&self, plugin_id: &str) -> Result<Option<Failure>, StoreError> {
        Store::failure(self, plugin_id)
    }
    async fn clear_failure(&self, plugin_id: &str) -> Result<bool, StoreError> {
        Store::clear_failure(self, plugin_id)
    }
}

#[async_trait]
impl ToolStateStore for Store {
    async fn tool_disable(
        &self,
        plugin_id: &str,
        tool: &str,
        by: &str,
    ) -> Result<bool, StoreError> {
        Store::tool_disable(self, plugin_id, tool, by)
    }
    async fn tool_enable(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError> {
        Store::tool_enable(self, plugin_id, tool)
    }
    async fn disabled_tools(&self) -> Result<Vec<DisabledTool>, StoreError> {
        Store::disabled_tools(self)
    }
    async fn tool_disabled(&self, plugin_id: &str, tool: &str) -> Result<bool, StoreError> {
        Store::tool_disabled(self, plugin_id, tool)
    }
    async fn call_approval_request(&self, a: &NewCallApproval) -> Result<CallApproval, StoreError> {
        Store::call_approval_request(self, a)
    }
    async fn call_approval(&self, id: &str) -> Result<Option<CallApproval>, StoreError> {
        Store::call_approval(self, id)
    }
    async fn call_approvals_pending(&self) -> Result<Vec<CallApproval>, StoreError> {
        Store::call_approvals_pending(self)
    }
    async fn call_approval_decide(
        &self,
        id: &str,
        state: ApprovalState,
        by: &str,
        reason: Option<&str>,
    ) -> Result<Decide, StoreError> {
        Store::call_approval_decide(self, id, state, by, reason)
    }
}

#[async_trait]
impl TokenStore for Store {
    async fn token_create(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
    ) -> Result<NewToken, StoreError> {
        Store::token_create(self, name, role, expires_at_ms, created_by)
    }
    async fn token_create_limited(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
    ) -> Result<NewToken, StoreError> {
        Store::token_create_limited(self, name, role, expires_at_ms, created_by, mcp_profiles)
    }
    async fn token_create_scoped(
        &self,
        name: &str,
        role: Role,
        expires_at_ms: Option<i64>,
        created_by: &str,
        mcp_profiles: Option<&[String]>,
        tenancy: Option<&Tenancy>,
    ) -> Result<NewToken, StoreError> {
        Store::token_create_scoped(
            self,
            name,
            role,
            expires_at_ms,
            created_by,
            mcp_profiles,
            tenancy,
        )
    }
    async fn token_list(&self) -> Result<Vec<TokenInfo>, StoreError> {
        Store::token_list(self)
    }
    async fn token_revoke(&self, id_or_name: &str) -> Result<Option<TokenInfo>, StoreError> {
        Store::token_revoke(self, id_or_name)
    }
    async fn token_verify(
        &self,
        token: &str,
    ) -> Result<Result<TokenInfo, TokenRejection>, StoreError> {
        Store::token_verify(self, token)
    }
    async fn token_live(&self, id: &str) -> Result<Result<TokenInfo, TokenRejection>, StoreError> {
        Store::token_live(self, id)
    }
}

#[async_trait]
impl AuditStore for Store {
    async fn audit_record(
        &self,
        identity: &str,
        role: Role,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(), StoreError> {
        Store::audit_record(self, identity, role, method, path, status)
    }
    async fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        Store::audit_list(self, limit)
    }
    async fn audit_page(&self, filter: &AuditFilter) -> Result<AuditPage, StoreError> {
        Store::audit_page(self, filter)
    }
    fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16) {
        Store::journal_audit(self, identity, role, method, path, status)
    }
    fn journal_invocation(&self, record: Box<plugd_control::invocations::InvocationRecord>) {
        Store::journal_invocation(self, record)
    }
    fn flush_journal(&self) {
        Store::flush_journal(self)
    }
    fn journal_unwritten(&self) -> (u64, u64) {
        Store::journal_unwritten(self)
    }
}

#[async_trait]
impl ConfigStore for Store {
    async fn config_set_plain(
        &self,
        plugin: &str,
        key: &str,
        value: &Value,
    ) -> Result<(), StoreError> {
        Store::config_set_plain(self, plugin, key, value)
    }
    async fn put_sealed(&self, plugin: &str, key: &str, sealed: &Sealed) -> Result<(), StoreError> {
        Store::put_sealed(self, plugin, key, sealed)
    }
    async fn config_write_all(
        &self,
        plugin: &str,
        writes: &[(String, ConfigWrite)],
    ) -> Result<(), StoreError> {
        Store::config_write_all(self, plugin, writes)
    }
    async fn config_unset(&self, plugin: &str, key: &str) -> Result<bool, StoreError> {
        Store::config_unset(self, plugin, key)
    }
    async fn config_values(&self, plugin: &str) -> Result<Vec<(String, StoredValue)>, StoreError> {
        Store::config_values(self, plugin)
    }
    async fn config_value(
        &self,
        plugin: &str,
        key: &str,
    ) -> Result<Option<StoredValue>, StoreError> {
        Store::config_value(self, plugin, key)
    }
    async fn reseal_secrets(
        &self,
        old_key_id: &str,
        new_key_id: &str,
        reseal: &Reseal<'_>,
    ) -> Result<Rotation, StoreError> {
        Store::reseal_secrets(self, old_key_id, new_key_id, reseal)
    }
    async fn secret_key_ids(&self) -> Result<Vec<String>, StoreError> {
        Store::secret_key_ids(self)
    }
    async fn org_secret_names(&self, org_id: &str) -> Result<Vec<String>, StoreError> {
        Store::org_secret_names(self, org_id)
    }
    async fn org_secret_set(
        &self,
        org_id: &str,
        name: &str,
        value: &str,
    ) -> Result<(), StoreError> {
        Store::org_secret_set(self, org_id, name, value)
    }
    async fn org_secret_delete(&self, org_id: &str, name: &str) -> Result<bool, StoreError> {
        Store::org_secret_delete(self, org_id, name)
    }
    async fn org_secret_exists(&self, org_id: &str, name: &str) -> Result<bool, StoreError> {
        Store::org_secret_exists(self, org_id, name)
    }
}

#[async_trait]
impl OutboxStore for Store {
    async fn outbox_enqueue(
        &self,
        event: &NewEvent,
        subscribers: &[Subscriber],
    ) -> Result<Enqueued, StoreError> {
        Store::outbox_enqueue(self, event, subscribers)
    }
    async fn outbox_lease(
        &self,
        worker: &str,
        lease: Duration,
        limit: usize,
        max_attempts: u32,
    ) -> Result<Vec<Leased>, StoreError> {
        Store::outbox_lease(self, worker, lease, limit, max_attempts)
    }
    async fn outbox_renew(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        Store::outbox_renew(self, id, worker, attempt, lease)
    }
    async fn outbox_ack(&self, id: i64) -> Result<bool, StoreError> {
        Store::outbox_ack(self, id)
    }
    async fn outbox_fail(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
        error: &str,
        retryable: bool,
        policy: &RetryPolicy,
    ) -> Result<FailOutcome, StoreError> {
        Store::outbox_fail(self, id, worker, attempt, error, retryable, policy)
    }
    async fn outbox_release(
        &self,
        id: i64,
        worker: &str,
        attempt: u32,
    ) -> Result<bool, StoreError> {
        Store::outbox_release(self, id, worker, attempt)
    }
    async fn outbox_list(
        &self,
        status: Option<DeliveryStatus>,
    ) -> Result<Vec<Delivery>, StoreError> {
        Store::outbox_list(self, status)
    }
    async fn outbox_events(&self, event_type: &str) -> Result<Vec<Value>, StoreError> {
        Store::outbox_events(self, event_type)
    }
    async fn outbox_delivery(&self, key: &str) -> Result<Option<Leased>, StoreError> {
        Store::outbox_delivery(self, key)
    }
    async fn outbox_retry(&self, key: &str) -> Result<RetryOutcome, StoreError> {
        Store::outbox_retry(self, key)
    }
    async fn outbox_next_due_in(&self) -> Result<Option<Duration>, StoreError> {
        Store::outbox_next_due_in(self)
    }
}

#[async_trait]
impl TranscriptStore for Store {
    async fn session_get(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        Store::session_get(self, id)
    }
    async fn session_ensure(&self, id: &str) -> Result<(SessionRow, bool), StoreError> {
        Store::session_ensure(self, id)
    }
    async fn session_append(&self, id: &str, entries: &[Value]) -> Result<(), StoreError> {
        Store::session_append(self, id, entries)
    }
    async fn session_list(&self, limit: usize) -> Result<Vec<SessionRow>, StoreError> {
        Store::session_list(self, limit)
    }
    async fn session_tail(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<(usize, Vec<Value>), StoreError> {
        Store::session_tail(self, id, limit)
    }
    async fn session_transcript(&self, id: &str) -> Result<Vec<Value>, StoreError> {
        Store::session_transcript(self, id)
    }
    async fn session_head(&self, id: &str) -> Result<String, StoreError> {
        Store::session_head(self, id)
    }
}

#[async_trait]
impl MemoryStore for Store {
    async fn memory_add(
        &self,
        agent_id: &str,
        content: &str,
        tags: &[String],
    ) -> Result<MemoryEntry, StoreError> {
        Store::memory_add(self, agent_id, content, tags)
    }
    async fn memory_search(
        &self,
        agent_id: &str,
        query: &str,
        limit: Option<usize>,
    ) -> Result<Vec<MemoryEntry>, StoreError> {
        Store::memory_search(self, agent_id, query, limit)
    }
    async fn memory_list(
        &self,
        agent_id: &str,
        limit: usize,
    ) -> Result<Vec<MemoryEntry>, StoreError> {
        Store::memory_list(self, agent_id, limit)
    }
    async fn memory_get(&self, id: &str) -> Result<Option<MemoryEntry>, StoreError> {
        Store::memory_get(self, id)
    }
    async fn memory_delete(&self, id: &str) -> Result<bool, StoreError> {
        Store::memory_delete(self, id)
    }
}

#[async_trait]
impl VectorStore for Store {
    async fn vector_upsert(
        &self,
        collection: &str,
        records: &[VectorRecord],
    ) -> Result<usize, VectorStoreError> {
        Store::vector_upsert(self, collection, records)
    }
    async fn vector_search(
        &self,
        collection: &str,
        embedding: &[f32],
        limit: usize,
        filter: Option<&Value>,
    ) -> Result<Vec<VectorMatch>, VectorStoreError> {
        Store::vector_search(self, collection, embedding, limit, filter)
    }
    async fn vector_delete(
        &self,
        collection: &str,
        ids: &[String],
    ) -> Result<usize, VectorStoreError> {
        Store::vector_delete(self, collection, ids)
    }
}

#[async_trait]
impl KvStore for Store {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Value>, StoreError> {
        Store::kv_get(self, space, key)
    }
    async fn kv_set(&self, space: &str, key: &str, value: &Value) -> Result<(), StoreError> {
        Store::kv_set(self, space, key, value)
    }
    async fn kv_delete(&self, space: &str, key: &str) -> Result<bool, StoreError> {
        Store::kv_delete(self, space, key)
    }
    async fn kv_list(&self, space: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        Store::kv_list(self, space, prefix)
    }
}

#[async_trait]
impl PackageStore for Store {
    async fn insert_package(&self, p: &Package) -> Result<Inserted, StoreError> {
        Store::insert_package(self, p)
    }
    async fn package(&self, digest: &Digest) -> Result<Option<Package>, StoreError> {
        Store::package(self, digest)
    }
    async fn package_versions(&self, package_id: &str) -> Result<Vec<Package>, StoreError> {
        Store::package_versions(self, package_id)
    }
    async fn packages(&self) -> Result<Vec<Package>, StoreError> {
        Store::packages(self)
    }
}

#[async_trait]
impl BindingStore for Store {
    async fn insert_binding(&self, b: &Binding) -> Result<(), StoreError> {
        Store::insert_binding(self, b)
    }
    async fn binding(&self, binding_id: &str) -> Result<Option<Binding>, StoreError> {
        Store::binding(self, binding_id)
    }
    async fn bindings(&self, filter: &BindingFilter) -> Result<Vec<Binding>, StoreError> {
        Store::bindings(self, filter)
    }
    async fn update_binding(&self, b: &Binding) -> Result<bool, StoreError> {
        Store::update_binding(self, b)
    }
}

#[async_trait]
impl InvocationStore for Store {
    async fn append_invocations(&self, batch: &[InvocationRecord]) -> Result<(), StoreError> {
        Store::append_invocations(self, batch)
    }
    async fn invocation(
        &self,
        invocation_id: &str,
    ) -> Result<Option<InvocationRecord>, StoreError> {
        Store::invocation(self, invocation_id)
    }
    async fn list_invocations(
        &self,
        filter: &InvocationFilter,
    ) -> Result<InvocationPage, StoreError> {
        Store::list_invocations(self, filter)
    }
    async fn invocation_points(
        &self,
        filter: &InvocationFilter,
        max: usize,
    ) -> Result<Vec<InvocationPoint>, StoreError> {
        Store::invocation_points(self, filter, max)
    }
    async fn delete_invocations_before(&self, before_ms: i64) -> Result<u64, StoreError> {
        Store::delete_invocations_before(self, before_ms)
    }
}

#[async_trait]
impl ChainStore for Store {
    async fn session_open(
        &self,
        id: &str,
        org: Option<&str>,
        project: Option<&str>,
    ) -> Result<(SessionInfo, bool), StoreError> {
        Store::session_open(self, id, org, project)
    }
    async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, StoreError> {
        Store::session_info(self, id)
    }
    async fn sessions(
        &self,
        scope: &ScopeFilter,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        Store::sessions(self, scope, limit, before)
    }
    async fn session_chains(&self, id: &str) -> Result<Vec<Chain>, StoreError> {
        Store::session_chains(self, id)
    }
    async fn chain(&self, id: &str) -> Result<Option<Chain>, StoreError> {
        Store::chain(self, id)
    }
    async fn chain_blocks(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Block>, StoreError> {
        Store::chain_blocks(self, id, after, limit)
    }
    async fn chain_append(
        &self,
        id: &str,
        blocks: &[NewBlock],
        by: &str,
    ) -> Result<Vec<u64>, StoreError> {
        Store::chain_append(self, id, blocks, by)
    }
    async fn chain_derive(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
    ) -> Result<Chain, StoreError> {
        Store::chain_derive(self, source, seed, compaction)
    }
    async fn compaction_failed(&self, compaction: &Compaction) -> Result<(), StoreError> {
        Store::compaction_failed(self, compaction)
    }
    async fn compactions(&self, session: &str) -> Result<Vec<Compaction>, StoreError> {
        Store::compactions(self, session)
    }
    async fn run_create(&self, run: &Run) -> Result<(), StoreError> {
        Store::run_create(self, run)
    }
    async fn run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        Store::run(self, id)
    }
    async fn run_update(&self, id: &str, patch: &RunPatch) -> Result<Option<Run>, StoreError> {
        Store::run_update(self, id, patch)
    }
    async fn runs(
        &self,
        scope: &ScopeFilter,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        Store::runs(self, scope, session, limit)
    }
    async fn child_runs(&self, parent: &str) -> Result<u64, StoreError> {
        Store::child_runs(self, parent)
    }
    async fn chain_derive_reporting(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
        report: &Reporter<'_, Chain>,
        subscribers: &[Subscriber],
    ) -> Result<(Chain, Enqueued), StoreError> {
        let (chain, queued) = Store::chain_derive_reporting(
            self,
            source,
            seed,
            compaction,
            Some((report, subscribers)),
        )?;
        let queued = queued.ok_or_else(|| StoreError::NotFound {
            what: "the event of the derived chain".to_owned(),
        })?;
        Ok((chain, queued))
    }
    async fn run_finish(
        &self,
        id: &str,
        patch: &RunPatch,
        report: &Reporter<'_, Run>,
        subscribers: &[Subscriber],
    ) -> Result<Option<(Run, Enqueued)>, StoreError> {
        Ok(
            match Store::run_finish(self, id, patch, Some((report, subscribers)))? {
                (Some(run), Some(queued)) => Some((run, queued)),
                _ => None,
            },
        )
    }
}

#[async_trait]
impl LiveSessionStore for Store {
    async fn live_session_put(
        &self,
        kind: LiveKind,
        id: &str,
        owner: &str,
        profile: Option<&str>,
        data: &Value,
    ) -> Result<(), StoreError> {
        Store::live_session_put(self, kind, id, owner, profile, data)
    }
    async fn live_session_get(
        &self,
        kind: LiveKind,
        id: &str,
        life: Lifetime,
    ) -> Result<Option<LiveSession>, StoreError> {
        Store::live_session_get(self, kind, id, life)
    }
    async fn live_session_touch(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError> {
        Store::live_session_touch(self, kind, id)
    }
    async fn live_session_delete(&self, kind: LiveKind, id: &str) -> Result<bool, StoreError> {
        Store::live_session_delete(self, kind, id)
    }
    async fn live_sessions_sweep(&self, kind: LiveKind, life: Lifetime) -> Result<u64, StoreError> {
        Store::live_sessions_sweep(self, kind, life)
    }
    async fn live_sessions_trim(&self, kind: LiveKind, keep: u64) -> Result<u64, StoreError> {
        Store::live_sessions_trim(self, kind, keep)
    }
    async fn live_sessions_held(
        &self,
        kind: LiveKind,
        owner: &str,
        life: Lifetime,
    ) -> Result<u64, StoreError> {
        Store::live_sessions_held(self, kind, owner, life)
    }
    async fn login_code_put(
        &self,
        code: &str,
        name: &str,
        lifetime_ms: i64,
    ) -> Result<(), StoreError> {
        Store::login_code_put(self, code, name, lifetime_ms)
    }
    async fn login_code_redeem(&self, code: &str) -> Result<Option<String>, StoreError> {
        Store::login_code_redeem(self, code)
    }
}

#[async_trait]
impl LeaseStore for Store {
    async fn lease_acquire(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        Store::lease_acquire(self, name, holder, ttl_ms)
    }
    async fn lease_release(&self, fence: &Fence) -> Result<bool, StoreError> {
        Store::lease_release(self, fence)
    }
    async fn lease_holder(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        Store::lease_holder(self, name)
    }
    async fn leases_held(&self) -> Result<Vec<Lease>, StoreError> {
        Store::leases_held(self)
    }
    async fn delete_invocations_before_fenced(
        &self,
        before_ms: i64,
        fence: &Fence,
    ) -> Result<u64, StoreError> {
        Store::delete_invocations_before_fenced(self, before_ms, fence)
    }
}

#[async_trait]
impl LimitStore for Store {
    async fn limit_take(
        &self,
        rule: &str,
        key: &str,
        bucket: limits::Bucket,
        now_ms: i64,
    ) -> Result<limits::Take, StoreError> {
        Store::limit_take(self, rule, key, bucket, now_ms)
    }
    async fn limit_refund(
        &self,
        rule: &str,
        key: &str,
        bucket: limits::Bucket,
    ) -> Result<(), StoreError> {
        Store::limit_refund(self, rule, key, bucket)
    }
    async fn limit_expire(&self, now_ms: i64) -> Result<u64, StoreError> {
        Store::limit_expire(self, now_ms)
    }
}

#[async_trait]
impl ToolPinStore for Store {
    async fn tool_pins(&self, plugin_id: &str) -> Result<Option<tool_pins::ToolPins>, StoreError> {
        Store::tool_pins(self, plugin_id)
    }
    async fn pin_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        add: &std::collections::BTreeMap<String, tool_pins::PinnedTool>,
    ) -> Result<Option<tool_pins::ToolPins>, StoreError> {
        Store::pin_tools(self, plugin_id, digest, add)
    }
    async fn set_withheld_tools(
        &self,
        plugin_id: &str,
        digest: &str,
        withheld: &[tool_pins::WithheldTool],
    ) -> Result<bool, StoreError> {
        Store::set_withheld_tools(self, plugin_id, digest, withheld)
    }
}

#[async_trait]
impl ControlEpoch for Store {
    async fn control_epoch(&self) -> Result<i64, StoreError> {
        Store::control_epoch(self)
    }
}

#[async_trait]
impl plugd_control::store::NodeStore for Store {
    async fn node_beat(&self, n: &plugd_control::store::NodeRecord) -> Result<(), StoreError> {
        Store::node_beat(self, n)
    }
    async fn nodes_live(
        &self,
        live_ms: i64,
    ) -> Result<Vec<plugd_control::store::NodeRecord>, StoreError> {
        Store::nodes_live(self, live_ms)
    }
    async fn node_leave(&self, id: &str) -> Result<(), StoreError> {
        Store::node_leave(self, id)
    }
}

impl StateStore for Store {
    fn describe(&self) -> String {
        self.label().to_owned()
    }
    fn schema_version(&self) -> i64 {
        crate::SCHEMA_VERSION
    }
}
