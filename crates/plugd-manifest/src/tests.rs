//! Unit tests for the manifest crate: every validation rule, hostile inputs, the schema, and property tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use expect_test::{Expect, expect};
use proptest::prelude::*;

use crate::*;

/// The seed's own example manifest (nexo Plugin Contract §2).
const SLACK: &str = r#"
[plugin]
id = "slack"                       # ASCII slug, ^[a-z][a-z0-9_]{0,31}$
version = "0.2.0"                  # semver
name = "Slack Channel"
description = "..."
min_nexo_version = ">=0.1.0"

[plugin.requires]
nexo_capabilities = ["broker"]

# Phase 81.14 — subprocess entrypoint.
[plugin.entrypoint]
command = "/usr/local/bin/plugin-slack"  # absolute path or PATH binary
args = ["--mode", "stdio"]               # optional
env = { "RUST_LOG" = "info" }            # optional, MUST NOT begin with "NEXO_"

# Phase 81.8 — channel kinds the plugin exposes. Drives the
# broker subscribe / publish allowlist (see §6).
[[plugin.channels.register]]
kind = "slack"
adapter = "SlackChannelAdapter"
"#;

/// A manifest exercising every section.
const FULL: &str = r#"
[plugin]
id = "browser"
version = "0.1.1"

[plugin.entrypoint]
command = "browser-plugin"

[plugin.extends]
channels = ["slack", "discord"]
llm_providers = ["cohere", "mistral"]
memory_backends = ["pinecone", "qdrant"]
hooks = ["pii_redact"]
tools = ["browser_navigate", "ext_browser_click"]

[plugin.supervisor]
start = "eager"
restart_attempts = 5
backoff_base_ms = 200
backoff_max_ms = 5000
stable_after_ms = 30000
init_timeout_ms = 1500
call_timeout_ms = 90000
shutdown_timeout_ms = 500
shutdown_grace_ms = 250

[plugin.sandbox]
enabled = true                        # default false (opt-in)
network = "deny"                       # "deny" | "host"
fs_read_paths = ["/etc/ssl/certs"]    # absolute, ro-bind into sandbox
fs_write_paths = ["${state_dir}"]     # absolute, rw-bind.
drop_user = true
"#;

const MINIMAL: &str = r#"
[plugin]
id = "hello"
version = "0.1.0"

[plugin.entrypoint]
command = "/bin/true"
"#;

fn opts() -> LoadOptions {
    LoadOptions::default()
}

fn parse(text: &str) -> Result<PluginSpec, ManifestError> {
    parse_native(
        text,
        Path::new("nexo-plugin.toml"),
        Path::new("/nonexistent-plugd-test-dir"),
        &opts(),
    )
}

/// `MINIMAL` plus `extra` appended (new tables after the entrypoint).
fn with(extra: &str) -> String {
    format!("{MINIMAL}\n{extra}\n")
}

/// `MINIMAL` with `keys` added inside `[plugin]`.
fn with_plugin_keys(keys: &str) -> String {
    MINIMAL.replacen(
        "version = \"0.1.0\"\n",
        &format!("version = \"0.1.0\"\n{keys}\n"),
        1,
    )
}

fn sandbox(body: &str) -> String {
    with(&format!("[plugin.sandbox]\nenabled = true\n{body}"))
}

fn err(text: &str) -> ManifestError {
    match parse(text) {
        Ok(spec) => panic!("expected an error, got {spec:#?}"),
        Err(e) => e,
    }
}

/// Asserts `Invalid` on exactly `field`.
#[track_caller]
fn assert_invalid(text: &str, want_field: &str) {
    match err(text) {
        ManifestError::Invalid { field, .. } => assert_eq!(field, want_field),
        other => panic!("expected Invalid at {want_field}, got {other:?}"),
    }
}

#[track_caller]
fn check_msg(text: &str, expect: Expect) {
    expect.assert_eq(&err(text).to_string());
}

// ---------------------------------------------------------------- basics

#[test]
fn seed_slack_example_parses() {
    let spec = parse(SLACK).unwrap();
    assert_eq!(spec.id, "slack");
    assert_eq!(spec.version, "0.2.0");
    assert_eq!(spec.name.as_deref(), Some("Slack Channel"));
    assert_eq!(spec.description.as_deref(), Some("..."));
    assert_eq!(spec.dialect, Dialect::Native);
    assert_eq!(spec.command.program, "/usr/local/bin/plugin-slack");
    assert_eq!(spec.command.args, ["--mode", "stdio"]);
    assert_eq!(
        spec.command.env.get("RUST_LOG").map(String::as_str),
        Some("info")
    );
    let native = spec.native.unwrap();
    assert_eq!(native.requires.nexo_capabilities, ["broker"]);
    assert_eq!(native.min_nexo_version.as_deref(), Some(">=0.1.0"));
    assert_eq!(
        native.channels,
        [ChannelRegistration {
            kind: "slack".into(),
            adapter: Some("SlackChannelAdapter".into())
        }]
    );
    assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);
}

#[test]
fn minimal_manifest_gets_all_defaults() {
    let spec = parse(MINIMAL).unwrap();
    assert_eq!(spec.name, None);
    assert_eq!(spec.description, None);
    assert!(spec.command.args.is_empty());
    assert!(spec.command.env.is_empty());
    assert!(spec.declared_tools.is_empty());
    assert!(spec.sandbox.is_none());
    assert!(spec.warnings.is_empty());
    assert_eq!(spec.manifest_path, Path::new("nexo-plugin.toml"));
    assert_eq!(spec.dir, Path::new("/nonexistent-plugd-test-dir"));
    assert_eq!(spec.native, Some(NativeSpec::default()));
    let sup = spec.supervisor;
    assert_eq!(sup, SupervisorSpec::default());
    assert_eq!(sup.start, StartMode::Lazy);
    assert_eq!(sup.restart_attempts, 3);
    assert_eq!(sup.backoff_base, Duration::from_secs(1));
    assert_eq!(sup.backoff_max, Duration::from_secs(60));
    assert_eq!(sup.stable_after, Duration::from_secs(60));
    assert_eq!(sup.init_timeout, None);
    assert_eq!(sup.call_timeout, None);
    assert_eq!(sup.shutdown_timeout, Duration::from_secs(2));
    assert_eq!(sup.shutdown_grace, Duration::from_secs(1));
}

#[test]
fn full_manifest_parses_every_section() {
    let spec = parse(FULL).unwrap();
    assert_eq!(
        spec.command.program, "browser-plugin",
        "bare names stay for PATH lookup"
    );
    assert_eq!(
        spec.declared_tools,
        ["browser_navigate", "ext_browser_click"]
    );
    let ext = &spec.native.as_ref().unwrap().extends;
    assert_eq!(ext.channels, ["slack", "discord"]);
    assert_eq!(ext.llm_providers, ["cohere", "mistral"]);
    assert_eq!(ext.memory_backends, ["pinecone", "qdrant"]);
    assert_eq!(ext.hooks, ["pii_redact"]);
    assert_eq!(ext.tools, spec.declared_tools);
    let sup = &spec.supervisor;
    assert_eq!(sup.start, StartMode::Eager);
    assert_eq!(sup.restart_attempts, 5);
    assert_eq!(sup.backoff_base, Duration::from_millis(200));
    assert_eq!(sup.backoff_max, Duration::from_millis(5000));
    assert_eq!(sup.stable_after, Duration::from_millis(30000));
    assert_eq!(sup.init_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(sup.call_timeout, Some(Duration::from_millis(90000)));
    assert_eq!(sup.shutdown_timeout, Duration::from_millis(500));
    assert_eq!(sup.shutdown_grace, Duration::from_millis(250));
    assert_eq!(
        spec.sandbox,
        Some(SandboxSpec {
            network: SandboxNetwork::Deny,
            fs_read_paths: vec![PathBuf::from("/etc/ssl/certs")],
            fs_write_paths: vec!["${state_dir}".into()],
            drop_user: true,
        })
    );
}

#[test]
fn dialect_displays_lowercase() {
    assert_eq!(Dialect::Native.to_string(), "native");
    assert_eq!(serde_json::to_value(Dialect::Native).unwrap(), "native");
}

#[test]
fn spec_serializes_durations_as_ms() {
    let v = serde_json::to_value(parse(FULL).unwrap()).unwrap();
    assert_eq!(v["dialect"], "native");
    assert_eq!(v["supervisor"]["backoff_base_ms"], 200);
    assert_eq!(v["supervisor"]["init_timeout_ms"], 1500);
    assert_eq!(v["supervisor"]["start"], "eager");
    assert_eq!(v["sandbox"]["network"], "deny");
    let v = serde_json::to_value(parse(MINIMAL).unwrap()).unwrap();
    assert_eq!(v["supervisor"]["call_timeout_ms"], serde_json::Value::Null);
}

// ---------------------------------------------------------------- [plugin]

#[test]
fn plugin_table_is_required() {
    match err("[other]\nx = 1\n") {
        ManifestError::UnknownKey { field, .. } => assert_eq!(field, "other"),
        e => panic!("{e:?}"),
    }
    match err("") {
        ManifestError::MissingField { field, .. } => assert_eq!(field, "plugin"),
        e => panic!("{e:?}"),
    }
    assert_invalid("plugin = 3\n", "plugin");
}

#[test]
fn id_and_version_are_required() {
    let no_id = MINIMAL.replace("id = \"hello\"\n", "");
    match err(&no_id) {
        ManifestError::MissingField { field, .. } => assert_eq!(field, "plugin.id"),
        e => panic!("{e:?}"),
    }
    let no_version = MINIMAL.replace("version = \"0.1.0\"\n", "");
    match err(&no_version) {
        ManifestError::MissingField { field, .. } => assert_eq!(field, "plugin.version"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn id_must_be_a_slug() {
    // TOML source of each bad id.
    for bad in [
        r#""""#,
        r#""Slack""#,
        r#""1abc""#,
        r#""_abc""#,
        r#""a-b""#,
        r#""a b""#,
        r#""héllo""#,
        r#""a\u0000""#,
        r#""abcdefghijklmnopqrstuvwxyz0123456""#,
    ] {
        assert_invalid(&MINIMAL.replace("\"hello\"", bad), "plugin.id");
    }
    assert_invalid(&MINIMAL.replace("\"hello\"", "42"), "plugin.id");
    let max = "a".repeat(32);
    assert_eq!(parse(&MINIMAL.replace("hello", &max)).unwrap().id, max);
    assert!(is_valid_plugin_id("a"));
    assert!(is_valid_plugin_id("a_1"));
    assert!(!is_valid_plugin_id("A"));
}

#[test]
fn version_must_be_semver() {
    for bad in ["1.0", "v1.0.0", "", "1.0.0.0", "latest"] {
        assert_invalid(
            &MINIMAL.replace("\"0.1.0\"", &format!("{bad:?}")),
            "plugin.version",
        );
    }
    assert_eq!(
        parse(&MINIMAL.replace("0.1.0", "1.2.3-rc.1+build"))
            .unwrap()
            .version,
        "1.2.3-rc.1+build"
    );
}

#[test]
fn min_nexo_version_must_be_a_requirement() {
    assert_invalid(
        &with_plugin_keys("min_nexo_version = \"banana\""),
        "plugin.min_nexo_version",
    );
    assert_invalid(
        &with_plugin_keys("min_nexo_version = 1"),
        "plugin.min_nexo_version",
    );
    let spec = parse(&with_plugin_keys("min_nexo_version = \">=0.1, <2\"")).unwrap();
    assert_eq!(
        spec.native.unwrap().min_nexo_version.as_deref(),
        Some(">=0.1, <2")
    );
}

#[test]
fn name_and_description_must_be_strings() {
    assert_invalid(&with_plugin_keys("name = 1"), "plugin.name");
    assert_invalid(
        &with_plugin_keys("description = [\"x\"]"),
        "plugin.description",
    );
}

#[test]
fn unknown_plugin_key_is_a_warning() {
    let spec = parse(&with_plugin_keys(
        "future_field = \"1.10.0\"\n\"we ird\" = 1",
    ))
    .unwrap();
    assert_eq!(
        spec.warnings,
        [
            "plugin.future_field: unknown key ignored (it may be meant for a newer host); remove it or fix its spelling",
            "plugin.\"we ird\": unknown key ignored (it may be meant for a newer host); remove it or fix its spelling",
        ]
    );
}

#[test]
fn contract_version_min_nexo_version_and_requires_are_checked() {
    // The contract major plugd speaks, any minor: accepted.
    assert!(parse(&with_plugin_keys("contract_version = \"1.99.0\"")).is_ok());
    let e = parse(&with_plugin_keys("contract_version = \"2.0.0\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("plugin.contract_version"), "{e}");
    assert!(e.contains("contract major 2 is not supported"), "{e}");
    let e = parse(&with_plugin_keys("contract_version = \"one\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a semver version"), "{e}");
    let e = parse(&with_plugin_keys("min_nexo_version = \">=0.2.0\""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("plugd presents nexo 0.1.5 (contract 1.10.0)"),
        "{e}"
    );
    assert!(parse(&with_plugin_keys("min_nexo_version = \"^0.1\"")).is_ok());
}

#[test]
fn misspelled_containment_sections_are_errors_not_warnings() {
    for (section, field) in [
        ("[plugin.sandbx]\nenabled = true", "plugin.sandbx"),
        ("[plugin.limit]\ncpu_seconds = 1", "plugin.limit"),
        (
            "[plugin.permissions]\nnetwork = \"none\"",
            "plugin.permissions",
        ),
        ("[plugin.Sandbox]\nenabled = true", "plugin.Sandbox"),
    ] {
        let text = format!("{MINIMAL}\n{section}\n");
        match err(&text) {
            ManifestError::Invalid {
                field: f, message, ..
            } => {
                assert_eq!(f, field);
                assert!(message.contains("containment"), "{message}");
            }
            e => panic!("{section}: {e:?}"),
        }
    }
    // In the tolerant [plugin.supervisor] section too.
    let text = format!("{MINIMAL}\n[plugin.supervisor]\nlimits = 3\n");
    assert!(matches!(err(&text), ManifestError::Invalid { .. }));
}

#[test]
fn unknown_top_level_key_is_an_error() {
    match err(&format!("extra = true\n{MINIMAL}")) {
        ManifestError::UnknownKey {
            field, expected, ..
        } => {
            assert_eq!(field, "extra");
            assert_eq!(expected, ["plugin"]);
        }
        e => panic!("{e:?}"),
    }
}

// ---------------------------------------------------------------- [plugin.entrypoint]

#[test]
fn entrypoint_is_required() {
    match err("[plugin]\nid = \"x\"\nversion = \"1.0.0\"\n") {
        ManifestError::MissingField { field, .. } => assert_eq!(field, "plugin.entrypoint"),
        e => panic!("{e:?}"),
    }
    match err("[plugin]\nid = \"x\"\nversion = \"1.0.0\"\n[plugin.entrypoint]\nargs = []\n") {
        ManifestError::MissingField { field, .. } => assert_eq!(field, "plugin.entrypoint.command"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn command_must_be_non_empty_without_nul() {
    assert_invalid(
        &MINIMAL.replace("\"/bin/true\"", "\"\""),
        "plugin.entrypoint.command",
    );
    assert_invalid(
        &MINIMAL.replace("\"/bin/true\"", "\"   \""),
        "plugin.entrypoint.command",
    );
    assert_invalid(
        &MINIMAL.replace("\"/bin/true\"", "\"/bin/tr\\u0000ue\""),
        "plugin.entrypoint.command",
    );
    assert_invalid(
        &MINIMAL.replace("\"/bin/true\"", "[\"/bin/true\"]"),
        "plugin.entrypoint.command",
    );
}

#[test]
fn args_must_be_strings_without_nul() {
    let text = MINIMAL.replace(
        "command = \"/bin/true\"",
        "command = \"/bin/true\"\nargs = [\"a\", 2]",
    );
    assert_invalid(&text, "plugin.entrypoint.args[1]");
    let text = MINIMAL.replace(
        "command = \"/bin/true\"",
        "command = \"/bin/true\"\nargs = \"a\"",
    );
    assert_invalid(&text, "plugin.entrypoint.args");
    let text = MINIMAL.replace(
        "command = \"/bin/true\"",
        "command = \"/bin/true\"\nargs = [\"a\\u0000\"]",
    );
    assert_invalid(&text, "plugin.entrypoint.args[0]");
}

fn with_env(env: &str) -> String {
    MINIMAL.replace(
        "command = \"/bin/true\"",
        &format!("command = \"/bin/true\"\nenv = {{ {env} }}"),
    )
}

#[test]
fn env_key_reserved_prefixes_are_refused() {
    for key in [
        "NEXO_TOKEN",
        "PLUGD_SOCKET",
        "nexo_token",
        "Plugd_X",
        "NEXO_",
    ] {
        match err(&with_env(&format!("{key:?} = \"x\""))) {
            ManifestError::ReservedEnvKey { field, key: k, .. } => {
                assert_eq!(field, "plugin.entrypoint.env");
                assert_eq!(k, key);
            }
            e => panic!("{key}: {e:?}"),
        }
    }
    let spec = parse(&with_env(
        "NEXOX = \"1\", MY_NEXO_TOKEN = \"2\", PLUGDX = \"3\"",
    ))
    .unwrap();
    assert_eq!(spec.command.env.len(), 3);
}

#[test]
fn env_keys_and_values_are_checked() {
    assert_invalid(&with_env("\"A=B\" = \"x\""), "plugin.entrypoint.env");
    assert_invalid(&with_env("\"\" = \"x\""), "plugin.entrypoint.env");
    assert_invalid(&with_env("\"A\\u0000\" = \"x\""), "plugin.entrypoint.env");
    assert_invalid(&with_env("A = 1"), "plugin.entrypoint.env.A");
    assert_invalid(&with_env("A = \"x\\u0000y\""), "plugin.entrypoint.env.A");
    let text = MINIMAL.replace(
        "command = \"/bin/true\"",
        "command = \"/bin/true\"\nenv = [\"A=1\"]",
    );
    assert_invalid(&text, "plugin.entrypoint.env");
}

#[test]
fn unknown_entrypoint_key_is_an_error() {
    let text = MINIMAL.replace(
        "command = \"/bin/true\"",
        "command = \"/bin/true\"\ncwd = \"/\"",
    );
    match err(&text) {
        ManifestError::UnknownKey {
            field, expected, ..
        } => {
            assert_eq!(field, "plugin.entrypoint.cwd");
            assert_eq!(expected, ["command", "args", "env"]);
        }
        e => panic!("{e:?}"),
    }
}

/// A plugin directory with `bin/plugin` (executable) and a manifest.
fn plugin_dir(command: &str) -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("hello");
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let bin = dir.join("bin/plugin");
    std::fs::write(&bin, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let manifest = dir.join(NATIVE_MANIFEST_FILE);
    std::fs::write(&manifest, MINIMAL.replace("/bin/true", command)).unwrap();
    (tmp, manifest)
}

#[test]
fn relative_command_resolves_inside_plugin_dir() {
    for command in ["./bin/plugin", "bin/plugin", "bin/../bin/./plugin"] {
        let (_tmp, manifest) = plugin_dir(command);
        let spec = load_native(&manifest, &opts()).unwrap();
        let dir = std::fs::canonicalize(manifest.parent().unwrap()).unwrap();
        assert_eq!(spec.dir, dir);
        assert_eq!(spec.manifest_path, dir.join(NATIVE_MANIFEST_FILE));
        assert_eq!(
            Path::new(&spec.command.program),
            dir.join("bin/plugin"),
            "{command}"
        );
        assert!(spec.warnings.is_empty(), "{:?}", spec.warnings);
    }
}

#[test]
fn relative_command_that_does_not_exist_yet_is_a_warning() {
    let (_tmp, manifest) = plugin_dir("./target/release/plugin");
    let spec = load_native(&manifest, &opts()).unwrap();
    assert!(
        spec.command
            .program
            .ends_with("/hello/target/release/plugin")
    );
    assert_eq!(spec.warnings.len(), 1);
    assert!(
        spec.warnings[0].contains("does not exist yet"),
        "{:?}",
        spec.warnings
    );
}

#[test]
fn relative_command_not_executable_is_a_warning() {
    let (_tmp, manifest) = plugin_dir("./data.txt");
    std::fs::write(manifest.parent().unwrap().join("data.txt"), "x").unwrap();
    let spec = load_native(&manifest, &opts()).unwrap();
    assert!(
        spec.warnings[0].contains("not executable"),
        "{:?}",
        spec.warnings
    );
}

#[test]
fn relative_command_escaping_plugin_dir_is_refused() {
    for command in ["../../bin/sh", "./bin/../../x", "./", "bin/.."] {
        let (_tmp, manifest) = plugin_dir(command);
        match load_native(&manifest, &opts()) {
            Err(ManifestError::CommandEscapesPluginDir {
                field, command: c, ..
            }) => {
                assert_eq!(field, "plugin.entrypoint.command");
                assert_eq!(c, command);
            }
            other => panic!("{command}: {other:?}"),
        }
    }
}

#[test]
fn relative_command_symlink_out_of_plugin_dir_is_refused() {
    let (_tmp, manifest) = plugin_dir("./bin/evil");
    std::os::unix::fs::symlink("/bin/sh", manifest.parent().unwrap().join("bin/evil")).unwrap();
    match load_native(&manifest, &opts()) {
        Err(ManifestError::CommandEscapesPluginDir { resolved, .. }) => {
            assert!(!resolved.starts_with(manifest.parent().unwrap()));
        }
        other => panic!("{other:?}"),
    }
    // A directory symlink on the way out is caught too.
    let (_tmp, manifest) = plugin_dir("./up/sh");
    std::os::unix::fs::symlink("/bin", manifest.parent().unwrap().join("up")).unwrap();
    assert!(matches!(
        load_native(&manifest, &opts()),
        Err(ManifestError::CommandEscapesPluginDir { .. })
    ));
}

#[test]
fn relative_command_pointing_at_a_directory_is_refused() {
    let (_tmp, manifest) = plugin_dir("./bin");
    match load_native(&manifest, &opts()) {
        Err(ManifestError::Invalid { field, .. }) => assert_eq!(field, "plugin.entrypoint.command"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn relative_plugin_dir_is_made_absolute() {
    // Tests run in the crate directory.
    let text = MINIMAL.replace("/bin/true", "./Cargo.toml");
    let spec = parse_native(
        &text,
        Path::new("nexo-plugin.toml"),
        Path::new("."),
        &opts(),
    )
    .unwrap();
    let cwd = std::fs::canonicalize(".").unwrap();
    assert_eq!(spec.dir, cwd);
    assert_eq!(Path::new(&spec.command.program), cwd.join("Cargo.toml"));
}

#[test]
fn absolute_and_bare_commands_are_kept_as_given() {
    assert_eq!(parse(MINIMAL).unwrap().command.program, "/bin/true");
    let spec = parse(&MINIMAL.replace("/bin/true", "/usr/../bin/true")).unwrap();
    assert_eq!(spec.command.program, "/usr/../bin/true");
    let spec = parse(&MINIMAL.replace("/bin/true", "python3")).unwrap();
    assert_eq!(spec.command.program, "python3");
}

// ---------------------------------------------------------------- [plugin.extends]

#[test]
fn extends_ids_must_be_slugs() {
    assert_invalid(
        &with("[plugin.extends]\nhooks = [\"ok\", \"Bad\"]"),
        "plugin.extends.hooks[1]",
    );
    assert_invalid(
        &with("[plugin.extends]\nchannels = [\"\"]"),
        "plugin.extends.channels[0]",
    );
    assert_invalid(
        &with("[plugin.extends]\nchannels = [1]"),
        "plugin.extends.channels[0]",
    );
    assert_invalid(
        &with("[plugin.extends]\nchannels = \"slack\""),
        "plugin.extends.channels",
    );
    assert_invalid(&with_plugin_keys("extends = 1"), "plugin.extends");
}

#[test]
fn extends_duplicates_within_a_list_are_refused() {
    let e = err(&with(
        "[plugin.extends]\nllm_providers = [\"a\", \"b\", \"a\"]",
    ));
    assert_eq!(e.field(), Some("plugin.extends.llm_providers[2]"));
    assert!(
        e.to_string()
            .contains("listed twice (first at plugin.extends.llm_providers[0])"),
        "{e}"
    );
}

#[test]
fn extends_duplicates_across_lists_are_refused() {
    let e = err(&with(
        "[plugin.extends]\nchannels = [\"x\"]\nmemory_backends = [\"y\"]\nhooks = [\"x\"]",
    ));
    assert!(matches!(e, ManifestError::Invalid { .. }));
    assert_eq!(e.field(), Some("plugin.extends.hooks[0]"));
    assert!(
        e.to_string()
            .contains("already declared at plugin.extends.channels[0]"),
        "{e}"
    );
    let e = err(&with(
        "[plugin.extends]\nchannels = [\"hello_x\"]\ntools = [\"hello_x\"]",
    ));
    assert_eq!(e.field(), Some("plugin.extends.tools[0]"));
}

#[test]
fn extends_unknown_key_is_an_error() {
    match err(&with("[plugin.extends]\nwidgets = []")) {
        ManifestError::UnknownKey {
            field, expected, ..
        } => {
            assert_eq!(field, "plugin.extends.widgets");
            assert_eq!(expected, EXTENDS_SECTIONS);
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn tools_must_be_in_the_plugin_namespace() {
    let spec = parse(&with(
        "[plugin.extends]\ntools = [\"hello_x\", \"ext_hello_y\"]",
    ))
    .unwrap();
    assert_eq!(spec.declared_tools, ["hello_x", "ext_hello_y"]);
    for (bad, idx) in [
        ("other_x", 1),
        ("hello_", 1),
        ("hello", 1),
        ("ext_hello_", 1),
        ("ext_other_x", 1),
    ] {
        match err(&with(&format!(
            "[plugin.extends]\ntools = [\"hello_ok\", {bad:?}]"
        ))) {
            ManifestError::ToolOutsideNamespace {
                field,
                tool,
                plugin_id,
                ..
            } => {
                assert_eq!(field, format!("plugin.extends.tools[{idx}]"));
                assert_eq!(tool, bad);
                assert_eq!(plugin_id, "hello");
            }
            e => panic!("{bad}: {e:?}"),
        }
    }
    // Namespace does not excuse the slug rule.
    assert_invalid(
        &with("[plugin.extends]\ntools = [\"hello_X\"]"),
        "plugin.extends.tools[0]",
    );
}

#[test]
fn tool_namespace_rule() {
    assert!(tool_in_namespace("hello", "hello_x"));
    assert!(tool_in_namespace("hello", "ext_hello_x"));
    assert!(tool_in_namespace("hello", "hello_x_y"));
    assert!(tool_in_namespace("ext", "ext_ext_x"));
    assert!(!tool_in_namespace("hello", "other_x"));
    assert!(!tool_in_namespace("hello", "hello_"));
    assert!(!tool_in_namespace("hello", "hello"));
    assert!(!tool_in_namespace("hello", "helloworld"));
    assert!(!tool_in_namespace("hello", "ext_hello_"));
    assert!(!tool_in_namespace("hello", "ext_hello"));
    assert!(!tool_in_namespace("hello", "ext_helloo_x"));
    assert!(!tool_in_namespace("", "_x"));
}

// ---------------------------------------------------------------- [[plugin.channels.register]]

#[test]
fn channel_registrations() {
    let spec = parse(&with("[[plugin.channels.register]]\nkind = \"a\"\n[[plugin.channels.register]]\nkind = \"b\"\nadapter = \"B\"")).unwrap();
    let ch = spec.native.unwrap().channels;
    assert_eq!(ch.len(), 2);
    assert_eq!(ch[0].adapter, None);
    assert_eq!(ch[1].adapter.as_deref(), Some("B"));
}

#[test]
fn channel_kinds_are_slugs_and_unique() {
    assert_invalid(
        &with("[[plugin.channels.register]]\nkind = \"Slack\""),
        "plugin.channels.register[0].kind",
    );
    assert_invalid(
        &with(
            "[[plugin.channels.register]]\nkind = \"a\"\n[[plugin.channels.register]]\nkind = \"a\"",
        ),
        "plugin.channels.register[1].kind",
    );
    match err(&with("[[plugin.channels.register]]\nadapter = \"X\"")) {
        ManifestError::MissingField { field, .. } => {
            assert_eq!(field, "plugin.channels.register[0].kind")
        }
        e => panic!("{e:?}"),
    }
    assert_invalid(
        &with("[[plugin.channels.register]]\nkind = \"a\"\nadapter = 1"),
        "plugin.channels.register[0].adapter",
    );
    assert_invalid(
        &with("[plugin.channels]\nregister = [1]"),
        "plugin.channels.register[0]",
    );
    assert_invalid(
        &with("[plugin.channels]\nregister = {kind = \"a\"}"),
        "plugin.channels.register",
    );
}

#[test]
fn channel_unknown_keys_are_errors() {
    match err(&with(
        "[[plugin.channels.register]]\nkind = \"a\"\ntopic = \"x\"",
    )) {
        ManifestError::UnknownKey { field, .. } => {
            assert_eq!(field, "plugin.channels.register[0].topic")
        }
        e => panic!("{e:?}"),
    }
    match err(&with("[plugin.channels]\nsubscribe = []")) {
        ManifestError::UnknownKey { field, .. } => assert_eq!(field, "plugin.channels.subscribe"),
        e => panic!("{e:?}"),
    }
}

// ---------------------------------------------------------------- [plugin.requires]

#[test]
fn requires_capabilities() {
    let spec = parse(&with(
        "[plugin.requires]\nnexo_capabilities = [\"broker\", \"memory\"]",
    ))
    .unwrap();
    assert_eq!(
        spec.native.unwrap().requires.nexo_capabilities,
        ["broker", "memory"]
    );
    assert_invalid(
        &with("[plugin.requires]\nnexo_capabilities = [true]"),
        "plugin.requires.nexo_capabilities[0]",
    );
    // Something plugd cannot provide refuses the plugin, naming it.
    let e = parse(&with(
        "[plugin.requires]\nnexo_capabilities = [\"broker\", \"gpu\"]",
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("plugin.requires.nexo_capabilities[1]"), "{e}");
    assert!(e.contains("\"gpu\", which plugd cannot provide"), "{e}");
    assert_invalid(
        &with("[plugin.requires]\nnexo_capabilities = [\"\"]"),
        "plugin.requires.nexo_capabilities[0]",
    );
    match err(&with("[plugin.requires]\nnexo_version = \"1\"")) {
        ManifestError::UnknownKey { field, .. } => {
            assert_eq!(field, "plugin.requires.nexo_version")
        }
        e => panic!("{e:?}"),
    }
}

// ---------------------------------------------------------------- [plugin.supervisor]

#[test]
fn supervisor_unknown_key_is_a_warning() {
    let spec = parse(&with(
        "[plugin.supervisor]\nstderr_tail_lines = 50\nrestart_attempts = 0",
    ))
    .unwrap();
    assert_eq!(spec.supervisor.restart_attempts, 0);
    assert_eq!(spec.warnings.len(), 1);
    assert!(
        spec.warnings[0].starts_with("plugin.supervisor.stderr_tail_lines: unknown key ignored")
    );
}

#[test]
fn supervisor_values_must_be_sane() {
    let sup = |body: &str| with(&format!("[plugin.supervisor]\n{body}"));
    assert_invalid(&sup("start = \"now\""), "plugin.supervisor.start");
    assert_invalid(&sup("start = true"), "plugin.supervisor.start");
    assert_invalid(
        &sup("restart_attempts = 101"),
        "plugin.supervisor.restart_attempts",
    );
    assert_invalid(
        &sup("restart_attempts = -1"),
        "plugin.supervisor.restart_attempts",
    );
    assert_invalid(
        &sup("restart_attempts = 1.5"),
        "plugin.supervisor.restart_attempts",
    );
    assert_invalid(
        &sup("restart_attempts = \"3\""),
        "plugin.supervisor.restart_attempts",
    );
    assert_invalid(
        &sup("backoff_base_ms = 2000\nbackoff_max_ms = 1000"),
        "plugin.supervisor.backoff_base_ms",
    );
    assert_invalid(
        &sup("backoff_base_ms = 120000"),
        "plugin.supervisor.backoff_base_ms",
    );
    for key in [
        "backoff_base_ms",
        "backoff_max_ms",
        "stable_after_ms",
        "init_timeout_ms",
        "call_timeout_ms",
        "shutdown_timeout_ms",
        "shutdown_grace_ms",
    ] {
        let field = format!("plugin.supervisor.{key}");
        assert_invalid(&sup(&format!("{key} = 0")), &field);
        assert_invalid(&sup(&format!("{key} = -5")), &field);
        assert_invalid(&sup(&format!("{key} = 3600001")), &field);
        assert_invalid(&sup(&format!("{key} = 9223372036854775807")), &field);
    }
    let spec = parse(&sup(
        "backoff_max_ms = 3600000\ncall_timeout_ms = 3600000\nrestart_attempts = 100",
    ))
    .unwrap();
    assert_eq!(
        spec.supervisor.call_timeout,
        Some(Duration::from_secs(3600))
    );
    assert_eq!(spec.supervisor.restart_attempts, 100);
    assert_invalid(
        &with_plugin_keys("supervisor = \"eager\""),
        "plugin.supervisor",
    );
}

// ---------------------------------------------------------------- [plugin.sandbox]

#[test]
fn sandbox_defaults() {
    let spec = parse(&sandbox("")).unwrap();
    assert_eq!(
        spec.sandbox,
        Some(SandboxSpec {
            network: SandboxNetwork::Deny,
            fs_read_paths: vec![],
            fs_write_paths: vec![],
            drop_user: true,
        })
    );
    let spec = parse(&with("[plugin.sandbox]\nfs_read_paths = [\"/usr/share\"]")).unwrap();
    assert_eq!(spec.sandbox, None, "enabled defaults to false");
    let spec = parse(&sandbox("drop_user = false")).unwrap();
    assert!(!spec.sandbox.unwrap().drop_user);
}

#[test]
fn sandbox_is_validated_even_when_disabled() {
    let text = with("[plugin.sandbox]\nenabled = false\nfs_read_paths = [\"/etc\"]");
    assert!(matches!(
        err(&text),
        ManifestError::SandboxAllowlistTouchesDenylist { .. }
    ));
    let text = with("[plugin.sandbox]\nenabled = false\nnetwork = \"host\"");
    assert!(matches!(
        err(&text),
        ManifestError::SandboxHostNetworkWithoutCapability { .. }
    ));
}

#[test]
fn sandbox_host_network_needs_operator_capability() {
    match err(&sandbox("network = \"host\"")) {
        ManifestError::SandboxHostNetworkWithoutCapability { field, .. } => {
            assert_eq!(field, "plugin.sandbox.network");
        }
        e => panic!("{e:?}"),
    }
    let allow = LoadOptions {
        sandbox_host_net_allow: true,
    };
    let spec = parse_native(
        &sandbox("network = \"host\""),
        Path::new("m"),
        Path::new("/x"),
        &allow,
    )
    .unwrap();
    assert_eq!(spec.sandbox.unwrap().network, SandboxNetwork::Host);
    assert_invalid(
        &sandbox("network = \"allowlist\""),
        "plugin.sandbox.network",
    );
    assert_invalid(&sandbox("network = false"), "plugin.sandbox.network");
}

#[test]
fn sandbox_field_types_and_unknown_keys() {
    assert_invalid(&sandbox("drop_user = \"yes\""), "plugin.sandbox.drop_user");
    assert_invalid(
        &with("[plugin.sandbox]\nenabled = 1"),
        "plugin.sandbox.enabled",
    );
    assert_invalid(
        &sandbox("fs_read_paths = \"/usr\""),
        "plugin.sandbox.fs_read_paths",
    );
    assert_invalid(
        &sandbox("fs_write_paths = [1]"),
        "plugin.sandbox.fs_write_paths[0]",
    );
    match err(&sandbox("network_allowlist = [\"a:1\"]")) {
        ManifestError::UnknownKey { field, .. } => {
            assert_eq!(field, "plugin.sandbox.network_allowlist")
        }
        e => panic!("{e:?}"),
    }
}

#[track_caller]
fn assert_relative(body: &str, want_field: &str) {
    match err(&sandbox(body)) {
        ManifestError::SandboxRelativePath { field, .. } => assert_eq!(field, want_field),
        e => panic!("{e:?}"),
    }
}

#[test]
fn sandbox_paths_must_be_absolute() {
    assert_relative(
        "fs_read_paths = [\"/usr\", \"usr/share\"]",
        "plugin.sandbox.fs_read_paths[1]",
    );
    assert_relative("fs_read_paths = [\"\"]", "plugin.sandbox.fs_read_paths[0]");
    assert_relative(
        "fs_read_paths = [\"./x\"]",
        "plugin.sandbox.fs_read_paths[0]",
    );
    assert_relative(
        "fs_write_paths = [\"data\"]",
        "plugin.sandbox.fs_write_paths[0]",
    );
    assert_relative(
        "fs_write_paths = [\"$state_dir/x\"]",
        "plugin.sandbox.fs_write_paths[0]",
    );
}

#[track_caller]
fn assert_denied(body: &str, want_field: &str, want_denied: &str) {
    match err(&sandbox(body)) {
        ManifestError::SandboxAllowlistTouchesDenylist { field, denied, .. } => {
            assert_eq!(field, want_field);
            assert_eq!(denied, want_denied);
        }
        e => panic!("{body}: {e:?}"),
    }
}

#[test]
fn sandbox_denylist_is_the_seed_list() {
    assert_eq!(
        SANDBOX_DENYLIST,
        [
            "/etc/shadow",
            "/etc/sudoers",
            "/etc/sudoers.d",
            "/proc/sys",
            "/proc/kcore",
            "/proc/kallsyms",
            "/sys/firmware",
            "/sys/kernel",
            "/dev/mem",
            "/dev/kmem",
            "/dev/port",
            "/var/run/docker.sock",
            "/run/docker.sock",
            "/private/var/run/docker.sock",
            "/root",
            "/boot",
        ]
    );
}

#[test]
fn sandbox_denylisted_paths_are_refused() {
    let read = "plugin.sandbox.fs_read_paths[0]";
    assert_denied("fs_read_paths = [\"/etc/shadow\"]", read, "/etc/shadow");
    assert_denied(
        "fs_read_paths = [\"/usr/../etc/shadow\"]",
        read,
        "/etc/shadow",
    );
    assert_denied("fs_read_paths = [\"/etc/./shadow/\"]", read, "/etc/shadow");
    assert_denied("fs_read_paths = [\"//etc//shadow\"]", read, "/etc/shadow");
    assert_denied("fs_read_paths = [\"/\"]", read, "/etc/shadow");
    assert_denied("fs_read_paths = [\"/etc\"]", read, "/etc/shadow");
    assert_denied("fs_read_paths = [\"/root/.ssh\"]", read, "/root");
    assert_denied("fs_read_paths = [\"/root/does/not/exist\"]", read, "/root");
    assert_denied("fs_read_paths = [\"/proc/sys/kernel\"]", read, "/proc/sys");
    assert_denied("fs_read_paths = [\"/proc\"]", read, "/proc/sys");
    assert_denied(
        "fs_read_paths = [\"/var/run\"]",
        read,
        "/var/run/docker.sock",
    );
    assert_denied("fs_read_paths = [\"/nonexistent/../boot\"]", read, "/boot");
    assert_denied(
        "fs_read_paths = [\"/usr/share\", \"/dev\"]",
        "plugin.sandbox.fs_read_paths[1]",
        "/dev/mem",
    );
    assert_denied(
        "fs_write_paths = [\"${state_dir}\", \"/sys/kernel/debug\"]",
        "plugin.sandbox.fs_write_paths[1]",
        "/sys/kernel",
    );
}

#[test]
fn sandbox_harmless_paths_pass() {
    let spec = parse(&sandbox(
        "fs_read_paths = [\"/usr/share\", \"/etc/ssl/certs\", \"/etc/hosts\", \"/opt/not/there\", \"/rootfs\"]\nfs_write_paths = [\"/tmp/plugd-x\"]",
    ))
    .unwrap();
    let sb = spec.sandbox.unwrap();
    assert_eq!(sb.fs_read_paths.len(), 5);
    assert_eq!(
        sb.fs_read_paths[0],
        Path::new("/usr/share"),
        "stored as written"
    );
    assert_eq!(sb.fs_write_paths, ["/tmp/plugd-x"]);
    assert!(check_sandbox_path(Path::new("/usr/share")).is_ok());
    assert!(check_sandbox_path(Path::new("/etc/ssl/certs")).is_ok());
}

#[test]
fn sandbox_symlink_to_denylisted_path_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("innocent");
    std::os::unix::fs::symlink("/root", &link).unwrap();
    let nested = tmp.path().join("nested");
    std::os::unix::fs::symlink("/etc/../root/.ssh", &nested).unwrap();
    let relative = tmp.path().join("rel");
    std::os::unix::fs::symlink("../../../../../../../../boot", &relative).unwrap();
    let dangling = tmp.path().join("dangling");
    std::os::unix::fs::symlink("/root/not-created-yet", &dangling).unwrap();
    let chain = tmp.path().join("chain");
    std::os::unix::fs::symlink(&link, &chain).unwrap();
    for (p, denied) in [
        (link.clone(), "/root"),
        (link.join(".ssh/id_rsa"), "/root"),
        (nested, "/root"),
        (relative, "/boot"),
        (dangling, "/root"),
        (chain, "/root"),
        (tmp.path().join("innocent/../etc"), "/etc/shadow"),
    ] {
        let entry = p.to_str().unwrap();
        assert_denied(
            &format!("fs_read_paths = [{entry:?}]"),
            "plugin.sandbox.fs_read_paths[0]",
            denied,
        );
        match check_sandbox_path(&p) {
            Err(SandboxPathError::Denylisted { denied: d, .. }) => assert_eq!(d, denied),
            other => panic!("{}: {other:?}", p.display()),
        }
    }
    // The tempdir itself is fine, and resolves to its canonical form.
    let canon = std::fs::canonicalize(tmp.path()).unwrap();
    assert_eq!(check_sandbox_path(tmp.path()).unwrap(), canon);
    assert_eq!(
        check_sandbox_path(&tmp.path().join("new/dir")).unwrap(),
        canon.join("new/dir")
    );
}

#[test]
fn sandbox_symlink_loop_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    assert!(matches!(
        check_sandbox_path(&a),
        Err(SandboxPathError::SymlinkLoop { .. })
    ));
    let entry = a.to_str().unwrap();
    assert_invalid(
        &sandbox(&format!("fs_read_paths = [{entry:?}]")),
        "plugin.sandbox.fs_read_paths[0]",
    );
}

#[test]
fn resolve_path_matches_canonicalize_for_existing_paths() {
    for p in ["/", "/usr", "/usr/bin/..", "/proc/self/..", "/tmp/."] {
        assert_eq!(
            resolve_path(Path::new(p)).unwrap(),
            std::fs::canonicalize(p).unwrap(),
            "{p}"
        );
    }
    assert_eq!(
        resolve_path(Path::new("/../../..")).unwrap(),
        Path::new("/")
    );
}

#[test]
fn sandbox_state_dir_forms() {
    let spec = parse(&sandbox(
        "fs_write_paths = [\"${state_dir}\", \"${state_dir}/cache\", \"${state_dir}/a/b/\", \"${state_dir}\"]",
    ))
    .unwrap();
    assert_eq!(
        spec.sandbox.unwrap().fs_write_paths,
        ["${state_dir}", "${state_dir}/cache", "${state_dir}/a/b/"]
    );
    assert_eq!(STATE_DIR_TOKEN, "${state_dir}");
}

#[test]
fn sandbox_bad_interpolation_is_refused() {
    for (list, entry) in [
        ("fs_write_paths", "${state_dir}x"),
        ("fs_write_paths", "${state_dir}.."),
        ("fs_write_paths", "${state_dir}/../etc"),
        ("fs_write_paths", "${state_dir}/a/../../x"),
        ("fs_write_paths", "${state_dir}/${state_dir}"),
        ("fs_write_paths", "${state_dir}/${HOME}"),
        ("fs_write_paths", "${HOME}/x"),
        ("fs_write_paths", "${STATE_DIR}"),
        ("fs_write_paths", "${ state_dir }"),
        ("fs_write_paths", "/data/${state_dir}"),
        ("fs_write_paths", "${"),
        ("fs_read_paths", "${state_dir}"),
        ("fs_read_paths", "/usr/${x}"),
    ] {
        match err(&sandbox(&format!("{list} = [\"/tmp\", {entry:?}]"))) {
            ManifestError::SandboxInvalidStateDirInterpolation {
                field, entry: e, ..
            } => {
                assert_eq!(field, format!("plugin.sandbox.{list}[1]"));
                assert_eq!(e, entry);
            }
            e => panic!("{entry}: {e:?}"),
        }
    }
}

// ---------------------------------------------------------------- file-level errors

#[test]
fn syntax_errors_report_line_and_column() {
    match err("[plugin]\nid = \"x\"\nversion = = \"1\"\n") {
        ManifestError::Syntax {
            line,
            column,
            message,
            ..
        } => {
            assert_eq!(line, 3);
            assert!((9..=11).contains(&column), "column {column}");
            assert!(!message.is_empty());
            assert!(!message.contains('\n'));
        }
        e => panic!("{e:?}"),
    }
    // Multi-byte characters count as one column.
    match err("# ééé\nname = \"é\" x\n") {
        ManifestError::Syntax { line, column, .. } => {
            assert_eq!(line, 2);
            assert!((10..=12).contains(&column), "column {column}");
        }
        e => panic!("{e:?}"),
    }
    // Duplicate keys are syntax errors in TOML.
    assert!(matches!(
        err(&format!("{MINIMAL}\n[plugin]\n")),
        ManifestError::Syntax { .. }
    ));
}

#[test]
fn oversized_manifest_is_refused() {
    let big = format!("{MINIMAL}#{}\n", "x".repeat(1024 * 1024));
    match err(&big) {
        ManifestError::TooLarge { size, limit, .. } => {
            assert_eq!(limit, MAX_MANIFEST_BYTES);
            assert!(size > limit);
        }
        e => panic!("{e:?}"),
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(NATIVE_MANIFEST_FILE);
    std::fs::write(&path, &big).unwrap();
    assert!(matches!(
        load_native(&path, &opts()),
        Err(ManifestError::TooLarge { .. })
    ));
    // Exactly at the limit is fine size-wise.
    let pad = MAX_MANIFEST_BYTES as usize - MINIMAL.len() - 2;
    let exact = format!("{MINIMAL}#{}\n", "x".repeat(pad));
    assert_eq!(exact.len() as u64, MAX_MANIFEST_BYTES);
    assert!(parse(&exact).is_ok());
}

#[test]
fn non_utf8_manifest_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(NATIVE_MANIFEST_FILE);
    let mut bytes = b"[plugin]\nid = \"".to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe]);
    bytes.extend_from_slice(b"\"\n");
    std::fs::write(&path, &bytes).unwrap();
    match load_native(&path, &opts()) {
        Err(ManifestError::NotUtf8 { offset, path: p }) => {
            assert_eq!(offset, 15);
            assert_eq!(p, path);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unreadable_manifests_are_io_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.toml");
    assert!(matches!(
        load_native(&missing, &opts()),
        Err(ManifestError::Io { .. })
    ));
    assert!(matches!(
        load_native(tmp.path(), &opts()),
        Err(ManifestError::Io { .. })
    ));
}

#[test]
fn deeply_nested_input_does_not_overflow_the_stack() {
    let deep = format!("x = {}", "[".repeat(100_000));
    assert!(matches!(err(&deep), ManifestError::Syntax { .. }));
    let deep = format!("x = {}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse(&deep).is_err());
    let deep = format!("x = {}", "{a = ".repeat(50_000));
    assert!(parse(&deep).is_err());
}

// ---------------------------------------------------------------- messages

#[test]
fn error_messages() {
    check_msg(
        &with_env("\"NEXO_TOKEN\" = \"x\""),
        expect![[
            r#"nexo-plugin.toml: plugin.entrypoint.env: key "NEXO_TOKEN" is reserved (NEXO_ and PLUGD_ prefixes belong to the host); rename it"#
        ]],
    );
    check_msg(
        &MINIMAL.replace("\"hello\"", "\"Hello\\n\""),
        expect![[
            r#"nexo-plugin.toml: plugin.id: "Hello\n" is not a valid plugin id; use 1-32 characters of a-z, 0-9 and _, starting with a letter (e.g. "my_plugin")"#
        ]],
    );
    check_msg(
        &with("[plugin.extends]\ntools = [\"other_x\"]"),
        expect![[
            r#"nexo-plugin.toml: plugin.extends.tools[0]: tool "other_x" is outside the namespace of plugin "hello"; name it "hello_<name>" or "ext_hello_<name>""#
        ]],
    );
    check_msg(
        &sandbox("fs_read_paths = [\"/usr/../etc/shadow\"]"),
        expect![[
            r#"nexo-plugin.toml: plugin.sandbox.fs_read_paths[0]: "/usr/../etc/shadow" (resolves to "/etc/shadow") touches the denylisted path "/etc/shadow"; bind a narrower path that neither contains nor lies inside it"#
        ]],
    );
    check_msg(
        &sandbox("fs_write_paths = [\"${home}\"]"),
        expect![[
            r#"nexo-plugin.toml: plugin.sandbox.fs_write_paths[0]: "${home}": "${...}" is only allowed as the leading "${state_dir}"; the only interpolation allowed is "${state_dir}" alone or as a prefix "${state_dir}/sub/dir" in fs_write_paths"#
        ]],
    );
    check_msg(
        &sandbox("fs_read_paths = [\"etc\"]"),
        expect![[
            r#"nexo-plugin.toml: plugin.sandbox.fs_read_paths[0]: "etc" is not an absolute path; sandbox binds need absolute paths (or "${state_dir}/..." in fs_write_paths)"#
        ]],
    );
    check_msg(
        &sandbox("network = \"host\""),
        expect![[
            r#"nexo-plugin.toml: plugin.sandbox.network: network "host" needs the operator capability NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1; use network = "deny" or ask the operator to allow host networking"#
        ]],
    );
    check_msg(
        &with("[plugin.extends]\nwidgets = []"),
        expect![[
            r#"nexo-plugin.toml: plugin.extends.widgets: unknown key; remove it or fix its spelling (expected one of: channels, llm_providers, memory_backends, hooks, tools)"#
        ]],
    );
    check_msg(
        "[plugin]\nid = \"x\"\n",
        expect![[r#"nexo-plugin.toml: plugin.version: required key is missing; add it"#]],
    );
    check_msg(
        &with("[plugin.supervisor]\nrestart_attempts = 1000"),
        expect![[
            r#"nexo-plugin.toml: plugin.supervisor.restart_attempts: 1000 is out of range; use a value from 0 to 100"#
        ]],
    );
    check_msg(
        &MINIMAL.replace("\"0.1.0\"", "0.1"),
        expect![[
            r#"nexo-plugin.toml: plugin.version: expected a string, found float; change the value's type"#
        ]],
    );
    check_msg(
        "[plugin\n",
        expect![
            "nexo-plugin.toml:1:8: invalid TOML: unclosed table, expected `]`; fix the syntax at that position"
        ],
    );
}

#[test]
fn long_hostile_input_is_truncated_in_messages() {
    let long = "A".repeat(10_000);
    let msg = err(&MINIMAL.replace("\"hello\"", &format!("{long:?}"))).to_string();
    assert!(msg.len() < 500, "{}", msg.len());
    assert!(msg.contains('…'));
}

// ---------------------------------------------------------------- schema

fn toml_to_json(text: &str) -> serde_json::Value {
    let table: toml::Table = toml::from_str(text).unwrap();
    serde_json::to_value(table).unwrap()
}

#[test]
fn schema_is_valid_2020_12_and_accepts_examples() {
    let schema = native_manifest_schema();
    jsonschema::meta::validate(&schema).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    let validator = jsonschema::validator_for(&schema).unwrap();
    for text in [
        SLACK.to_owned(),
        FULL.to_owned(),
        MINIMAL.to_owned(),
        with_plugin_keys("future_key = 1"),
        with("[plugin.supervisor]\nfuture_key = 1"),
        sandbox("fs_write_paths = [\"${state_dir}/cache\", \"/tmp/x\"]"),
    ] {
        parse(&text).unwrap();
        let doc = toml_to_json(&text);
        let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{text}\n{errors:#?}");
    }
}

#[test]
fn schema_rejects_what_the_parser_rejects() {
    let validator = jsonschema::validator_for(&native_manifest_schema()).unwrap();
    for text in [
        MINIMAL.replace("\"hello\"", "\"Hello\""),
        MINIMAL.replace(
            "command = \"/bin/true\"",
            "command = \"/bin/true\"\ncwd = \"/\"",
        ),
        with_env("NEXO_TOKEN = \"x\""),
        with("[plugin.extends]\nwidgets = []"),
        with("[plugin.extends]\nhooks = [\"a\", \"a\"]"),
        with("[plugin.supervisor]\nrestart_attempts = 101"),
        with("[plugin.supervisor]\ncall_timeout_ms = 0"),
        with("[plugin.supervisor]\nstart = \"now\""),
        sandbox("network = \"allowlist\""),
        sandbox("fs_read_paths = [\"etc\"]"),
        sandbox("fs_write_paths = [\"${home}/x\"]"),
        sandbox("fs_write_paths = [\"${state_dir}x\"]"),
        with("[[plugin.channels.register]]\nadapter = \"X\""),
        format!("extra = 1\n{MINIMAL}"),
        "[plugin]\nid = \"x\"\nversion = \"1.0.0\"\n".to_owned(),
    ] {
        assert!(parse(&text).is_err(), "{text}");
        assert!(!validator.is_valid(&toml_to_json(&text)), "{text}");
    }
}

// ---------------------------------------------------------------- properties

pub(crate) fn mutation() -> impl Strategy<Value = (usize, u8, String)> {
    let interesting = prop_oneof![
        Just(String::new()),
        Just("\"".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just("=".to_owned()),
        Just("\n".to_owned()),
        Just("\\".to_owned()),
        Just("${".to_owned()),
        Just("..".to_owned()),
        Just("/".to_owned()),
        Just("é".to_owned()),
        Just("\u{0}".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just(":".to_owned()),
        Just(",".to_owned()),
        Just("- ".to_owned()),
        Just("  ".to_owned()),
        Just("[[plugin.channels.register]]\n".to_owned()),
        Just("\n[plugin.sandbox]\nenabled = true\n".to_owned()),
        "[ -~]{0,8}",
        any::<String>(),
    ];
    (any::<usize>(), 0u8..3, interesting)
}

pub(crate) fn apply(base: &str, (pos, op, s): &(usize, u8, String)) -> String {
    let mut text = base.to_owned();
    let mut at = pos % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    match op {
        0 => text.insert_str(at, s),
        1 => {
            let mut end = (at + s.len().max(1)).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(at..end, "");
        }
        _ => {
            let mut end = (at + s.len()).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(at..end, s);
        }
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics_on_arbitrary_strings(s in any::<String>()) {
        let _ = parse(&s);
    }

    #[test]
    fn parse_never_panics_on_toml_like_strings(s in "(\\[\\[?plugin(\\.[a-z_]{1,12})*\\]\\]?\n|[a-z_]{1,12} = (\"[ -~]{0,12}\"|[0-9-]{1,4}|\\[(\"[ -~]{0,6}\", ?){0,3}\\]|true|\\{ ?\\})\n){0,12}") {
        let _ = parse(&s);
    }

    #[test]
    fn parse_never_panics_on_mutated_manifests(
        base in prop_oneof![Just(SLACK), Just(FULL), Just(MINIMAL)],
        muts in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut text = base.to_owned();
        for m in &muts {
            text = apply(&text, m);
        }
        if let Err(e) = parse(&text) {
            // Every error renders, on one line (hostile input is escaped).
            let msg = e.to_string();
            prop_assert!(!msg.contains('\n'), "{msg}");
        }
    }
}

// ---------------------------------------------------------------- config_schema

#[test]
fn config_schema_inline_and_from_a_file() {
    let text = with_plugin_keys(
        "config_schema = { type = \"object\", required = [\"token\"], properties = { token = { type = \"string\", writeOnly = true }, retries = { type = \"integer\", default = 3 } } }",
    );
    let spec = parse(&text).unwrap();
    let schema = spec.native.unwrap().config_schema.unwrap();
    assert_eq!(schema["properties"]["retries"]["default"], 3);

    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    std::fs::write(
        dir.join("config.schema.json"),
        r#"{"type":"object","properties":{"units":{"type":"string","enum":["metric","imperial"]}}}"#,
    )
    .unwrap();
    let text = with_plugin_keys("config_schema = \"config.schema.json\"");
    let spec = parse_native(&text, &dir.join("nexo-plugin.toml"), &dir, &opts()).unwrap();
    let schema = spec.native.unwrap().config_schema.unwrap();
    assert_eq!(schema["properties"]["units"]["enum"][1], "imperial");
}

#[test]
fn config_schema_hostile_cases_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let parse_in = |keys: &str| {
        parse_native(
            &with_plugin_keys(keys),
            &dir.join("nexo-plugin.toml"),
            &dir,
            &opts(),
        )
        .unwrap_err()
        .to_string()
    };
    for (keys, fragment) in [
        (
            "config_schema = \"../../etc/passwd\"",
            "escapes the plugin directory",
        ),
        ("config_schema = \"/etc/passwd\"", "is not a relative path"),
        ("config_schema = \"missing.json\"", "cannot be read"),
        ("config_schema = 3", "expected a table"),
        (
            "config_schema = { type = \"array\" }",
            "a config schema describes an object",
        ),
        (
            "config_schema = { properties = { t = { type = \"string\", writeOnly = true, default = \"x\" } } }",
            "a secret cannot have a default",
        ),
        (
            "config_schema = { properties = { t = { type = \"integer\", writeOnly = true } } }",
            "must have \"type\": \"string\"",
        ),
        (
            "config_schema = { required = [\"nope\"], properties = { t = { type = \"string\" } } }",
            "which is not in \"properties\"",
        ),
        (
            "config_schema = { properties = { n = { type = \"integer\", default = \"x\" } } }",
            "does not match the property's own schema",
        ),
        (
            "config_schema = { type = \"object\", minProperties = \"x\" }",
            "is not a valid JSON Schema",
        ),
    ] {
        let e = parse_in(keys);
        assert!(e.contains("plugin.config_schema"), "{keys}: {e}");
        assert!(e.contains(fragment), "{keys}: {e}");
    }
    // A symlink inside the plugin that points outside is refused too.
    std::os::unix::fs::symlink("/etc/hostname", dir.join("link.json")).unwrap();
    let e = parse_in("config_schema = \"link.json\"");
    assert!(e.contains("escapes the plugin directory"), "{e}");
}
