//! Calls through bindings over HTTP: `POST /v1/plugin-tools/{export_id}:invoke`
//! (agent role), body `{"input": {...}, "session_id"?, "project_id"?,
//! "org_id"?}`, answered with the tool's result exactly as
//! `POST /v1/tools/{name}:invoke` answers, with the same error shapes.
//!
//! **Scope from identity**: a token bound to an org calls in its org
//! (`org_id` in the body may only repeat it); its project is `project_id`
//! when given (one of its projects, for a token limited to projects), else
//! its only project when it is limited to exactly one, else none (org-wide
//! bindings only). A workspace identity (unbound token, the socket's local
//! user, the CLI through serve) names `org_id` in the body. Another org, a
//! project the token is not limited to, no binding, or a disabled one all
//! answer the same `404 not_found`.
//!
//! The call takes [`plugd_runtime::Runtime::call_export`], which shares the
//! governed path of every tool call (enabled check, argument schema, tool
//! hooks, risk gate, invocation record with the caller's `traceparent`).

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri};
use axum::{Extension, Json};
use plugd_control::bindings::is_valid_name;
use plugd_runtime::RuntimeError;
use plugd_runtime::bindings_rt::ExportCall;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Identity;
use crate::error::code;
use crate::{ApiError, AppState, JsonBody};

/// Longest `session_id` accepted.
pub const MAX_SESSION_ID: usize = 128;

/// The body of `POST /v1/plugin-tools/{export_id}:invoke`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportInvokeRequest {
    /// The tool's input (a JSON object; `{}` when absent).
    #[serde(default)]
    pub input: Option<Value>,
    /// The session: the rollout key and `context.session_id`.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The project the call is made for.
    #[serde(default)]
    pub project_id: Option<String>,
    /// The org: required from a workspace identity, optional (and only its
    /// own) from a token bound to an org.
    #[serde(default)]
    pub org_id: Option<String>,
}

fn bad(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code::BAD_REQUEST, message)
}

/// The answer for an export that does not exist for the caller.
fn not_found(export: &str, org: &str) -> ApiError {
    ApiError::from(RuntimeError::UnknownExport {
        export: export.to_owned(),
        org: org.to_owned(),
    })
}

/// The scope of a call by `who` with `body`: `(org, project)`, or the
/// error to answer (400 for a malformed id, 404 for a scope it may not
/// call in).
pub fn scope_of(
    who: &Identity,
    body: &ExportInvokeRequest,
    export: &str,
) -> Result<(String, Option<String>), ApiError> {
    for (name, v) in [("org_id", &body.org_id), ("project_id", &body.project_id)] {
        if let Some(v) = v
            && !is_valid_name(v)
        {
            return Err(bad(format!(
                "{name} {:?} is not an id; {}",
                clip(v),
                plugd_control::bindings::NAME_RULE
            )));
        }
    }
    if let Some(s) = &body.session_id
        && (s.is_empty() || s.len() > MAX_SESSION_ID || !s.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(bad(format!(
            "session_id {:?} is not a session id; use 1-{MAX_SESSION_ID} printable ASCII characters without spaces",
            clip(s)
        )));
    }
    match &who.tenant {
        Some(t) => {
            if body.org_id.as_ref().is_some_and(|o| *o != t.org_id) {
                return Err(not_found(export, &t.org_id));
            }
            let project = match &body.project_id {
                Some(p) if t.project_ids.is_empty() || t.project_ids.contains(p) => Some(p.clone()),
                Some(_) => return Err(not_found(export, &t.org_id)),
                None if t.project_ids.len() == 1 => Some(t.project_ids[0].clone()),
                None => None,
            };
            Ok((t.org_id.clone(), project))
        }
        None => {
            let org = body.org_id.clone().ok_or_else(|| {
                bad(format!(
                    "{} is not bound to an org: name the org the call is made for in \"org_id\"",
                    who.name
                ))
            })?;
            Ok((org, body.project_id.clone()))
        }
    }
}

/// At most 64 characters of `s`, for messages.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `POST /v1/plugin-tools/{export_id}:invoke`.
pub(crate) async fn invoke(
    State(state): State<AppState>,
    Path(segment): Path<String>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    Extension(who): Extension<Identity>,
    JsonBody(body): JsonBody<ExportInvokeRequest>,
) -> Result<Json<Value>, ApiError> {
    let Some((export, "invoke")) = crate::auth::action_of(&segment).filter(|(e, _)| !e.is_empty())
    else {
        return Err(ApiError::no_route(method.as_str(), uri.path()));
    };
    let (org_id, project_id) = scope_of(&who, &body, export)?;
    let input = body.input.unwrap_or_else(|| json!({}));
    if !input.is_object() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            code::INVALID_ARGUMENTS,
            format!("\"input\" must be a JSON object of {export:?}'s input, got {input}"),
        )
        .with_details(json!({"fields": [{"path": "", "message": "not an object"}]})));
    }
    let call = ExportCall {
        org_id,
        project_id,
        session_id: body.session_id,
        caller: Some(who.name.clone()),
        trace_id: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(plugd_telemetry::trace_id_of),
    };
    let result = state
        .runtime
        .call_export(export, input, &call, None)
        .await?;
    Ok(Json(result))
}

#[cfg(test)]
mod tests {
    use plugd_store::tokens::{Role, Tenancy};

    use super::*;

    fn who(tenant: Option<(&str, &[&str])>) -> Identity {
        Identity {
            name: "token:t".into(),
            role: Role::Agent,
            mcp_profiles: None,
            tenant: tenant.map(|(o, ps)| Tenancy {
                org_id: o.into(),
                project_ids: ps.iter().map(|p| (*p).to_owned()).collect(),
            }),
            delegation: None,
            groups: Vec::new(),
            user: None,
        }
    }

    fn body(org: Option<&str>, project: Option<&str>) -> ExportInvokeRequest {
        ExportInvokeRequest {
            org_id: org.map(str::to_owned),
            project_id: project.map(str::to_owned),
            ..ExportInvokeRequest::default()
        }
    }

    #[test]
    fn the_scope_comes_from_the_token() {
        let a = who(Some(("a", &[])));
        assert_eq!(
            scope_of(&a, &body(None, None), "x").unwrap(),
            ("a".into(), None)
        );
        assert_eq!(
            scope_of(&a, &body(Some("a"), Some("p")), "x").unwrap(),
            ("a".into(), Some("p".into()))
        );
        let e = scope_of(&a, &body(Some("b"), None), "x").unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, code::NOT_FOUND));
        let p1 = who(Some(("a", &["p1"])));
        assert_eq!(
            scope_of(&p1, &body(None, None), "x").unwrap(),
            ("a".into(), Some("p1".into()))
        );
        let e = scope_of(&p1, &body(None, Some("p2")), "x").unwrap_err();
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        let two = who(Some(("a", &["p1", "p2"])));
        assert_eq!(
            scope_of(&two, &body(None, None), "x").unwrap(),
            ("a".into(), None)
        );
        // The 404 of another org's scope is the unknown export's, word for word.
        let unknown = ApiError::from(RuntimeError::UnknownExport {
            export: "x".into(),
            org: "a".into(),
        });
        let other = scope_of(&a, &body(Some("b"), None), "x").unwrap_err();
        assert_eq!(other.message, unknown.message);
        // A workspace identity names the org.
        let ws = who(None);
        let e = scope_of(&ws, &body(None, None), "x").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            scope_of(&ws, &body(Some("b"), None), "x").unwrap(),
            ("b".into(), None)
        );
    }

    #[test]
    fn malformed_ids_are_400() {
        let a = who(Some(("a", &[])));
        for b in [
            body(Some("a b"), None),
            body(None, Some(&"p".repeat(65))),
            ExportInvokeRequest {
                session_id: Some("s".repeat(MAX_SESSION_ID + 1)),
                ..ExportInvokeRequest::default()
            },
            ExportInvokeRequest {
                session_id: Some("two words".into()),
                ..ExportInvokeRequest::default()
            },
        ] {
            let e = scope_of(&a, &b, "x").unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
        }
    }
}
