//! The operator console's server side: the page's assets (embedded, served
//! with a strict Content-Security-Policy), and who is logged in.
//!
//! The console is a page of plain JavaScript that calls the same HTTP API the
//! CLI uses; it adds no privileged path. What it adds is a way for a browser
//! to hold a credential without the page's script ever seeing it:
//!
//! - a login exchanges a bearer token (or a one-time code from a login link
//!   printed by `plugd serve` / `plugd console`) for a random session id in
//!   an `HttpOnly; SameSite=Strict` cookie. A token session re-verifies its
//!   token on every request, so revoking or expiring the token ends it; a
//!   code session is the serve owner's (admin), as the socket is.
//! - every state-changing request that authenticates by the cookie must carry
//!   the session's CSRF token in `X-Plugd-CSRF` (read by the page from
//!   `GET /console/session`); the HTTP layer's `Origin` and `Host` checks
//!   apply as well.
//!
//! Sessions and codes are kept in the state store (SQLite or PostgreSQL), as
//! SHA-256 hashes of their ids only: a session outlives a restart of serve
//! and, with several nodes, any node serves it. Both are bounded (the least
//! recently used session is dropped first) and expire by the database's clock.

pub mod assets;
pub mod sessions;

pub use sessions::{Login, SessionError, Sessions};

/// The header that carries the CSRF token of a cookie session.
pub const CSRF_HEADER: &str = "x-plugd-csrf";

/// The cookie's name for a listener on `port`: cookies are shared by every
/// port of a host, so two serves on one machine must not overwrite each
/// other's.
pub fn cookie_name(port: u16) -> String {
    format!("plugd_console_{port}")
}

/// The cookie's name for a request whose `Host` header is `host`, received
/// on local port `local`: named after the port the browser used (the
/// `Host`'s), so that every node behind one address (a load balancer in
/// front of a cluster) reads the same cookie while two serves reached on
/// two ports of one host keep theirs apart. A `Host` without a port (a
/// balancer on 80 or 443) names `plugd_console`; no `Host` at all, the
/// local port.
pub fn cookie_name_for(host: Option<&str>, local: u16) -> String {
    let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else {
        return cookie_name(local);
    };
    // `[::1]:7777`, `host:7777`, `host`, `[::1]`.
    let after_bracket = host.rsplit_once(']').map_or(host, |(_, rest)| rest);
    match after_bracket
        .rsplit_once(':')
        .map(|(_, p)| p.parse::<u16>())
    {
        Some(Ok(port)) => cookie_name(port),
        _ => "plugd_console".to_owned(),
    }
}

/// The session id in a `Cookie` header value, if it carries the cookie
/// named `name`.
pub fn session_cookie<'a>(cookie_header: &'a str, name: &str) -> Option<&'a str> {
    cookie_header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// The `Set-Cookie` value that stores session `id`.
pub fn set_cookie(name: &str, id: &str) -> String {
    format!(
        "{name}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        sessions::IDLE_LIMIT.as_secs()
    )
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie(name: &str) -> String {
    format!("{name}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

/// Whether two secrets are equal, in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `method path` is one of the console's public routes (the page,
/// its assets and the login), reachable without credentials.
pub fn is_public(method: &str, path: &str) -> bool {
    match method {
        "GET" | "HEAD" => {
            matches!(
                path,
                "/console"
                    | "/console/"
                    | "/console/login"
                    | "/console/sso"
                    | "/console/sso/start"
                    | "/console/sso/callback"
            ) || path.starts_with("/console/assets/")
        }
        "POST" => path == "/console/login",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others_and_nowhere_else() {
        let name = cookie_name(7878);
        assert_eq!(
            session_cookie("a=1; plugd_console_7878=abc; b=2", &name),
            Some("abc")
        );
        assert_eq!(session_cookie("plugd_console_7879=abc", &name), None);
        assert_eq!(session_cookie("xplugd_console_7878=abc", &name), None);
        assert_eq!(session_cookie("", &name), None);
        let set = set_cookie(&name, "abc");
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert!(clear_cookie(&name).contains("Max-Age=0"));
    }

    #[test]
    fn the_cookie_is_named_after_the_port_the_browser_used() {
        assert_eq!(
            cookie_name_for(Some("127.0.0.1:7001"), 7003),
            "plugd_console_7001"
        );
        assert_eq!(
            cookie_name_for(Some("plugd.example"), 7003),
            "plugd_console"
        );
        assert_eq!(
            cookie_name_for(Some("[::1]:8080"), 7003),
            "plugd_console_8080"
        );
        assert_eq!(cookie_name_for(Some("[::1]"), 7003), "plugd_console");
        assert_eq!(cookie_name_for(None, 7003), "plugd_console_7003");
        assert_eq!(cookie_name_for(Some("h:notaport"), 7003), "plugd_console");
    }

    #[test]
    fn secrets_compare_exactly() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "a"));
    }

    #[test]
    fn only_the_page_and_the_login_are_public() {
        assert!(is_public("GET", "/console/"));
        assert!(is_public("GET", "/console/assets/app.js"));
        assert!(is_public("POST", "/console/login"));
        assert!(!is_public("GET", "/console/session"));
        assert!(!is_public("POST", "/console/logout"));
        assert!(!is_public("POST", "/console/links"));
        assert!(!is_public("DELETE", "/console/login"));
    }
}
