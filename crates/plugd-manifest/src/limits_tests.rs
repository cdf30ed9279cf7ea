//! Tests of `[plugin.limits]` in the native manifest.

use std::path::Path;

use crate::*;

const BASE: &str =
    "[plugin]\nid = \"lim\"\nversion = \"0.1.0\"\n[plugin.entrypoint]\ncommand = \"/bin/sh\"\n";

fn parse(extra: &str) -> Result<PluginSpec, ManifestError> {
    parse_native(
        &format!("{BASE}{extra}"),
        Path::new("/p/nexo-plugin.toml"),
        Path::new("/p"),
        &LoadOptions::default(),
    )
}

#[test]
fn limits_parse_and_default_to_none() {
    assert_eq!(parse("").unwrap().limits, LimitsSpec::default());
    let spec = parse("[plugin.limits]\ncpu_seconds = 5\naddress_space_mb = 256\nopen_files = 64\nprocesses = 16\n").unwrap();
    assert_eq!(
        spec.limits,
        LimitsSpec {
            address_space_mb: Some(256),
            open_files: Some(64),
            processes: Some(16),
            cpu_seconds: Some(5),
        }
    );
}

#[test]
fn bad_limits_name_the_field() {
    let e = parse("[plugin.limits]\ncpu_seconds = 0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugin.limits.cpu_seconds"), "{e}");
    assert!(
        e.contains("0 is out of range; use a value from 1 to 86400"),
        "{e}"
    );
    let e = parse("[plugin.limits]\nmemory = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugin.limits.memory"), "{e}");
    let e = parse("[plugin.limits]\nopen_files = \"many\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugin.limits.open_files"), "{e}");
}

#[test]
fn the_schema_describes_limits() {
    let schema = native_manifest_schema();
    let limits = &schema["properties"]["plugin"]["properties"]["limits"];
    assert_eq!(limits["additionalProperties"], serde_json::json!(false));
    assert_eq!(
        limits["properties"]["cpu_seconds"]["maximum"],
        serde_json::json!(LimitsSpec::MAX_CPU_SECONDS)
    );
}
