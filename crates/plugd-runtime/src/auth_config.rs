//! plugd.yaml `auth:`: plugd as an OAuth 2.1 protected resource (JWT
//! access tokens of the listed issuers on `/mcp` and the API, beside
//! `plugd_…` tokens) and the console's single sign-on with the same
//! issuers; groups map to roles through `role_mapping` (first match wins,
//! no match: no access). Read at start, never live.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::config::ConfigError;

/// `auth:`; [`AuthConfig::default`] (no issuers) is plugd without OAuth.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AuthConfig {
    /// `resource:`: this server's resource identifier (the MCP endpoint's
    /// URL); `None`: the listener's own `/mcp` URL.
    pub resource: Option<String>,
    /// `issuers:`: the trusted authorization servers.
    pub issuers: Vec<IssuerConfig>,
    /// `role_mapping:`: group → role, first match wins.
    pub role_mapping: Vec<RoleMapping>,
    /// `scopes_supported:`: the scopes the metadata document offers MCP
    /// clients (what they ask the issuer for); empty: not listed.
    pub scopes_supported: Vec<String>,
}

/// One entry of `auth.issuers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// The issuer identifier, exactly as its tokens' `iss` (https, or http
    /// on a loopback host).
    pub issuer: String,
    /// The audience plugd's access tokens carry (`aud` must contain it or
    /// the resource URI).
    pub audience: String,
    /// The claim with the subject's groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// The console's client id at this issuer (a public client: code flow
    /// with PKCE); without it the console offers no sign-in with it.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The claim naming the subject's org (a string): its holder acts for
    /// that org as an org token does (the org must be known to the store).
    /// `None` (the default): no org is read from tokens.
    #[serde(default)]
    pub org_claim: Option<String>,
    /// The claim naming the subject's project in that org (a string);
    /// `None` (the default): none is read.
    #[serde(default)]
    pub project_claim: Option<String>,
}

fn default_groups_claim() -> String {
    "groups".into()
}

/// One entry of `auth.role_mapping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleMapping {
    /// A group of the token's groups claim.
    pub group: String,
    /// The role its members get: admin, operator, agent or viewer.
    pub role: String,
    /// The org its members act for (as an org token does); `None`: the
    /// workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    /// The project of that org they are limited to; `None`: all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

/// `auth:` as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAuth {
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    issuers: Vec<IssuerConfig>,
    #[serde(default)]
    role_mapping: Vec<RoleMapping>,
    #[serde(default)]
    scopes_supported: Vec<String>,
}

/// The roles `role_mapping` may name.
pub const ROLES: [&str; 4] = ["admin", "operator", "agent", "viewer"];

impl AuthConfig {
    /// The role of a holder of `groups`: the first mapping whose group is
    /// one of them (`None`: no access).
    pub fn role_for(&self, groups: &[String]) -> Option<&str> {
        self.mapping_for(groups).map(|m| m.role.as_str())
    }

    /// The mapping that decides a holder of `groups`: the first whose group
    /// is one of them; its role, and its org and project when it names
    /// them (`None`: no access).
    pub fn mapping_for(&self, groups: &[String]) -> Option<&RoleMapping> {
        self.role_mapping.iter().find(|m| groups.contains(&m.group))
    }
}

/// Whether `url` is https, or http on a loopback host (`localhost`,
/// `127.0.0.0/8`, `::1`).
pub fn secure_or_loopback(url: &str) -> Result<(), String> {
    let u = url::Url::parse(url).map_err(|e| format!("{url:?} is not a URL ({e})"))?;
    match u.scheme() {
        "https" => {}
        "http" => {
            let loopback = match u.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            if !loopback {
                return Err(format!(
                    "{url:?} is plain http on a host that is not loopback; use https (http only for 127.0.0.1, ::1 or localhost)"
                ));
            }
        }
        other => return Err(format!("{url:?} has scheme {other:?}; use https")),
    }
    if u.host().is_none() {
        return Err(format!("{url:?} has no host"));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(format!(
            "{url:?} has a query or fragment; an issuer has neither"
        ));
    }
    Ok(())
}

/// Checks and keeps `auth:`.
pub(crate) fn parse_config(raw: Spanned<RawAuth>, path: &Path) -> Result<AuthConfig, ConfigError> {
    let line = raw.referenced.line();
    let invalid = |field: String, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    let RawAuth {
        resource,
        issuers,
        role_mapping,
        scopes_supported,
    } = raw.value;
    if let Some(i) = scopes_supported
        .iter()
        .position(|s| s.is_empty() || s.contains(char::is_whitespace))
    {
        return Err(invalid(
            format!("auth.scopes_supported[{i}]"),
            "a scope is one word without spaces".into(),
        ));
    }
    if let Some(r) = &resource {
        secure_or_loopback(r).map_err(|m| invalid("auth.resource".into(), m))?;
    }
    for (i, iss) in issuers.iter().enumerate() {
        secure_or_loopback(&iss.issuer)
            .map_err(|m| invalid(format!("auth.issuers[{i}].issuer"), m))?;
        if issuers[..i].iter().any(|o| o.issuer == iss.issuer) {
            return Err(invalid(
                format!("auth.issuers[{i}].issuer"),
                format!("{:?} is listed twice", iss.issuer),
            ));
        }
        if iss.audience.trim().is_empty() {
            return Err(invalid(
                format!("auth.issuers[{i}].audience"),
                "is empty; name the audience plugd's access tokens carry (e.g. plugd)".into(),
            ));
        }
        if iss.groups_claim.trim().is_empty() {
            return Err(invalid(
                format!("auth.issuers[{i}].groups_claim"),
                "is empty; the default is groups".into(),
            ));
        }
        for (field, claim) in [
            ("org_claim", &iss.org_claim),
            ("project_claim", &iss.project_claim),
        ] {
            if claim.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(invalid(
                    format!("auth.issuers[{i}].{field}"),
                    "is empty; leave it out or name the claim (e.g. org)".into(),
                ));
            }
        }
        if iss.project_claim.is_some() && iss.org_claim.is_none() {
            return Err(invalid(
                format!("auth.issuers[{i}].project_claim"),
                "needs org_claim too: a project belongs to an org".into(),
            ));
        }
        if iss
            .client_id
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            return Err(invalid(
                format!("auth.issuers[{i}].client_id"),
                "is empty; leave it out or name the console's client".into(),
            ));
        }
    }
    for (i, m) in role_mapping.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(invalid(
                format!("auth.role_mapping[{i}].role"),
                format!(
                    "{:?} is not a role; use one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
            ));
        }
        if m.group.is_empty() {
            return Err(invalid(
                format!("auth.role_mapping[{i}].group"),
                "is empty".into(),
            ));
        }
        for (field, value) in [("org", &m.org), ("project", &m.project)] {
            if let Some(v) = value
                && !plugd_control::bindings::is_valid_name(v)
            {
                return Err(invalid(
                    format!("auth.role_mapping[{i}].{field}"),
                    format!("{v:?} is not an id; {}", plugd_control::bindings::NAME_RULE),
                ));
            }
        }
        if m.project.is_some() && m.org.is_none() {
            return Err(invalid(
                format!("auth.role_mapping[{i}].project"),
                "needs org too: a project belongs to an org".into(),
            ));
        }
    }
    if issuers.is_empty() && (resource.is_some() || !role_mapping.is_empty()) {
        return Err(invalid(
            "auth.issuers".into(),
            "is empty; resource and role_mapping need at least one issuer".into(),
        ));
    }
    Ok(AuthConfig {
        resource,
        issuers,
        role_mapping,
        scopes_supported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only_for_plain_http() {
        for ok in [
            "https://idp.example.com",
            "http://127.0.0.1:9000",
            "http://[::1]:80/realms/x",
            "http://localhost:8080",
        ] {
            assert!(secure_or_loopback(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example.com",
            "http://10.0.0.1",
            "ftp://x",
            "not a url",
            "https://idp.example.com/?x=1",
        ] {
            assert!(secure_or_loopback(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_first_matching_mapping_wins() {
        let cfg = AuthConfig {
            role_mapping: vec![
                RoleMapping {
                    group: "admins".into(),
                    role: "admin".into(),
                    org: None,
                    project: None,
                },
                RoleMapping {
                    group: "agents".into(),
                    role: "agent".into(),
                    org: Some("acme".into()),
                    project: None,
                },
            ],
            ..AuthConfig::default()
        };
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(cfg.role_for(&g(&["agents", "admins"])), Some("admin"));
        assert_eq!(cfg.role_for(&g(&["agents"])), Some("agent"));
        assert_eq!(cfg.role_for(&g(&["interns"])), None);
        assert_eq!(
            cfg.mapping_for(&g(&["agents"]))
                .and_then(|m| m.org.as_deref()),
            Some("acme")
        );
    }

    #[test]
    fn auth_is_read_checked_and_in_the_schema() {
        let parse = |text: &str| {
            crate::config::PlugdConfig::parse(text, Path::new("plugd.yaml"), Path::new("/ws"))
        };
        let good = "auth:\n  resource: https://plugd.example.com/mcp\n  issuers:\n    - issuer: https://idp.example.com\n      audience: plugd\n      client_id: console\n      org_claim: org\n      project_claim: project\n  role_mapping:\n    - {group: admins, role: admin}\n    - {group: agents, role: agent}\n    - {group: acme-devs, role: agent, org: acme, project: web}\n";
        let cfg = parse(good).unwrap();
        assert_eq!(cfg.auth.issuers[0].groups_claim, "groups");
        assert_eq!(cfg.auth.role_mapping.len(), 3);
        assert_eq!(cfg.auth.issuers[0].org_claim.as_deref(), Some("org"));
        assert_eq!(cfg.auth.role_mapping[2].project.as_deref(), Some("web"));
        assert!(crate::config::schema_violations(good).unwrap().is_empty());
        assert_eq!(parse("").unwrap().auth, AuthConfig::default());
        for (bad, field) in [
            (
                "auth:\n  issuers:\n    - issuer: http://idp.example.com\n      audience: plugd\n",
                "auth.issuers[0].issuer",
            ),
            (
                "auth:\n  issuers:\n    - issuer: https://idp.example.com\n      audience: plugd\n  role_mapping:\n    - {group: a, role: root}\n",
                "auth.role_mapping[0].role",
            ),
            (
                "auth:\n  role_mapping:\n    - {group: a, role: admin}\n",
                "auth.issuers",
            ),
            (
                "auth:\n  issuers:\n    - issuer: https://idp.example.com\n      audience: plugd\n  role_mapping:\n    - {group: a, role: agent, org: \"../x\"}\n",
                "auth.role_mapping[0].org",
            ),
            (
                "auth:\n  issuers:\n    - issuer: https://idp.example.com\n      audience: plugd\n  role_mapping:\n    - {group: a, role: agent, project: p1}\n",
                "auth.role_mapping[0].project",
            ),
            (
                "auth:\n  issuers:\n    - issuer: https://idp.example.com\n      audience: plugd\n      project_claim: project\n",
                "auth.issuers[0].project_claim",
            ),
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        // Unknown keys are refused.
        let e = parse("auth:\n  issuer: https://idp.example.com\n").unwrap_err();
        assert!(e.to_string().contains("issuer"), "{e}");
    }
}
