//! Delegated credentials (seed 003): the scopes a short-lived token minted
//! for one invocation may carry, what it is bound to, and which scope each
//! canonical API route needs.
//!
//! The token itself (`vai_dlg_` and 64 hex digits) is minted, kept and
//! revoked by the runtime's registry; this module is the pure part: the
//! scope vocabulary, how the granted set is computed (requested by the
//! export ∩ allowed by the operator ∩ narrowed by the binding), and the
//! route → scope table the HTTP API enforces.

use serde::{Deserialize, Serialize};

/// The prefix of every delegation token.
pub const TOKEN_PREFIX: &str = "vai_dlg_";

/// The scopes plugd's API knows. The first six are seed 003's; `llm:complete`
/// is plugd's own (a compactor or harness summarising through the
/// configured LLM provider, `POST /v1/llm:complete`), granted only to an
/// export that asks for it.
pub const SCOPES: [&str; 7] = [
    "sessions:read",
    "chains:read",
    "chains:write",
    "runs:read",
    "runs:write",
    "compactions:write",
    "llm:complete",
];

/// What one delegation token allows and is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// The invocation it was minted for.
    pub invocation_id: String,
    /// `PACKAGE/EXPORT`.
    pub export: String,
    /// Granted scopes (a subset of [`SCOPES`]).
    pub scopes: Vec<String>,
    /// The org it acts in (`None`: the workspace).
    pub org_id: Option<String>,
    /// The project.
    pub project_id: Option<String>,
    /// The session of the invocation.
    pub session_id: Option<String>,
    /// Its chain.
    pub chain_id: Option<String>,
    /// Its run (a harness's own run: children it starts hang below it).
    pub run_id: Option<String>,
    /// Expiry, milliseconds since the Unix epoch (the invocation's deadline).
    pub expires_at_ms: u64,
}

impl Delegation {
    /// Whether it grants `scope`.
    pub fn allows(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == scope)
    }
}

/// The scopes granted to an export: those it requests (its manifest's
/// `gateway_api_scopes`) that plugd knows, narrowed by `narrow` when the
/// operator or a binding gives a list. Unknown requested scopes are left
/// out (and returned second, for a warning).
pub fn granted(requested: &[String], narrow: Option<&[String]>) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut unknown = Vec::new();
    for s in requested {
        if !SCOPES.contains(&s.as_str()) {
            unknown.push(s.clone());
            continue;
        }
        if narrow.is_some_and(|n| !n.iter().any(|x| x == s)) {
            continue;
        }
        if !ok.contains(s) {
            ok.push(s.clone());
        }
    }
    (ok, unknown)
}

/// The scope `method path` needs from a delegation token, or `None` when
/// no delegation token may use the route at all.
pub fn scope_for(method: &str, path: &str) -> Option<&'static str> {
    let read = method == "GET" || method == "HEAD";
    let seg: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (read, seg.as_slice()) {
        (true, ["v1", "sessions"]) | (true, ["v1", "sessions", _]) => Some("sessions:read"),
        (true, ["v1", "sessions", _, "compactions"]) => Some("sessions:read"),
        (true, ["v1", "compactions", "jobs", _]) => Some("sessions:read"),
        (true, ["v1", "chains", _]) | (true, ["v1", "chains", _, "blocks"]) => Some("chains:read"),
        (false, ["v1", "chains", _, "blocks"]) if method == "POST" => Some("chains:write"),
        (true, ["v1", "runs"]) | (true, ["v1", "runs", _]) => Some("runs:read"),
        (false, ["v1", "runs"]) if method == "POST" => Some("runs:write"),
        (false, ["v1", "runs", _]) if method == "PATCH" => Some("runs:write"),
        (false, ["v1", "compactions"]) if method == "POST" => Some("compactions:write"),
        (false, ["v1", "llm:complete"]) if method == "POST" => Some("llm:complete"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn granted_is_requested_known_and_narrowed() {
        let req = vec![
            "chains:read".to_owned(),
            "chains:write".to_owned(),
            "admin:all".to_owned(),
            "chains:read".to_owned(),
        ];
        let (ok, unknown) = granted(&req, None);
        assert_eq!(ok, ["chains:read", "chains:write"]);
        assert_eq!(unknown, ["admin:all"]);
        let narrow = vec!["chains:read".to_owned(), "runs:write".to_owned()];
        let (ok, _) = granted(&req, Some(&narrow));
        assert_eq!(ok, ["chains:read"], "narrowing never adds a scope");
    }

    #[test]
    fn routes_need_their_scope() {
        assert_eq!(scope_for("GET", "/v1/sessions"), Some("sessions:read"));
        assert_eq!(scope_for("GET", "/v1/sessions/s1"), Some("sessions:read"));
        assert_eq!(
            scope_for("GET", "/v1/compactions/jobs/del_1"),
            Some("sessions:read")
        );
        assert_eq!(scope_for("POST", "/v1/compactions/jobs/del_1"), None);
        assert_eq!(scope_for("GET", "/v1/chains/ch_1"), Some("chains:read"));
        assert_eq!(
            scope_for("GET", "/v1/chains/ch_1/blocks"),
            Some("chains:read")
        );
        assert_eq!(
            scope_for("POST", "/v1/chains/ch_1/blocks"),
            Some("chains:write")
        );
        assert_eq!(scope_for("POST", "/v1/runs"), Some("runs:write"));
        assert_eq!(scope_for("PATCH", "/v1/runs/r"), Some("runs:write"));
        assert_eq!(scope_for("GET", "/v1/runs/r"), Some("runs:read"));
        assert_eq!(
            scope_for("POST", "/v1/compactions"),
            Some("compactions:write")
        );
        for (m, p) in [
            ("POST", "/v1/tools/x:invoke"),
            ("GET", "/v1/plugins"),
            ("DELETE", "/v1/runs/r"),
            ("POST", "/v1/sessions/s/messages"),
            ("GET", "/v1/chains/a/b/c"),
            ("POST", "/mcp"),
        ] {
            assert_eq!(scope_for(m, p), None, "{m} {p}");
        }
    }
}
