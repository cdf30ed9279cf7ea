//! Egress through plugd only: the allowlist a sandbox may reach, and the
//! pieces that enforce it.
//!
//! A sandbox whose network is [`super::Network::Proxy`] gets a network
//! namespace of its own (bwrap `--unshare-net`: only a loopback interface)
//! and one way out: plugd's forward proxy ([`proxy`]), listening on a Unix
//! socket outside the sandbox that is bound into it at [`SOCKET_IN_SANDBOX`].
//! A tiny bridge ([`bridge`], plugd's own binary run as `plugd
//! __egress-bridge`, bound read-only at [`BRIDGE_IN_SANDBOX`]) listens on the
//! namespace's `127.0.0.1:`[`BRIDGE_PORT`], forwards every connection to that
//! socket, and `exec`s the plugin with `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`
//! (both cases) pointing at it and `NO_PROXY` empty ([`proxy_env`]).
//!
//! The proxy decides by the requested host name ([`EgressPlan::route`]):
//! an allowlist entry is a name (`api.example.com`), a wildcard for the
//! subdomains of a name (`*.example.org`, not the name itself), or an IP
//! literal (`10.0.0.5`, `[fd00::1]`), each with an optional `:port` (without
//! one, any port). Names ending in `.localhost` resolve to loopback (RFC
//! 6761) inside the proxy; any other listed name resolved to a loopback,
//! private, link-local or unspecified address is refused unless that address
//! is listed too, so a listed wildcard cannot be pointed (DNS rebinding) at
//! plugd's own listener or the operator's LAN. The gateway route
//! ([`EgressPlan::gateway`]) maps [`GATEWAY_HOST`] to plugd's HTTP listener.
//!
//! **Architecture invariant**: the proxy connects only to addresses it
//! resolved itself for a name (or a literal) the plan allows; the plugin's
//! bytes never choose the destination after that decision.

pub mod bridge;
pub mod proxy;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use serde::Serialize;

/// The port the bridge listens on inside the sandbox's own network namespace.
pub const BRIDGE_PORT: u16 = 3128;

/// Where the proxy's Unix socket appears inside the sandbox.
pub const SOCKET_IN_SANDBOX: &str = "/run/plugd/egress.sock";

/// Where plugd's binary (the bridge) appears inside the sandbox.
pub const BRIDGE_IN_SANDBOX: &str = "/run/plugd/egress-bridge";

/// The hidden subcommand of the plugd binary that runs the bridge.
pub const BRIDGE_SUBCOMMAND: &str = "__egress-bridge";

/// Environment variable naming the binary that runs the bridge (default: the
/// running executable, which is plugd).
pub const BRIDGE_ENV: &str = "PLUGD_EGRESS_BRIDGE";

/// The name under which a sandbox reaches plugd's own HTTP listener through
/// the proxy when the plan has a [`EgressPlan::gateway`].
pub const GATEWAY_HOST: &str = "plugd.internal";

/// What a sandbox with [`super::Network::Proxy`] may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EgressPlan {
    /// Allowlist entries, normalized ([`EgressRule`]'s `Display`).
    pub allow: Vec<String>,
    /// plugd's own HTTP listener, reachable as `http://`[`GATEWAY_HOST`]
    /// (see [`EgressPlan::gateway_base_url`]).
    pub gateway: Option<SocketAddr>,
    /// The plugd.yaml key a refusal names as the way to allow a domain.
    pub config_key: String,
    /// The directory for the proxy's Unix socket (outside every sandbox;
    /// `None`: a `plugd-egress` directory in the temporary directory).
    pub socket_dir: Option<PathBuf>,
}

impl EgressPlan {
    /// The rules of [`EgressPlan::allow`] (entries that do not parse are
    /// skipped: the plan was validated when it was made).
    pub fn rules(&self) -> Vec<EgressRule> {
        self.allow
            .iter()
            .filter_map(|a| EgressRule::parse(a).ok())
            .collect()
    }

    /// The URL a plugin in this sandbox uses for plugd's API, when the plan
    /// has a gateway: `http://plugd.internal` (through the proxy the
    /// plugin's HTTP client is configured with by [`proxy_env`]).
    pub fn gateway_base_url(&self) -> Option<String> {
        self.gateway.map(|_| format!("http://{GATEWAY_HOST}"))
    }

    /// Where a request for `host:port` goes, or why it is refused.
    pub fn route(&self, host: &str, port: u16) -> Result<Route, String> {
        let host = normalize_host(host);
        if host == GATEWAY_HOST {
            return match self.gateway {
                Some(addr) if port == 80 => Ok(Route::Gateway(addr)),
                Some(_) => Err(format!("{GATEWAY_HOST} is reachable on port 80 only")),
                None => Err(format!(
                    "this sandbox has no gateway route to {GATEWAY_HOST}"
                )),
            };
        }
        let rules = self.rules();
        // The gateway by its own address too (the `base_url` plugd puts in
        // `context.gateway`), on its port only.
        if let (Some(addr), Some(ip)) = (self.gateway, parse_ip_literal(&host))
            && ip == addr.ip()
            && port == addr.port()
        {
            return Ok(Route::Gateway(addr));
        }
        if let Some(ip) = parse_ip_literal(&host) {
            return if rules.iter().any(|r| r.allows_ip(ip, port)) {
                Ok(Route::Addrs(vec![SocketAddr::new(ip, port)]))
            } else {
                Err(
                    "not on the allowlist (an IP literal is allowed only when it is listed itself)"
                        .to_owned(),
                )
            };
        }
        if !valid_name(&host) {
            return Err("not a valid host name".to_owned());
        }
        if !rules.iter().any(|r| r.allows_name(&host, port)) {
            return Err("not on the allowlist".to_owned());
        }
        if host == "localhost" || host.ends_with(".localhost") {
            return Ok(Route::Loopback(port));
        }
        Ok(Route::Resolve { host, port })
    }

    /// Whether a listed name may use `ip` (one of its resolved addresses):
    /// public addresses always, internal ones only when listed themselves.
    pub fn may_use(&self, ip: IpAddr, port: u16) -> bool {
        !is_internal(ip) || self.rules().iter().any(|r| r.allows_ip(ip, port))
    }
}

/// Where the proxy connects for an allowed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// plugd's own listener.
    Gateway(SocketAddr),
    /// These addresses (an allowed IP literal).
    Addrs(Vec<SocketAddr>),
    /// Loopback (a `.localhost` name, RFC 6761), this port.
    Loopback(u16),
    /// Resolve the name, then connect to the addresses [`EgressPlan::may_use`] allows.
    Resolve {
        /// Lower-case name without a trailing dot.
        host: String,
        /// Port.
        port: u16,
    },
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRule {
    host: RuleHost,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RuleHost {
    Exact(String),
    /// `*.example.org` stored as `example.org`.
    Subdomains(String),
    Ip(IpAddr),
}

impl EgressRule {
    /// Parses `name`, `*.name`, an IPv4 literal or a bracketed IPv6 literal,
    /// each with an optional `:port`; `Err` says what is wrong.
    pub fn parse(entry: &str) -> Result<EgressRule, String> {
        let e = entry.trim();
        if e.is_empty() {
            return Err("an empty entry; write a host name such as \"api.example.com\"".into());
        }
        if e.contains("://") || e.contains('/') || e.contains('@') {
            return Err(format!(
                "{entry:?} is not a host name: write the host only (\"api.example.com\", \"*.example.org\", \"api.example.com:443\"), without scheme, path or user"
            ));
        }
        let (host, port) = split_host_port(e)
            .ok_or_else(|| format!("{entry:?}: the port must be a number from 1 to 65535"))?;
        if port == Some(0) {
            return Err(format!(
                "{entry:?}: the port must be a number from 1 to 65535"
            ));
        }
        let host = normalize_host(host);
        if let Some(ip) = parse_ip_literal(&host) {
            return Ok(EgressRule {
                host: RuleHost::Ip(ip),
                port,
            });
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, host.clone()),
        };
        if !valid_name(&name) || name.contains('*') {
            return Err(format!(
                "{entry:?} is not a host name: use letters, digits, '-' and '.', with '*.' only as a prefix"
            ));
        }
        if wild && !name.contains('.') {
            return Err(format!(
                "{entry:?} allows a whole top-level domain; list a registrable domain such as \"*.example.org\""
            ));
        }
        Ok(EgressRule {
            host: if wild {
                RuleHost::Subdomains(name)
            } else {
                RuleHost::Exact(name)
            },
            port,
        })
    }

    fn port_ok(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    fn allows_name(&self, host: &str, port: u16) -> bool {
        self.port_ok(port)
            && match &self.host {
                RuleHost::Exact(n) => n == host,
                RuleHost::Subdomains(n) => host
                    .strip_suffix(n.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                RuleHost::Ip(_) => false,
            }
    }

    fn allows_ip(&self, ip: IpAddr, port: u16) -> bool {
        self.port_ok(port) && matches!(self.host, RuleHost::Ip(a) if a == ip)
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            RuleHost::Exact(n) => write!(f, "{n}")?,
            RuleHost::Subdomains(n) => write!(f, "*.{n}")?,
            RuleHost::Ip(IpAddr::V4(a)) => write!(f, "{a}")?,
            RuleHost::Ip(IpAddr::V6(a)) => write!(f, "[{a}]")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// The variables that send a plugin's HTTP clients to the bridge.
pub fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{BRIDGE_PORT}");
    let mut v: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), url.clone()))
    .collect();
    v.push(("NO_PROXY".to_owned(), String::new()));
    v.push(("no_proxy".to_owned(), String::new()));
    v
}

/// `host` lower-cased, without one trailing dot and without IPv6 brackets.
pub(crate) fn normalize_host(host: &str) -> String {
    let h = host.trim_end_matches('.');
    let h = h
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(h);
    h.to_ascii_lowercase()
}

/// Splits `host[:port]` / `[v6][:port]`; `None` when the port is not a number.
pub(crate) fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']')?;
        return match after {
            "" => Some((inner, None)),
            p => p.strip_prefix(':')?.parse().ok().map(|p| (inner, Some(p))),
        };
    }
    match s.rsplit_once(':') {
        // More than one ':' without brackets: a bare IPv6 literal.
        Some((h, _)) if h.contains(':') => Some((s, None)),
        Some((h, p)) => p.parse().ok().map(|p| (h, Some(p))),
        None => Some((s, None)),
    }
}

fn parse_ip_literal(host: &str) -> Option<IpAddr> {
    host.parse().ok()
}

fn valid_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Loopback, private, link-local, unspecified, shared (CGNAT) or
/// unique-local: addresses a name from the outside must not lead to.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || (a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64)
                || a.octets()[0] == 0
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xfe00) == 0xfc00
                || (a.segments()[0] & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(allow: &[&str]) -> EgressPlan {
        EgressPlan {
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            ..EgressPlan::default()
        }
    }

    #[test]
    fn rules_parse_and_print_normalized() {
        for (input, shown) in [
            ("API.Example.com.", "api.example.com"),
            ("*.example.org", "*.example.org"),
            ("api.example.com:443", "api.example.com:443"),
            ("10.0.0.5", "10.0.0.5"),
            ("[fd00::1]:8080", "[fd00::1]:8080"),
            ("fd00::1", "[fd00::1]"),
        ] {
            assert_eq!(EgressRule::parse(input).unwrap().to_string(), shown);
        }
        for bad in [
            "",
            "https://api.example.com",
            "api.example.com/v1",
            "user@host",
            "a.*.example.org",
            "*.com",
            "host:0",
            "host:http",
            "host:70000",
            "bad host",
            "-x.example.org",
        ] {
            assert!(EgressRule::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn routes_follow_the_allowlist() {
        let p = plan(&[
            "allowed.localhost",
            "*.example.org",
            "api.example.com:443",
            "10.0.0.5",
        ]);
        assert_eq!(
            p.route("Allowed.Localhost.", 8080),
            Ok(Route::Loopback(8080))
        );
        assert!(p.route("other.localhost", 8080).is_err());
        assert!(matches!(
            p.route("a.b.example.org", 1),
            Ok(Route::Resolve { .. })
        ));
        // The wildcard is for subdomains, not the name itself, nor a lookalike.
        assert!(p.route("example.org", 443).is_err());
        assert!(p.route("evilexample.org", 443).is_err());
        assert!(p.route("api.example.com", 443).is_ok());
        assert!(p.route("api.example.com", 80).is_err());
        assert!(p.route("10.0.0.5", 22).is_ok());
        let e = p.route("127.0.0.1", 80).unwrap_err();
        assert!(e.contains("IP literal"), "{e}");
        assert!(p.route("[::1]", 80).is_err());
        assert!(p.route("bad_host!", 80).is_err());
        assert!(p.route(GATEWAY_HOST, 80).is_err());
        let with_gw = EgressPlan {
            gateway: Some("127.0.0.1:7000".parse().unwrap()),
            ..plan(&[])
        };
        assert_eq!(
            with_gw.route("plugd.internal", 80),
            Ok(Route::Gateway("127.0.0.1:7000".parse().unwrap()))
        );
        assert!(with_gw.route("plugd.internal", 7000).is_err());
        assert_eq!(
            with_gw.gateway_base_url().as_deref(),
            Some("http://plugd.internal")
        );
    }

    #[test]
    fn internal_addresses_need_their_own_entry() {
        let p = plan(&["*.example.org", "10.0.0.5"]);
        assert!(!p.may_use("127.0.0.1".parse().unwrap(), 80));
        assert!(!p.may_use("::ffff:127.0.0.1".parse().unwrap(), 80));
        assert!(!p.may_use("192.168.1.1".parse().unwrap(), 80));
        assert!(!p.may_use("169.254.169.254".parse().unwrap(), 80));
        assert!(!p.may_use("fd00::1".parse().unwrap(), 80));
        assert!(p.may_use("10.0.0.5".parse().unwrap(), 80));
        assert!(p.may_use("93.184.215.14".parse().unwrap(), 443));
    }
}
