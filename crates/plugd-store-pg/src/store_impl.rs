//! `plugd_control::store`'s traits for [`PgStore`]: each method is the
//! domain module's async method of the same name, its [`PgError`] turned
//! into the neutral [`StoreError`].

use std::path::PathBuf;
use std::time::Duration;

use plugd_control::bindings::{Binding, BindingFilter};
use plugd_control::chains::{
    Block, Chain, Compaction, NewBlock, Run, RunPatch, ScopeFilter, SessionInfo,
};
use plugd_control::invocations::{
    InvocationFilter, InvocationPage, InvocationPoint, InvocationRecord,
};
use plugd_control::packages::{Digest, Inserted, Package};
use plugd_control::store::outbox::{
    Delivery, DeliveryStatus, Enqueued, FailOutcome, Leased, NewEvent, Reporter, RetryOutcome,
    RetryPolicy, Subscriber,
};
use plugd_control::store::tool_state::{
    ApprovalState, CallApproval, Decide, DisabledTool, NewCallApproval,
};
use plugd_control::store::{
    Approval, ApprovalStore, AuditEntry, AuditFilter, AuditPage, AuditStore, BackendError,
    BindingStore, ChainStore, ConfigStore, ConfigWrite, ControlEpoch, Failure, Fence,
    InvocationStore, KvStore, Lease, LeaseStore, Lifetime, LimitStore, LiveKind, LiveSession,
    LiveSessionStore, MemoryEntry, MemoryStore, NewToken, NodeRecord, NodeStore, OutboxStore,
    PackageStore, Reseal, Role, Rotation, Sealed, SessionRow, StateStore, StoreError, StoredValue,
    Tenancy, TokenInfo, TokenRejection, TokenStore, ToolPinStore, ToolStateStore, TranscriptStore,
    VectorMatch, VectorRecord, VectorStore, VectorStoreError,
};
use serde_json::Value;

use crate::{PgError, PgStore, VectorError};

impl From<PgError> for StoreError {
    fn from(e: PgError) -> StoreError {
        match e {
            PgError::Url { url, source } => StoreError::Query {
                db: url,
                action: "read the state URL".to_owned(),
                source: BackendError::new(source),
            },
            PgError::Unavailable { db, source } => StoreError::Unavailable {
                db,
                source: BackendError::new(source),
            },
            PgError::TooNew {
                db,
                found,
                supported,
            } => StoreError::TooNew {
                path: PathBuf::from(db),
                found,
                supported,
            },
            PgError::Migrate {
                db,
                version,
                source,
            } => StoreError::Migrate {
                db,
                version,
                source: BackendError::new(source),
            },
            PgError::Invalid { what, problem } => StoreError::Invalid { what, problem },
            PgError::Damaged { db, what, detail } => StoreError::Damaged { db, what, detail },
            PgError::Conflict(m) => StoreError::Conflict(m),
            PgError::NotFound { what } => StoreError::NotFound { what },
            PgError::Random(m) => StoreError::Random(m),
            PgError::Secret(e) => StoreError::Secret(e),
            PgError::Query { db, action, source } => StoreError::Query {
                db,
                action,
                source: BackendError::new(source),
            },
            // Cluster set-up and workspace export: never from a trait method.
            e @ (PgError::AlreadyInitialised { .. }
            | PgError::NotInitialised { .. }
            | PgError::KeyMismatch { .. }
            | PgError::NoKey { .. }
            | PgError::NotEmpty { .. }
            | PgError::ForeignSecret { .. }
            | PgError::ExportMismatch { .. }) => StoreError::Conflict(e.to_string()),
        }
    }
}

impl From<VectorError> for VectorStoreError {
    fn from(e: VectorError) -> VectorStoreError {
        match e {
            VectorError::CollectionNotFound { collection } => {
                VectorStoreError::CollectionNotFound { collection }
            }
            VectorError::DimensionMismatch { expected, got } => {
                VectorStoreError::DimensionMismatch { expected, got }
            }
            VectorError::Invalid(m) => VectorStoreError::Invalid(m),
            VectorError::Store(e) => VectorStoreError::Store(e.into()),
        }
    }
}

/// `impl $trait for PgStore`, each method forwarding to the inherent one.
macro_rules! forward {
    ($trait:ident { $( fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty; )* }) => {
        #[async_trait::async_trait]
        impl $trait for PgStore {
            $( async fn $name(&self $(, $arg: $ty)*) -> Result<$ret, StoreError> {
                Ok(self.bounded(stringify!($name), PgStore::$name(self $(, $arg)*)).await?)
            } )*
        }
    };
}

forward!(ApprovalStore {
    fn approve(&self, a: &Approval) -> ();
    fn approve_clearing_failure(&self, a: &Approval) -> ();
    fn revoke_exact(&self, a: &Approval) -> bool;
    fn approval(&self, plugin_id: &str) -> Option<Approval>;
    fn approvals(&self) -> Vec<Approval>;
    fn revoke(&self, plugin_id: &str) -> bool;
    fn update_catalog(&self, plugin_id: &str, digest: &str, catalog: &Value) -> bool;
    fn mark_failed(&self, plugin_id: &str, reason: &str) -> ();
    fn failure(&self, plugin_id: &str) -> Option<Failure>;
    fn clear_failure(&self, plugin_id: &str) -> bool;
});

forward!(ToolStateStore {
    fn tool_disable(&self, plugin_id: &str, tool: &str, by: &str) -> bool;
    fn tool_enable(&self, plugin_id: &str, tool: &str) -> bool;
    fn disabled_tools(&self) -> Vec<DisabledTool>;
    fn tool_disabled(&self, plugin_id: &str, tool: &str) -> bool;
    fn call_approval_request(&self, a: &NewCallApproval) -> CallApproval;
    fn call_approval(&self, id: &str) -> Option<CallApproval>;
    fn call_approvals_pending(&self) -> Vec<CallApproval>;
    fn call_approval_decide(&self, id: &str, state: ApprovalState, by: &str, reason: Option<&str>) -> Decide;
});

forward!(TokenStore {
    fn token_create(&self, name: &str, role: Role, expires_at_ms: Option<i64>, created_by: &str) -> NewToken;
    fn token_create_limited(&self, name: &str, role: Role, expires_at_ms: Option<i64>, created_by: &str, mcp_profiles: Option<&[String]>) -> NewToken;
    fn token_create_scoped(&self, name: &str, role: Role, expires_at_ms: Option<i64>, created_by: &str, mcp_profiles: Option<&[String]>, tenancy: Option<&Tenancy>) -> NewToken;
    fn token_list(&self) -> Vec<TokenInfo>;
    fn token_revoke(&self, id_or_name: &str) -> Option<TokenInfo>;
    fn token_live(&self, id: &str) -> Result<TokenInfo, TokenRejection>;
    fn token_verify(&self, token: &str) -> Result<TokenInfo, TokenRejection>;
});

#[async_trait::async_trait]
impl AuditStore for PgStore {
    async fn audit_record(
        &self,
        identity: &str,
        role: Role,
        method: &str,
        path: &str,
        status: u16,
    ) -> Result<(), StoreError> {
        Ok(PgStore::audit_record(self, identity, role, method, path, status).await?)
    }
    async fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(PgStore::audit_list(self, limit).await?)
    }
    async fn audit_page(&self, filter: &AuditFilter) -> Result<AuditPage, StoreError> {
        Ok(PgStore::audit_page(self, filter).await?)
    }
    fn journal_audit(&self, identity: &str, role: Role, method: &str, path: &str, status: u16) {
        PgStore::journal_audit(self, identity, role, method, path, status);
    }
    fn journal_invocation(&self, record: Box<InvocationRecord>) {
        PgStore::journal_invocation(self, record);
    }
    fn flush_journal(&self) {
        PgStore::flush_journal(self);
    }
    fn journal_unwritten(&self) -> (u64, u64) {
        PgStore::journal_unwritten(self)
    }
}

forward!(ConfigStore {
    fn config_set_plain(&self, plugin: &str, key: &str, value: &Value) -> ();
    fn put_sealed(&self, plugin: &str, key: &str, sealed: &Sealed) -> ();
    fn config_write_all(&self, plugin: &str, writes: &[(String, ConfigWrite)]) -> ();
    fn config_unset(&self, plugin: &str, key: &str) -> bool;
    fn config_values(&self, plugin: &str) -> Vec<(String, StoredValue)>;
    fn config_value(&self, plugin: &str, key: &str) -> Option<StoredValue>;
    fn reseal_secrets(&self, old_key_id: &str, new_key_id: &str, reseal: &Reseal<'_>) -> Rotation;
    fn secret_key_ids(&self) -> Vec<String>;
    fn org_secret_names(&self, org_id: &str) -> Vec<String>;
    fn org_secret_set(&self, org_id: &str, name: &str, value: &str) -> ();
    fn org_secret_delete(&self, org_id: &str, name: &str) -> bool;
    fn org_secret_exists(&self, org_id: &str, name: &str) -> bool;
});

forward!(KvStore {
    fn kv_get(&self, space: &str, key: &str) -> Option<Value>;
    fn kv_set(&self, space: &str, key: &str, value: &Value) -> ();
    fn kv_delete(&self, space: &str, key: &str) -> bool;
    fn kv_list(&self, space: &str, prefix: &str) -> Vec<String>;
});

forward!(OutboxStore {
    fn outbox_enqueue(&self, event: &NewEvent, subscribers: &[Subscriber]) -> Enqueued;
    fn outbox_lease(&self, worker: &str, lease: Duration, limit: usize, max_attempts: u32) -> Vec<Leased>;
    fn outbox_renew(&self, id: i64, worker: &str, attempt: u32, lease: Duration) -> bool;
    fn outbox_ack(&self, id: i64) -> bool;
    fn outbox_fail(&self, id: i64, worker: &str, attempt: u32, error: &str, retryable: bool, policy: &RetryPolicy) -> FailOutcome;
    fn outbox_release(&self, id: i64, worker: &str, attempt: u32) -> bool;
    fn outbox_list(&self, status: Option<DeliveryStatus>) -> Vec<Delivery>;
    fn outbox_events(&self, event_type: &str) -> Vec<Value>;
    fn outbox_delivery(&self, key: &str) -> Option<Leased>;
    fn outbox_retry(&self, key: &str) -> RetryOutcome;
    fn outbox_next_due_in(&self) -> Option<Duration>;
});

forward!(MemoryStore {
    fn memory_add(&self, agent_id: &str, content: &str, tags: &[String]) -> MemoryEntry;
    fn memory_search(&self, agent_id: &str, query: &str, limit: Option<usize>) -> Vec<MemoryEntry>;
    fn memory_list(&self, agent_id: &str, limit: usize) -> Vec<MemoryEntry>;
    fn memory_get(&self, id: &str) -> Option<MemoryEntry>;
    fn memory_delete(&self, id: &str) -> bool;
});

#[async_trait::async_trait]
impl VectorStore for PgStore {
    async fn vector_upsert(
        &self,
        collection: &str,
        records: &[VectorRecord],
    ) -> Result<usize, VectorStoreError> {
        Ok(PgStore::vector_upsert(self, collection, records).await?)
    }
    async fn vector_search(
        &self,
        collection: &str,
        embedding: &[f32],
        limit: usize,
        filter: Option<&Value>,
    ) -> Result<Vec<VectorMatch>, VectorStoreError> {
        Ok(PgStore::vector_search(self, collection, embedding, limit, filter).await?)
    }
    async fn vector_delete(
        &self,
        collection: &str,
        ids: &[String],
    ) -> Result<usize, VectorStoreError> {
        Ok(PgStore::vector_delete(self, collection, ids).await?)
    }
}

forward!(TranscriptStore {
    fn session_get(&self, id: &str) -> Option<SessionRow>;
    fn session_ensure(&self, id: &str) -> (SessionRow, bool);
    fn session_append(&self, id: &str, entries: &[Value]) -> ();
    fn session_list(&self, limit: usize) -> Vec<SessionRow>;
    fn session_tail(&self, id: &str, limit: usize) -> (usize, Vec<Value>);
    fn session_transcript(&self, id: &str) -> Vec<Value>;
    fn session_head(&self, id: &str) -> String;
});

forward!(PackageStore {
    fn insert_package(&self, p: &Package) -> Inserted;
    fn package(&self, digest: &Digest) -> Option<Package>;
    fn package_versions(&self, package_id: &str) -> Vec<Package>;
    fn packages(&self) -> Vec<Package>;
});

forward!(BindingStore {
    fn insert_binding(&self, b: &Binding) -> ();
    fn binding(&self, binding_id: &str) -> Option<Binding>;
    fn bindings(&self, filter: &BindingFilter) -> Vec<Binding>;
    fn update_binding(&self, b: &Binding) -> bool;
});

forward!(InvocationStore {
    fn append_invocations(&self, batch: &[InvocationRecord]) -> ();
    fn invocation(&self, invocation_id: &str) -> Option<InvocationRecord>;
    fn list_invocations(&self, filter: &InvocationFilter) -> InvocationPage;
    fn invocation_points(&self, filter: &InvocationFilter, max: usize) -> Vec<InvocationPoint>;
    fn delete_invocations_before(&self, before_ms: i64) -> u64;
});

#[async_trait::async_trait]
impl ChainStore for PgStore {
    async fn session_open(
        &self,
        id: &str,
        org: Option<&str>,
        project: Option<&str>,
    ) -> Result<(SessionInfo, bool), StoreError> {
        Ok(PgStore::session_open(self, id, org, project).await?)
    }
    async fn session_info(&self, id: &str) -> Result<Option<SessionInfo>, StoreError> {
        Ok(PgStore::session_info(self, id).await?)
    }
    async fn sessions(
        &self,
        scope: &ScopeFilter,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        Ok(PgStore::sessions(self, scope, limit, before).await?)
    }
    async fn session_chains(&self, id: &str) -> Result<Vec<Chain>, StoreError> {
        Ok(PgStore::session_chains(self, id).await?)
    }
    async fn chain(&self, id: &str) -> Result<Option<Chain>, StoreError> {
        Ok(PgStore::chain(self, id).await?)
    }
    async fn chain_blocks(
        &self,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Block>, StoreError> {
        Ok(PgStore::chain_blocks(self, id, after, limit).await?)
    }
    async fn chain_append(
        &self,
        id: &str,
        blocks: &[NewBlock],
        by: &str,
    ) -> Result<Vec<u64>, StoreError> {
        Ok(PgStore::chain_append(self, id, blocks, by).await?)
    }
    async fn chain_derive(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
    ) -> Result<Chain, StoreError> {
        Ok(PgStore::chain_derive(self, source, seed, compaction).await?)
    }
    async fn compaction_failed(&self, compaction: &Compaction) -> Result<(), StoreError> {
        Ok(PgStore::compaction_failed(self, compaction).await?)
    }
    async fn compactions(&self, session: &str) -> Result<Vec<Compaction>, StoreError> {
        Ok(PgStore::compactions(self, session).await?)
    }
    async fn run_create(&self, run: &Run) -> Result<(), StoreError> {
        Ok(PgStore::run_create(self, run).await?)
    }
    async fn run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        Ok(PgStore::run(self, id).await?)
    }
    async fn run_update(&self, id: &str, patch: &RunPatch) -> Result<Option<Run>, StoreError> {
        Ok(PgStore::run_update(self, id, patch).await?)
    }
    async fn runs(
        &self,
        scope: &ScopeFilter,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        Ok(PgStore::runs(self, scope, session, limit).await?)
    }
    async fn child_runs(&self, parent: &str) -> Result<u64, StoreError> {
        Ok(PgStore::child_runs(self, parent).await?)
    }
    async fn chain_derive_reporting(
        &self,
        source: &str,
        seed: &[NewBlock],
        compaction: &Compaction,
        report: &Reporter<'_, Chain>,
        subscribers: &[Subscriber],
    ) -> Result<(Chain, Enqueued), StoreError> {
        match PgStore::chain_derive_reporting(
            self,
            source,
            seed,
            compaction,
            Some((report, subscribers)),
        )
        .await?
        {
            (chain, Some(queued)) => Ok((chain, queued)),
            (chain, None) => Err(StoreError::NotFound {
                what: format!("the event of chain {:?}", chain.id),
            }),
        }
    }
    async fn run_finish(
        &self,
        id: &str,
        patch: &RunPatch,
        report: &Reporter<'_, Run>,
        subscribers: &[Subscriber],
    ) -> Result<Option<(Run, Enqueued)>, StoreError> {
        Ok(
            PgStore::run_finish(self, id, patch, Some((report, subscribers)))
                .await?
                .and_then(|(run, queued)| queued.map(|q| (run, q))),
        )
    }
}

forward!(LiveSessionStore {
    fn live_session_put(&self, kind: LiveKind, id: &str, owner: &str, profile: Option<&str>, data: &Value) -> ();
    fn live_session_get(&self, kind: LiveKind, id: &str, life: Lifetime) -> Option<LiveSession>;
    fn live_session_touch(&self, kind: LiveKind, id: &str) -> bool;
    fn live_session_delete(&self, kind: LiveKind, id: &str) -> bool;
    fn live_sessions_sweep(&self, kind: LiveKind, life: Lifetime) -> u64;
    fn live_sessions_trim(&self, kind: LiveKind, keep: u64) -> u64;
    fn live_sessions_held(&self, kind: LiveKind, owner: &str, life: Lifetime) -> u64;
    fn login_code_put(&self, code: &str, name: &str, lifetime_ms: i64) -> ();
    fn login_code_redeem(&self, code: &str) -> Option<String>;
});

forward!(LeaseStore {
    fn lease_acquire(&self, name: &str, holder: &str, ttl_ms: i64) -> Option<Lease>;
    fn lease_release(&self, fence: &Fence) -> bool;
    fn lease_holder(&self, name: &str) -> Option<Lease>;
    fn leases_held(&self) -> Vec<Lease>;
    fn delete_invocations_before_fenced(&self, before_ms: i64, fence: &Fence) -> u64;
});

forward!(LimitStore {
    fn limit_take(&self, rule: &str, key: &str, bucket: plugd_control::store::limits::Bucket, now_ms: i64) -> plugd_control::store::limits::Take;
    fn limit_refund(&self, rule: &str, key: &str, bucket: plugd_control::store::limits::Bucket) -> ();
    fn limit_expire(&self, now_ms: i64) -> u64;
});

forward!(ToolPinStore {
    fn tool_pins(&self, plugin_id: &str) -> Option<plugd_control::store::tool_pins::ToolPins>;
    fn pin_tools(&self, plugin_id: &str, digest: &str, add: &std::collections::BTreeMap<String, plugd_control::store::tool_pins::PinnedTool>) -> Option<plugd_control::store::tool_pins::ToolPins>;
    fn set_withheld_tools(&self, plugin_id: &str, digest: &str, withheld: &[plugd_control::store::tool_pins::WithheldTool]) -> bool;
});

#[async_trait::async_trait]
impl ControlEpoch for PgStore {
    async fn control_epoch(&self) -> Result<i64, StoreError> {
        Ok(self
            .bounded("control_epoch", PgStore::control_epoch(self))
            .await?)
    }

    async fn control_epoch_within(&self, max_age: std::time::Duration) -> Result<i64, StoreError> {
        Ok(self
            .bounded("control_epoch", PgStore::epoch_within(self, max_age))
            .await?
            .0)
    }
}

forward!(NodeStore {
    fn node_beat(&self, n: &NodeRecord) -> ();
    fn nodes_live(&self, live_ms: i64) -> Vec<NodeRecord>;
    fn node_leave(&self, id: &str) -> ();
});

impl StateStore for PgStore {
    fn describe(&self) -> String {
        self.label().to_owned()
    }
    fn schema_version(&self) -> i64 {
        crate::SCHEMA_VERSION
    }
}
