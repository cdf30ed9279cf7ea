//! `plugd.yaml` sections parsed by plugd-governance (`trusted_publishers`,
//! `sandbox:`, `marketplace:`) read through the whole [`PlugdConfig`]: each
//! error names its field and line, and each example matches the JSON Schema.

use std::path::Path;

use ed25519_dalek::SigningKey;
use plugd_control::marketplace::Mode;
use plugd_governance::marketplace::{IndexSource, MarketplaceConfig};
use plugd_governance::signing::keys;
use plugd_host::sandbox::{Fallback, Network};
use plugd_manifest::vai::FilesystemPermission;

use crate::config::{ConfigError, PlugdConfig, schema_violations};

fn parse(text: &str) -> Result<PlugdConfig, ConfigError> {
    PlugdConfig::parse(text, Path::new("/ws/plugd.yaml"), Path::new("/ws"))
}

fn public(seed: u8) -> String {
    keys::public_key_string(&SigningKey::from_bytes(&[seed; 32]).verifying_key())
}

#[test]
fn plugd_yaml_takes_the_policy_and_names_the_line_of_a_bad_key() {
    let path = Path::new("/ws/plugd.yaml");
    let text = format!(
        "require_signatures: true\ntrusted_publishers:\n  - {{name: acme, public_key: \"{}\"}}\n",
        public(1)
    );
    let config = PlugdConfig::parse(&text, path, Path::new("/ws")).unwrap();
    assert_eq!(schema_violations(&text).unwrap(), Vec::<String>::new());
    assert!(config.signing.require_signatures);
    let short = "trusted_publishers: [{name: a, public_key: \"ed25519:AAAA\"}]\n";
    assert_eq!(schema_violations(short).unwrap().len(), 1);
    assert_eq!(config.signing.trusted_publishers[0].name, "acme");

    let bad = "trusted_publishers:\n  - {name: acme, public_key: \"ed25519:AAAA\"}\n  - {name: bob, public_key: \"AAAA\"}\n";
    let err = PlugdConfig::parse(bad, path, Path::new("/ws"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trusted_publishers[0].public_key")
            && err.contains("(line 2)")
            && err.contains("decodes to 3 bytes"),
        "{err}"
    );
    let twice = format!(
        "trusted_publishers:\n  - {{name: a, public_key: \"{k}\"}}\n  - {{name: b, public_key: \"{k}\"}}\n",
        k = public(2)
    );
    let err = PlugdConfig::parse(&twice, path, Path::new("/ws"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trusted_publishers[1].name") && err.contains("(line 3)"),
        "{err}"
    );
    let typo = "trusted_publishers:\n  - {name: a, pubkey: x}\n";
    let err = PlugdConfig::parse(typo, path, Path::new("/ws"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `pubkey`"), "{err}");
}

#[test]
fn sandbox_key_parses_and_matches_the_schema() {
    let text = "sandbox:\n  fallback: landlock\n  plugins:\n    hello_salmex:\n      network: deny\n      fs_read_paths: [/usr/share]\n      fs_write_paths: [\"${state_dir}/cache\"]\n      limits: {cpu_seconds: 5, open_files: 128}\n      grants:\n        summarize: {network: none, filesystem: scratch}\n";
    let c = parse(text).unwrap();
    assert_eq!(c.sandbox.fallback, Fallback::Landlock);
    let p = &c.sandbox.plugins["hello_salmex"];
    assert!(p.enabled);
    assert_eq!(p.network, Some(Network::Deny));
    assert_eq!(p.limits.cpu_seconds, Some(5));
    assert_eq!(
        p.grants["summarize"].filesystem,
        FilesystemPermission::Scratch
    );
    assert_eq!(schema_violations(text).unwrap(), Vec::<String>::new());
}

#[test]
fn a_denylisted_operator_path_is_refused_with_field_and_line() {
    let err = parse("sandbox:\n  plugins:\n    p:\n      fs_read_paths: [/usr/../etc/shadow]\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("/ws/plugd.yaml: sandbox.plugins.p.fs_read_paths[0]: \"/usr/../etc/shadow\" (resolves to \"/etc/shadow\") touches the denylisted path \"/etc/shadow\""),
        "{err}"
    );
    let err = parse("sandbox:\n  plugins:\n    p:\n      network: wide\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("wide"), "{err}");
    let err = parse("sandbox:\n  plugins:\n    p:\n      limits: {cpu_seconds: 0}\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sandbox.plugins.p.limits.cpu_seconds: must be at least 1"),
        "{err}"
    );
}

#[test]
fn baseline_opt_out_parses_matches_the_schema_and_does_not_sandbox() {
    let text = "sandbox:\n  baseline: require\n  plugins:\n    p: {baseline: false}\n    q: {enabled: false}\n    r: {}\n";
    let c = parse(text).unwrap();
    assert!(c.sandbox.require_baseline);
    let p = &c.sandbox.plugins["p"];
    assert!(!p.baseline && !p.sandboxes, "{p:?}");
    let q = &c.sandbox.plugins["q"];
    assert!(q.baseline && !q.enabled, "{q:?}");
    assert!(c.sandbox.plugins["r"].sandboxes);
    assert_eq!(schema_violations(text).unwrap(), Vec::<String>::new());
    let err = parse("sandbox:\n  baseline: maybe\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("maybe"), "{err}");
    assert!(
        !parse("sandbox:\n  baseline: best_effort\n")
            .unwrap()
            .sandbox
            .require_baseline
    );
}

#[test]
fn plugd_yaml_takes_the_marketplace_and_names_the_line_of_a_bad_index() {
    let path = Path::new("/ws/plugd.yaml");
    let text = "marketplace: {index: idx.json, mode: development}\n";
    let c = PlugdConfig::parse(text, path, Path::new("/ws")).unwrap();
    assert_eq!(
        c.marketplace,
        Some(MarketplaceConfig {
            index: IndexSource::File("/ws/idx.json".into()),
            mode: Mode::Development,
        })
    );
    assert_eq!(schema_violations(text).unwrap(), Vec::<String>::new());
    let c = PlugdConfig::parse("marketplace: {index: x.json}\n", path, Path::new("/ws"));
    assert_eq!(c.unwrap().marketplace.unwrap().mode, Mode::Production);
    let bad = "eager: []\nmarketplace:\n  index: http://example.com/i.json\n";
    let err = PlugdConfig::parse(bad, path, Path::new("/ws"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("marketplace.index") && err.contains("(line 3)") && err.contains("https://"),
        "{err}"
    );
    let typo = "marketplace: {index: x, mod: development}\n";
    assert!(PlugdConfig::parse(typo, path, Path::new("/ws")).is_err());
    assert_eq!(schema_violations(typo).unwrap().len(), 1);
}
