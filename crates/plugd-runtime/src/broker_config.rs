//! `plugd.yaml`'s `broker:` section: subjects the operator grants a plugin
//! beyond what its channel kinds give it (nexo §6); and `host_services:`,
//! the operator's least-privilege switch over the nexo host services (off by
//! default: every approved plugin gets the broker bridge, `memory.recall`
//! and `llm.complete`, as the contract's host offers them).
//!
//! ```yaml
//! broker:
//!   grants:
//!     my_plugin:
//!       publish: ["alerts.my_plugin.>"]   # it may also publish here
//!       subscribe: ["alerts.>"]           # and receives these as broker.event
//! host_services:
//!   deny:
//!     my_plugin: [memory, llm]            # answered -32603, named as denied
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use plugd_host::bus::{Allowlist, check_pattern};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use plugd_governance::plugd_yaml::ConfigError;

/// Extra subjects for one plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BrokerGrant {
    /// Patterns it may publish on.
    pub publish: Vec<String>,
    /// Patterns delivered to it.
    pub subscribe: Vec<String>,
}

/// `broker:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BrokerConfig {
    /// Plugin id → its grant.
    pub grants: BTreeMap<String, BrokerGrant>,
}

impl BrokerConfig {
    /// `base` (the channel allowlist) plus what is granted to `plugin`.
    pub fn extend(&self, plugin: &str, mut base: Allowlist) -> Allowlist {
        if let Some(g) = self.grants.get(plugin) {
            base.accept.extend(g.publish.iter().cloned());
            base.deliver.extend(g.subscribe.iter().cloned());
        }
        base
    }
}

/// `host_services:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostServicesConfig {
    /// Plugin id → the services (`broker`, `memory`, `llm`) denied to it.
    pub deny: BTreeMap<String, Vec<String>>,
}

impl HostServicesConfig {
    /// The services denied to `plugin`.
    pub fn denied(&self, plugin: &str) -> Vec<String> {
        self.deny.get(plugin).cloned().unwrap_or_default()
    }
}

/// `host_services:` as read from the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHostServices {
    #[serde(default)]
    deny: Option<BTreeMap<String, Vec<Spanned<String>>>>,
}

/// Validates `host_services:`.
pub fn parse_host_services(
    raw: Spanned<RawHostServices>,
    path: &Path,
) -> Result<HostServicesConfig, ConfigError> {
    let mut config = HostServicesConfig::default();
    for (plugin, list) in raw.value.deny.unwrap_or_default() {
        let mut out = Vec::new();
        for (i, s) in list.into_iter().enumerate() {
            if !plugd_host::native_host::HOST_SERVICES.contains(&s.value.as_str()) {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: format!("host_services.deny.{plugin}[{i}]"),
                    line: s.referenced.line(),
                    message: format!(
                        "{:?} is not a host service; use one of {}",
                        s.value,
                        plugd_host::native_host::HOST_SERVICES.join(", ")
                    ),
                });
            }
            out.push(s.value);
        }
        config.deny.insert(plugin, out);
    }
    Ok(config)
}

/// Whether `name` is a valid provider name (nexo's id rule).
pub fn provider_name_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && name.len() <= 32
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `broker:` as read from the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBroker {
    #[serde(default)]
    grants: Option<BTreeMap<String, RawGrant>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    #[serde(default)]
    publish: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    subscribe: Option<Vec<Spanned<String>>>,
}

/// Validates `broker:` (`path` names the file in errors).
pub fn parse_config(raw: Spanned<RawBroker>, path: &Path) -> Result<BrokerConfig, ConfigError> {
    let invalid = |field: String, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    let mut config = BrokerConfig::default();
    for (plugin, grant) in raw.value.grants.unwrap_or_default() {
        if plugin.trim().is_empty() {
            return Err(invalid(
                "broker.grants".into(),
                raw.referenced.line(),
                "an empty plugin id; use the ids `plugd plugin list` shows".into(),
            ));
        }
        let mut out = BrokerGrant::default();
        for (key, list, into) in [
            ("publish", grant.publish, &mut out.publish),
            ("subscribe", grant.subscribe, &mut out.subscribe),
        ] {
            for (i, p) in list.unwrap_or_default().into_iter().enumerate() {
                check_pattern(&p.value).map_err(|e| {
                    invalid(
                        format!("broker.grants.{plugin}.{key}[{i}]"),
                        p.referenced.line(),
                        e.to_string(),
                    )
                })?;
                into.push(p.value);
            }
        }
        config.grants.insert(plugin, out);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlugdConfig;

    fn parse(text: &str) -> Result<PlugdConfig, ConfigError> {
        PlugdConfig::parse(text, Path::new("/ws/plugd.yaml"), Path::new("/ws"))
    }

    #[test]
    fn grants_extend_the_channel_allowlist() {
        let c = parse(
            "broker:\n  grants:\n    svc:\n      publish: [\"alerts.svc.>\"]\n      subscribe: [\"alerts.>\"]\n",
        )
        .unwrap();
        let list = c.broker.extend("svc", Allowlist::for_channels(&["loop"]));
        assert!(list.may_publish("alerts.svc.disk"));
        assert!(list.may_publish("plugin.inbound.loop"));
        assert!(!list.may_publish("alerts.other"));
        assert!(list.delivers("alerts.any.thing"));
        // Other plugins get nothing extra.
        let other = c.broker.extend("other", Allowlist::default());
        assert_eq!(other, Allowlist::default());
    }

    #[test]
    fn host_services_deny_is_checked() {
        let c = parse("host_services:\n  deny:\n    svc: [memory, llm]\n").unwrap();
        assert_eq!(c.host_services.denied("svc"), ["memory", "llm"]);
        assert!(c.host_services.denied("other").is_empty());
        let e = parse("host_services:\n  deny:\n    svc: [gpu]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("host_services.deny.svc[0]"), "{e}");
        assert!(e.contains("\"gpu\" is not a host service"), "{e}");
        let text = "host_services:\n  deny:\n    svc: [broker]\n";
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        let bad = "host_services:\n  deny:\n    svc: [gpu]\n";
        assert!(!crate::config::schema_violations(bad).unwrap().is_empty());
    }

    #[test]
    fn named_llm_providers_are_read() {
        let c = parse(
            "llm_providers:\n  minimax:\n    provider: openai\n    base_url: http://127.0.0.1:1/v1\n    model: m2\n",
        )
        .unwrap();
        assert!(c.llm_providers.contains_key("minimax"));
        let e = parse(
            "llm_providers:\n  Bad-Name:\n    provider: openai\n    base_url: x\n    model: m\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("llm_providers.Bad-Name"), "{e}");
        let text =
            "llm_providers:\n  minimax: {provider: plugin, plugin: p, name: minimax, model: m}\n";
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
    }

    #[test]
    fn the_schema_knows_the_section() {
        let text = "broker:\n  grants:\n    svc:\n      publish: [\"alerts.>\"]\n";
        assert!(crate::config::schema_violations(text).unwrap().is_empty());
        let bad = "broker:\n  grants:\n    svc:\n      listen: [\"x\"]\n";
        assert!(!crate::config::schema_violations(bad).unwrap().is_empty());
    }

    #[test]
    fn bad_patterns_and_keys_are_named_with_their_line() {
        let e = parse("broker:\n  grants:\n    svc:\n      publish: [\"a.>.b\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broker.grants.svc.publish[0]"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        assert!(e.contains("misuses a wildcard"), "{e}");
        let e = parse("broker:\n  grants:\n    svc:\n      listen: [\"x\"]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen"), "{e}");
    }
}
