//! MCP protocol revisions: which plugd speaks and how one is chosen.
//!
//! Negotiation follows the official SDKs: a client asks for a revision in
//! `initialize`; a server that speaks it answers with it, otherwise with the
//! newest stateful revision it speaks, and the client decides whether it can
//! go on. The stateless revision ([`STATELESS`]) has no handshake: each
//! request names its revision in `_meta` ([`META_PROTOCOL_VERSION`]) and a
//! client learns what a server speaks from `server/discover`.

/// The stateless revision (`server/discover`, per-request `_meta`).
pub const STATELESS: &str = "2026-07-28";

/// The newest revision with an `initialize` handshake.
pub const LATEST_STATEFUL: &str = "2025-11-25";

/// Every revision plugd speaks, newest first.
pub const SUPPORTED: [&str; 5] = [
    STATELESS,
    LATEST_STATEFUL,
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// The revisions with an `initialize` handshake, newest first (what plugd's
/// MCP client dialect accepts from the servers it hosts).
pub const STATEFUL: [&str; 4] = [LATEST_STATEFUL, "2025-06-18", "2025-03-26", "2024-11-05"];

/// The stateless revisions (per-request `_meta`, no handshake), newest
/// first: what plugd's MCP client proposes in `server/discover`.
pub const MODERN: [&str; 1] = [STATELESS];

/// JSON-RPC error code of a request naming a revision the server does not
/// speak (2026-07-28); its `data.supported` lists the server's revisions.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// `_meta` key of a stateless request's revision.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key of a stateless request's client capabilities.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key of a stateless request's client name and version.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// The revision a request names in its own `_meta`
/// (`params._meta["io.modelcontextprotocol/protocolVersion"]`), as sent: the
/// one place both the HTTP surface (does this request need a session?) and
/// the gateway (which revision serves it?) read it from.
pub fn meta_revision(params: Option<&serde_json::Value>) -> Option<&serde_json::Value> {
    params?.get("_meta")?.get(META_PROTOCOL_VERSION)
}

/// The revision a server answers an `initialize` asking for `requested`
/// with: the same one when plugd speaks it and it has a handshake, else
/// [`LATEST_STATEFUL`] (an `initialize` is never answered with the
/// stateless revision, which has none).
pub fn negotiate(requested: &str) -> &'static str {
    SUPPORTED
        .iter()
        .copied()
        .find(|v| *v == requested && *v != STATELESS)
        .unwrap_or(LATEST_STATEFUL)
}

/// The stateless revision a client uses with a server whose
/// `server/discover` listed `supported`: the newest of [`MODERN`] in it, or
/// `None` (the server speaks none of them, so the client falls back to the
/// `initialize` handshake, as the official SDKs do).
pub fn choose_stateless<'a>(supported: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let supported: Vec<&str> = supported.into_iter().collect();
    MODERN.iter().copied().find(|v| supported.contains(v))
}

/// Whether `version` is a revision plugd speaks.
pub fn is_supported(version: &str) -> bool {
    SUPPORTED.contains(&version)
}

/// Whether a session at `version` may receive `feature` (a capability that
/// appeared in a later revision is not sent to an older client).
pub fn at_least(version: &str, since: &str) -> bool {
    // Revisions are ISO dates: string order is date order.
    version >= since
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_keeps_a_known_stateful_revision_and_falls_back_otherwise() {
        assert_eq!(negotiate("2024-11-05"), "2024-11-05");
        assert_eq!(negotiate("2025-06-18"), "2025-06-18");
        assert_eq!(negotiate("2025-11-25"), "2025-11-25");
        assert_eq!(negotiate("2026-07-28"), LATEST_STATEFUL);
        assert_eq!(negotiate("1999-01-01"), LATEST_STATEFUL);
        assert_eq!(negotiate(""), LATEST_STATEFUL);
        assert!(is_supported(STATELESS) && !is_supported("2025-01-01"));
        assert!(STATEFUL.iter().all(|v| SUPPORTED.contains(v)) && !STATEFUL.contains(&STATELESS));
        assert!(at_least("2025-11-25", "2025-06-18") && !at_least("2025-03-26", "2025-06-18"));
    }

    #[test]
    fn a_stateless_revision_is_chosen_only_from_those_plugd_speaks() {
        assert_eq!(choose_stateless(["2026-07-28"]), Some(STATELESS));
        assert_eq!(
            choose_stateless(["2025-11-25", "2026-07-28", "2099-01-01"]),
            Some(STATELESS)
        );
        assert_eq!(choose_stateless(["2025-11-25", "2025-06-18"]), None);
        assert_eq!(choose_stateless(["2099-01-01"]), None);
        assert_eq!(choose_stateless([]), None);
        assert!(
            MODERN
                .iter()
                .all(|v| is_supported(v) && !STATEFUL.contains(v))
        );
    }
}
