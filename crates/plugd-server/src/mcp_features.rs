//! MCP resources, resource templates, prompts and completion over HTTP,
//! through the runtime's gate (approved and unchanged servers, plugd.yaml's
//! `mcp.servers.NAME.resources`).
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /v1/resources[?server=S]` | `{"resources": [{"server", "item"}], "errors": [{"server", "error"}]}` |
//! | `GET /v1/resources/templates[?server=S]` | `{"templates": [...], "errors": [...]}` |
//! | `POST /v1/resources:read` | `{"server", "uri"}` → the `resources/read` result |
//! | `GET /v1/prompts[?server=S]` | `{"prompts": [...], "errors": [...]}` |
//! | `POST /v1/prompts:get` | `{"server", "name", "arguments"?}` → the `prompts/get` result |
//! | `POST /v1/completions` | `{"server", "ref", "argument", "context"?}` → `{"completion": {...}}` |
//!
//! Listings without `?server=` ask every approved MCP server: one that
//! fails is named in `errors` and the rest are listed (200). With
//! `?server=S` its failure is the response: 404 `unknown_plugin`, 422
//! `capability_missing` when the server did not declare the capability
//! (422, not 501: the route works, it is the addressed server that cannot
//! do it, so a client must not retry elsewhere in plugd, and monitors must
//! not count it as plugd failing), 422 `not_supported_by_dialect` for a
//! plugin that is not an MCP server, 403 `plugin_not_approved` or
//! `resources_denied`, 409 `plugin_changed` (see [`crate::error`]).
//!
//! Rights: the listings are `GET`s (viewer); reading, getting a prompt and
//! completing are the `agent` right, like invoking a tool.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use plugd_runtime::mcp_features::Listing;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

use crate::{ApiError, AppState, JsonBody, error};

/// The routes of this module.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/resources", get(list_resources))
        .route("/v1/resources/templates", get(list_templates))
        .route("/v1/resources:read", post(read_resource))
        .route("/v1/prompts", get(list_prompts))
        .route("/v1/prompts:get", post(get_prompt))
        .route("/v1/completions", post(complete))
}

/// The `server` query parameter (server names are `[A-Za-z0-9_-]`, so no
/// decoding is needed; anything else is refused).
fn server_param(uri: &Uri) -> Result<Option<String>, ApiError> {
    let Some(query) = uri.query() else {
        return Ok(None);
    };
    let mut server = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "server" {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::BAD_REQUEST,
                format!("unknown query parameter {k:?}; the only one is server=NAME"),
            ));
        }
        if v.is_empty()
            || !v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
        {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                error::code::BAD_REQUEST,
                format!(
                    "server={v:?} is not an MCP server name (1-64 of A-Z a-z 0-9 _ -, as in .mcp.json)"
                ),
            ));
        }
        server = Some(v.to_owned());
    }
    Ok(server)
}

fn listing_body(key: &str, listing: Listing) -> Json<Value> {
    Json(json!({ key: listing.items, "errors": listing.errors }))
}

async fn list_resources(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, ApiError> {
    let rt = &state.runtime;
    let listing = match server_param(&uri)? {
        Some(s) => Listing::of_server(&s, rt.resources(&s).await?),
        None => rt.all_resources().await,
    };
    Ok(listing_body("resources", listing))
}

async fn list_templates(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, ApiError> {
    let rt = &state.runtime;
    let listing = match server_param(&uri)? {
        Some(s) => Listing::of_server(&s, rt.resource_templates(&s).await?),
        None => rt.all_resource_templates().await,
    };
    Ok(listing_body("templates", listing))
}

async fn list_prompts(State(state): State<AppState>, uri: Uri) -> Result<Json<Value>, ApiError> {
    let rt = &state.runtime;
    let listing = match server_param(&uri)? {
        Some(s) => Listing::of_server(&s, rt.prompts(&s).await?),
        None => rt.all_prompts().await,
    };
    Ok(listing_body("prompts", listing))
}

/// The body of `POST /v1/resources:read`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    /// The MCP server.
    pub server: String,
    /// The resource URI (listed, or a template filled in).
    pub uri: String,
}

async fn read_resource(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ReadRequest>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        state.runtime.read_resource(&body.server, &body.uri).await?,
    ))
}

/// The body of `POST /v1/prompts:get`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptRequest {
    /// The MCP server.
    pub server: String,
    /// The prompt's name.
    pub name: String,
    /// Its arguments (strings, as MCP prompts take them).
    #[serde(default)]
    pub arguments: BTreeMap<String, String>,
}

async fn get_prompt(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<PromptRequest>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        state
            .runtime
            .get_prompt(&body.server, &body.name, &body.arguments)
            .await?,
    ))
}

/// The body of `POST /v1/completions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The MCP server.
    pub server: String,
    /// `{"type": "ref/prompt", "name"}` or `{"type": "ref/resource", "uri"}`.
    #[serde(rename = "ref")]
    pub reference: Value,
    /// `{"name", "value"}`: the argument being completed and what is typed so far.
    pub argument: Value,
    /// `{"arguments": {...}}`: the arguments already chosen.
    #[serde(default)]
    pub context: Option<Value>,
}

async fn complete(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CompleteRequest>,
) -> Result<Json<Value>, ApiError> {
    let completion = state
        .runtime
        .complete(
            &body.server,
            &body.reference,
            &body.argument,
            body.context.as_ref(),
        )
        .await?;
    Ok(Json(json!({ "completion": completion })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_parameter_is_a_server_name_or_nothing() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(server_param(&uri("/v1/resources")).unwrap(), None);
        assert_eq!(
            server_param(&uri("/v1/resources?server=every_thing-1")).unwrap(),
            Some("every_thing-1".into())
        );
        for bad in [
            "/v1/resources?server=",
            "/v1/resources?server=a%2Fb",
            "/v1/resources?servr=x",
        ] {
            let e = server_param(&uri(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
