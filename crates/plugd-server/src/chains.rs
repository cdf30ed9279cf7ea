//! The canonical session, chain, run and compaction API (seed 003): what a
//! harness acts through with its delegated token, and what operators and
//! the CLI read.
//!
//! | route | delegated scope | role |
//! |---|---|---|
//! | `GET /v1/sessions`, `GET /v1/sessions/{id}` | `sessions:read` | viewer |
//! | `GET /v1/sessions/{id}/compactions` | `sessions:read` | viewer |
//! | `GET /v1/chains/{id}[/blocks]?after=N&limit=N` | `chains:read` | viewer |
//! | `POST /v1/chains/{id}/blocks` | `chains:write` | agent |
//! | `GET /v1/runs?session_id=S`, `GET /v1/runs/{id}` | `runs:read` | viewer |
//! | `POST /v1/runs` | `runs:write` | agent |
//! | `PATCH /v1/runs/{id}` | `runs:write` | agent |
//! | `POST /v1/compactions` | `compactions:write` | agent |
//! | `GET /v1/compactions/jobs/{id}` | `sessions:read` | viewer |
//!
//! Scope: a token bound to an org sees its org's (and projects')
//! sessions only; a delegation token sees its invocation's org and project
//! (a workspace invocation: the workspace's sessions, no org's). A record
//! out of scope answers 404, as if it did not exist. A delegation token's
//! runs hang below its own run (`parent_run_id`), within its run policy's
//! `max_depth` and `max_child_runs`; it may update its own run and its
//! children only.
//!
//! A delegation token is also bound to its invocation: it reads its own
//! session only (its chains, compactions and runs; the lists show nothing
//! else), appends to its invocation's chain only, and starts, updates and
//! compacts within that session only. Anything else answers `403`, whether
//! it exists or not (no existence oracle); a token minted without a session
//! reaches no session at all.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use plugd_control::chains::{
    MAX_APPEND_BLOCKS, NewBlock, Run, RunKind, RunPatch, RunStatus, ScopeFilter, SessionInfo,
    fresh_id,
};
use plugd_runtime::runs::{HarnessStart, RunError, RunPolicy};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Identity;
use crate::error::code;
use crate::packages::store_error;
use crate::{ApiError, AppState, JsonBody};

/// Most records one list returns.
const MAX_LIMIT: usize = 500;

/// The sessions `who` may see.
pub(crate) fn scope_of(who: &Identity) -> ScopeFilter {
    if let Some(d) = &who.delegation {
        return ScopeFilter {
            org_id: d.org_id.clone(),
            project_ids: d.project_id.iter().cloned().collect(),
            workspace_only: d.org_id.is_none(),
        };
    }
    match &who.tenant {
        Some(t) => ScopeFilter {
            org_id: Some(t.org_id.clone()),
            project_ids: t.project_ids.clone(),
            workspace_only: false,
        },
        None => ScopeFilter::default(),
    }
}

/// `403` unless `session_id` is the session of `who`'s delegation (every
/// other identity passes: its scope is [`scope_of`]'s).
fn bound_session(who: &Identity, session_id: &str, what: &str) -> Result<(), ApiError> {
    let Some(d) = &who.delegation else {
        return Ok(());
    };
    if d.session_id.as_deref() == Some(session_id) {
        return Ok(());
    }
    Err(outside(d, what))
}

/// The `403` of a delegation token reaching past its invocation.
fn outside(d: &plugd_control::delegation::Delegation, what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        code::FORBIDDEN,
        format!(
            "{what} is outside the invocation this delegation token of {} was minted for (session {}, chain {}, run {}); a delegation token reaches its own invocation's session, chain and run only",
            d.export,
            d.session_id.as_deref().unwrap_or("none"),
            d.chain_id.as_deref().unwrap_or("none"),
            d.run_id.as_deref().unwrap_or("none"),
        ),
    )
}

/// For a delegation token, the chain `id` when it belongs to its session
/// (`403` otherwise, or when it does not exist); for anyone else, nothing
/// to check here.
async fn bound_chain(state: &AppState, who: &Identity, id: &str) -> Result<(), ApiError> {
    let Some(d) = &who.delegation else {
        return Ok(());
    };
    let what = format!("chain {id:?}");
    let chain = state.runtime.state().chain(id).await.map_err(store_error)?;
    match chain {
        Some(c) if d.session_id.as_deref() == Some(c.session_id.as_str()) => Ok(()),
        _ => Err(outside(d, &what)),
    }
}

/// For a delegation token, the run `id` when it belongs to its session.
async fn bound_run(state: &AppState, who: &Identity, id: &str) -> Result<(), ApiError> {
    let Some(d) = &who.delegation else {
        return Ok(());
    };
    let what = format!("run {id:?}");
    let run = state.runtime.state().run(id).await.map_err(store_error)?;
    match run {
        Some(r) if d.session_id.as_deref() == Some(r.session_id.as_str()) => Ok(()),
        _ => Err(outside(d, &what)),
    }
}

fn not_found(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        code::NOT_FOUND,
        format!("{what} does not exist (or is not in your scope)"),
    )
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code::INVALID_BODY, message)
}

/// `key=value` pairs of a query string (ids and numbers only: no
/// percent-decoding needed).
fn query(q: Option<&str>) -> Vec<(&str, &str)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect()
}

fn number(q: &[(&str, &str)], key: &str, default: usize) -> Result<usize, ApiError> {
    match q.iter().find(|(k, _)| *k == key) {
        None => Ok(default),
        Some((_, v)) => v
            .parse::<usize>()
            .map_err(|_| bad(format!("query parameter {key}={v:?} is not a number"))),
    }
}

fn param<'a>(q: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// The session `id` when `who` may see it.
async fn visible_session(
    state: &AppState,
    who: &Identity,
    id: &str,
) -> Result<SessionInfo, ApiError> {
    if !plugd_store::sessions::valid_session_id(id) {
        return Err(not_found(&format!("session {id:?}")));
    }
    let info = state
        .runtime
        .state()
        .session_info(id)
        .await
        .map_err(store_error)?;
    info.filter(|s| scope_of(who).sees(s.org_id.as_deref(), s.project_id.as_deref()))
        .ok_or_else(|| not_found(&format!("session {id:?}")))
}

/// The chain `id` and its session when `who` may see them.
async fn visible_chain(
    state: &AppState,
    who: &Identity,
    id: &str,
) -> Result<(plugd_control::chains::Chain, SessionInfo), ApiError> {
    let chain = state
        .runtime
        .state()
        .chain(id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| not_found(&format!("chain {id:?}")))?;
    let session = visible_session(state, who, &chain.session_id)
        .await
        .map_err(|_| not_found(&format!("chain {id:?}")))?;
    Ok((chain, session))
}

/// The run `id` when `who` may see it.
async fn visible_run(state: &AppState, who: &Identity, id: &str) -> Result<Run, ApiError> {
    let run = state
        .runtime
        .state()
        .run(id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| not_found(&format!("run {id:?}")))?;
    visible_session(state, who, &run.session_id)
        .await
        .map_err(|_| not_found(&format!("run {id:?}")))?;
    Ok(run)
}

/// `GET /v1/sessions?limit=N&before=ID`.
pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = query(q.as_deref());
    let limit = number(&q, "limit", 100)?.clamp(1, MAX_LIMIT);
    let list = state
        .runtime
        .state()
        .sessions(&scope_of(&who), limit, param(&q, "before"))
        .await
        .map_err(store_error)?;
    // A delegation token lists its own session only.
    let list = match &who.delegation {
        Some(d) => list
            .into_iter()
            .filter(|s| d.session_id.as_deref() == Some(s.id.as_str()))
            .collect(),
        None => list,
    };
    Ok(Json(json!({"sessions": list})).into_response())
}

/// `GET /v1/sessions/{id}`: the session, its chains (lineage), and its
/// transcript (the head chain read as the agent's entries).
pub(crate) async fn get_session(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    bound_session(&who, &id, &format!("session {id:?}"))?;
    let info = visible_session(&state, &who, &id)
        .await
        .map_err(|_| ApiError::unknown_session(&id))?;
    let store = state.runtime.state();
    let chains = store.session_chains(&id).await.map_err(store_error)?;
    let transcript = store.session_transcript(&id).await.map_err(store_error)?;
    let mut body = serde_json::to_value(&info).unwrap_or_default();
    body["chains"] = json!(chains);
    body["transcript"] = json!(transcript);
    Ok(Json(body).into_response())
}

/// `GET /v1/sessions/{id}/compactions`.
pub(crate) async fn list_compactions(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    bound_session(&who, &id, &format!("session {id:?}"))?;
    visible_session(&state, &who, &id).await?;
    let list = state
        .runtime
        .state()
        .compactions(&id)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"compactions": list})).into_response())
}

/// `GET /v1/chains/{id}?after=N&limit=N`: the chain and its blocks.
pub(crate) async fn get_chain(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    bound_chain(&state, &who, &id).await?;
    let (chain, _) = visible_chain(&state, &who, &id).await?;
    let q = query(q.as_deref());
    let after = number(&q, "after", 0)? as u64;
    let limit = number(&q, "limit", 1000)?.clamp(1, 10_000);
    let blocks = state
        .runtime
        .state()
        .chain_blocks(&id, after, limit)
        .await
        .map_err(store_error)?;
    let mut body = serde_json::to_value(&chain).unwrap_or_default();
    body["blocks"] = json!(blocks);
    Ok(Json(body).into_response())
}

/// `POST /v1/chains/{id}/blocks` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppendRequest {
    blocks: Vec<Value>,
}

/// `POST /v1/chains/{id}/blocks`: appends blocks; their seqs.
pub(crate) async fn append_blocks(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<AppendRequest>,
) -> Result<Response, ApiError> {
    // A delegation token writes to its invocation's chain only.
    if let Some(d) = &who.delegation
        && d.chain_id.as_deref() != Some(id.as_str())
    {
        return Err(outside(d, &format!("chain {id:?}")));
    }
    bound_chain(&state, &who, &id).await?;
    visible_chain(&state, &who, &id).await?;
    if req.blocks.is_empty() || req.blocks.len() > MAX_APPEND_BLOCKS {
        return Err(bad(format!(
            "send 1 to {MAX_APPEND_BLOCKS} blocks; got {}",
            req.blocks.len()
        )));
    }
    let blocks = req
        .blocks
        .iter()
        .enumerate()
        .map(|(i, b)| NewBlock::from_json(i, b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    let seqs = state
        .runtime
        .state()
        .chain_append(&id, &blocks, who.by())
        .await
        .map_err(|e| match e {
            plugd_store::StoreError::Invalid { .. } => {
                ApiError::new(StatusCode::CONFLICT, code::CONFLICT, e.to_string())
            }
            e => store_error(e),
        })?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"chain_id": id, "seqs": seqs})),
    )
        .into_response())
}

/// `GET /v1/runs?session_id=S&limit=N`.
pub(crate) async fn list_runs(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let q = query(q.as_deref());
    let limit = number(&q, "limit", 100)?.clamp(1, MAX_LIMIT);
    // A delegation token lists its own session's runs only.
    let session = match &who.delegation {
        Some(d) => {
            let own = d.session_id.as_deref();
            match param(&q, "session_id") {
                Some(s) if Some(s) != own => {
                    return Err(outside(d, &format!("session {s:?}")));
                }
                _ => Some(own.ok_or_else(|| outside(d, "every session"))?),
            }
        }
        None => param(&q, "session_id"),
    };
    let list = state
        .runtime
        .state()
        .runs(&scope_of(&who), session, limit)
        .await
        .map_err(store_error)?;
    Ok(Json(json!({"runs": list})).into_response())
}

/// `GET /v1/runs/{id}`.
pub(crate) async fn get_run(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    bound_run(&state, &who, &id).await?;
    Ok(Json(visible_run(&state, &who, &id).await?).into_response())
}

/// `POST /v1/runs` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRun {
    session_id: String,
    /// `PACKAGE/EXPORT` of a harness to run; without it the run is a
    /// record the caller keeps up to date with `PATCH`.
    #[serde(default)]
    harness: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    policy: Option<RunPolicy>,
    #[serde(default)]
    parent_run_id: Option<String>,
    /// Free-form description of an external run.
    #[serde(default)]
    summary: Option<Value>,
}

fn run_error(e: RunError) -> ApiError {
    let (status, c) = match &e {
        RunError::Invalid(_) => (StatusCode::BAD_REQUEST, code::INVALID_BODY),
        RunError::Policy(_) => (StatusCode::FORBIDDEN, code::FORBIDDEN),
        RunError::NotFound(_) => (StatusCode::NOT_FOUND, code::NOT_FOUND),
        RunError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL),
    };
    ApiError::new(status, c, e.to_string())
}

/// Streams a harness run: `event: progress` per harness event (bounded: a
/// slow reader loses progress, never the end), then `event: run` with the
/// stored run, or `event: error`. A client that leaves does not stop the
/// run: it is recorded all the same.
fn stream_harness(state: AppState, start: HarnessStart) -> Response {
    use axum::response::sse::Event;
    use tokio::sync::mpsc;

    let (progress_tx, mut progress) = mpsc::unbounded_channel::<Value>();
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let run = state.runtime.run_harness(start, Some(progress_tx));
        tokio::pin!(run);
        let last = loop {
            tokio::select! {
                biased;
                Some(p) = progress.recv() => {
                    let _ = tx.try_send(Event::default().event("progress").data(p.to_string()));
                }
                r = &mut run => break r,
            }
        };
        while let Ok(p) = progress.try_recv() {
            let _ = tx.try_send(Event::default().event("progress").data(p.to_string()));
        }
        let ev = match last {
            Ok(run) => Event::default()
                .event("run")
                .data(serde_json::to_string(&run).unwrap_or_default()),
            Err(e) => {
                let err = run_error(e);
                let mut body = err.body();
                body["status"] = json!(err.status.as_u16());
                Event::default().event("error").data(body.to_string())
            }
        };
        let _ = tx.send(ev).await;
    });
    crate::invoke_stream::sse(rx)
}

/// `POST /v1/runs`: runs a harness (waits for its end; `201` with the run;
/// with `Accept: text/event-stream`, its events then the run as SSE), or
/// records an external run (`201`, status `running`).
pub(crate) async fn create_run(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    headers: axum::http::HeaderMap,
    JsonBody(req): JsonBody<CreateRun>,
) -> Result<Response, ApiError> {
    if !plugd_store::sessions::valid_session_id(&req.session_id) {
        return Err(bad(format!(
            "session_id {:?} is not a valid id",
            req.session_id
        )));
    }
    // A delegation token starts runs in its own session only.
    bound_session(
        &who,
        &req.session_id,
        &format!("session {:?}", req.session_id),
    )?;
    // A delegation token's runs are children of its own run.
    let parent = match (&who.delegation, &req.parent_run_id) {
        (Some(d), Some(p)) if Some(p) != d.run_id.as_ref() => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                format!(
                    "a delegation token starts child runs of its own run ({}) only",
                    d.run_id.as_deref().unwrap_or("none")
                ),
            ));
        }
        (Some(d), _) => d.run_id.clone(),
        (None, p) => p.clone(),
    };
    let scope = scope_of(&who);
    let rt = &state.runtime;
    let store = rt.state();
    // The session must be visible when it exists; a new one is created in
    // the caller's scope.
    let existing = store
        .session_info(&req.session_id)
        .await
        .map_err(store_error)?;
    if let Some(s) = &existing
        && !scope.sees(s.org_id.as_deref(), s.project_id.as_deref())
    {
        return Err(not_found(&format!("session {:?}", req.session_id)));
    }
    let (org, project) = match &existing {
        Some(s) => (s.org_id.clone(), s.project_id.clone()),
        None => (scope.org_id.clone(), scope.project_ids.first().cloned()),
    };
    if let Some(harness) = req.harness {
        // Harnesses are the workspace's plugins: an org's token (or an org
        // invocation's delegation) does not run them; an org's packages
        // reach it through bindings.
        let org_caller =
            who.tenant.is_some() || who.delegation.as_ref().is_some_and(|d| d.org_id.is_some());
        if org_caller {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                format!(
                    "{harness} is a workspace plugin; {} acts for an org and may record runs, not start the workspace's harnesses",
                    who.by()
                ),
            ));
        }
        let start = HarnessStart {
            harness,
            session_id: req.session_id,
            mode: req.mode.unwrap_or_else(|| "start".into()),
            input: req.input,
            trigger_type: None,
            policy: req.policy.unwrap_or_default(),
            parent_run_id: parent,
            org_id: org,
            project_id: project,
            created_by: who.by().to_owned(),
            scope_ceiling: who.delegation.as_ref().map(|d| d.scopes.clone()),
        };
        let streams = headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"));
        if streams {
            return Ok(stream_harness(state.clone(), start));
        }
        let run = rt.run_harness(start, None).await.map_err(run_error)?;
        return Ok((StatusCode::CREATED, Json(run)).into_response());
    }
    let depth = match &parent {
        None => 0,
        Some(p) => {
            let parent = visible_run(&state, &who, p).await?;
            rt.check_child(&parent).await.map_err(run_error)?
        }
    };
    let (session, _) = store
        .session_open(&req.session_id, org.as_deref(), project.as_deref())
        .await
        .map_err(store_error)?;
    let run = Run {
        id: fresh_id("run"),
        session_id: session.id,
        chain_id: session.head_chain_id,
        parent_run_id: parent,
        depth,
        kind: RunKind::External,
        harness: None,
        mode: req.mode,
        status: RunStatus::Running,
        input: json!({"text": req.input, "policy": req.policy.unwrap_or_default()}),
        checkpoint: Value::Null,
        summary: req.summary.unwrap_or(Value::Null),
        artifacts: json!([]),
        error: None,
        created_by: who.by().to_owned(),
        created_at: plugd_store::now_rfc3339(),
        ended_at: None,
    };
    store.run_create(&run).await.map_err(store_error)?;
    Ok((StatusCode::CREATED, Json(run)).into_response())
}

/// `PATCH /v1/runs/{id}` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchRun {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    checkpoint: Option<Value>,
    #[serde(default)]
    summary: Option<Value>,
    #[serde(default)]
    artifacts: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

/// `PATCH /v1/runs/{id}`: status and outputs of an external run (or of a
/// delegation token's own run).
pub(crate) async fn patch_run(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PatchRun>,
) -> Result<Response, ApiError> {
    bound_run(&state, &who, &id).await?;
    let run = visible_run(&state, &who, &id).await?;
    if let Some(d) = &who.delegation {
        let own = d.run_id.as_deref() == Some(run.id.as_str());
        let child = d.run_id.is_some() && run.parent_run_id == d.run_id;
        if !own && !child {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                format!(
                    "a delegation token updates its own run and its children only; {id} is neither"
                ),
            ));
        }
    }
    let status = match req.status.as_deref() {
        None => None,
        Some(s) => Some(RunStatus::parse(s).ok_or_else(|| {
            bad(format!(
                "status {s:?} is not running, succeeded, failed, cancelled or retryable_failure"
            ))
        })?),
    };
    let patch = RunPatch {
        status,
        checkpoint: req.checkpoint,
        summary: req.summary,
        artifacts: req.artifacts,
        error: req.error,
        chain_id: None,
    };
    let run = state
        .runtime
        .state()
        .run_update(&id, &patch)
        .await
        .map_err(store_error)?
        .ok_or_else(|| not_found(&format!("run {id:?}")))?;
    Ok(Json(run).into_response())
}

/// `POST /v1/compactions` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompactRequest {
    session_id: String,
    /// Record the compaction as a job any node runs, and answer `202` at
    /// once with its id (`GET /v1/compactions/jobs/{id}`).
    #[serde(default, rename = "async")]
    background: bool,
}

/// `POST /v1/compactions`: compacts a session's head chain now with the
/// configured compactor (`agent.compactor`).
pub(crate) async fn compact(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    JsonBody(req): JsonBody<CompactRequest>,
) -> Result<Response, ApiError> {
    bound_session(
        &who,
        &req.session_id,
        &format!("session {:?}", req.session_id),
    )?;
    visible_session(&state, &who, &req.session_id).await?;
    let Some(cfg) = state.config.agent.compactor.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            code::CONFLICT,
            "plugd.yaml has no agent.compactor; configure one to compact chains",
        ));
    };
    let run = who.delegation.as_ref().and_then(|d| d.run_id.clone());
    if let Some(r) = &run {
        let parent = visible_run(&state, &who, r).await?;
        let allowed = parent
            .input
            .get("policy")
            .and_then(|p| p.get("allow_compaction"))
            .and_then(Value::as_bool)
            .unwrap_or(true);
        if !allowed {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                code::FORBIDDEN,
                format!("run {r}'s policy has allow_compaction: false"),
            ));
        }
    }
    if req.background {
        let job = plugd_runtime::compaction::enqueue_compaction(
            &state.runtime,
            &req.session_id,
            run.as_deref(),
            &cfg,
        )
        .await
        .map_err(store_error)?;
        let location = format!("/v1/compactions/jobs/{}", job.job_id);
        let body = json!({
            "job_id": job.job_id,
            "session_id": req.session_id,
            "status": "pending",
            "location": location,
        });
        return Ok((
            StatusCode::ACCEPTED,
            [(axum::http::header::LOCATION, location)],
            Json(body),
        )
            .into_response());
    }
    let c = plugd_agent::compaction::compact_session(
        &state.runtime,
        &req.session_id,
        &cfg,
        run.as_deref(),
    )
    .await
    .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, code::PLUGIN_ERROR, e.to_string()))?;
    Ok((StatusCode::CREATED, Json(c)).into_response())
}

/// `GET /v1/compactions/jobs/{id}`: where a compaction job stands
/// (`pending`, `running`, `succeeded`, `failed`), its attempts and last
/// error, and once it succeeded the compaction it made. A job of a session
/// the caller may not see is 404, as if it did not exist.
pub(crate) async fn compaction_job(
    State(state): State<AppState>,
    Extension(who): Extension<Identity>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    use plugd_store::outbox::DeliveryStatus;
    let what = format!("compaction job {id:?}");
    let store = state.runtime.state();
    let job = store
        .outbox_delivery(&id)
        .await
        .map_err(store_error)?
        .filter(|l| {
            l.delivery.event_type == plugd_runtime::compaction::COMPACTION_JOB
                && l.delivery.delivery_id.0 == id
        })
        .ok_or_else(|| not_found(&what))?;
    let session = job.event["summary"]["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    bound_session(&who, &session, &what)?;
    visible_session(&state, &who, &session)
        .await
        .map_err(|_| not_found(&what))?;
    let d = &job.delivery;
    let status = match d.status {
        DeliveryStatus::Delivered => "succeeded",
        DeliveryStatus::Dead => "failed",
        DeliveryStatus::Pending if d.leased_by.is_some() => "running",
        DeliveryStatus::Pending => "pending",
    };
    let prefix = plugd_runtime::compaction::job_compaction_prefix(&id);
    let compaction = store
        .compactions(&session)
        .await
        .map_err(store_error)?
        .into_iter()
        .find(|c| c.id.starts_with(&prefix) && c.status == "succeeded");
    Ok(Json(json!({
        "job_id": id,
        "session_id": session,
        "status": status,
        "attempts": d.attempt,
        "last_error": d.last_error,
        "next_attempt_at": d.next_attempt_at,
        "running_on": d.leased_by,
        "created_at": d.created_at,
        "compaction": compaction,
    }))
    .into_response())
}

/// `POST /v1/llm:complete` body: a short completion through the configured
/// LLM provider (plugd's own route, scope `llm:complete`), for a compactor
/// or harness that summarises.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LlmComplete {
    /// `[{"role": "user"|"assistant", "content": "…"}]`.
    messages: Vec<LlmMessage>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LlmMessage {
    role: String,
    content: String,
}

/// Most messages and characters one `llm:complete` may send.
const MAX_LLM_MESSAGES: usize = 200;
const MAX_LLM_CHARS: usize = 512 * 1024;

/// `POST /v1/llm:complete`: `{"text", "usage"}` from plugd.yaml's `llm:`.
pub(crate) async fn llm_complete(
    State(state): State<AppState>,
    JsonBody(req): JsonBody<LlmComplete>,
) -> Result<Response, ApiError> {
    use plugd_agent::llm::{ChatMessage, ChatRequest, Role};
    let agent = state.agent()?;
    let chars: usize = req.messages.iter().map(|m| m.content.len()).sum();
    if req.messages.is_empty() || req.messages.len() > MAX_LLM_MESSAGES || chars > MAX_LLM_CHARS {
        return Err(bad(format!(
            "send 1 to {MAX_LLM_MESSAGES} messages of at most {MAX_LLM_CHARS} characters in all"
        )));
    }
    let messages = req
        .messages
        .into_iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => return Err(bad(format!("role {other:?} is not user or assistant"))),
            };
            Ok(ChatMessage {
                role,
                content: m.content,
                tool_calls: Vec::new(),
                tool_call_id: None,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let request = ChatRequest {
        messages,
        system_prompt: req.system,
        max_tokens: req.max_tokens.map(|m| m.min(8192)),
        ..ChatRequest::default()
    };
    let response = agent.llm().chat(&request, None).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            code::LLM_UNAVAILABLE,
            e.to_string(),
        )
    })?;
    Ok(Json(json!({
        "text": response.content,
        "usage": {"input": response.usage.prompt_tokens, "output": response.usage.completion_tokens},
    }))
    .into_response())
}
