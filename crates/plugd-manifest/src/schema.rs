//! Hand-written JSON Schema (2020-12) of `nexo-plugin.toml`, for editors and `plugd` tooling.

use crate::spec::LimitsSpec;
use serde_json::{Value, json};

/// Returns a JSON Schema (draft 2020-12) describing `nexo-plugin.toml`, as
/// the JSON form of its TOML document.
///
/// The schema covers shapes, types, the slug pattern and numeric ranges. Some
/// rules depend on several fields or on the filesystem and are only enforced
/// by [`crate::parse_native`]: the tool namespace, cross-list duplicates,
/// `backoff_base_ms <= backoff_max_ms`, semver parsing, entrypoint
/// containment, env-key prefixes and the sandbox denylist. `[plugin]` and
/// `[plugin.supervisor]` allow additional properties (the parser warns about
/// them); every other table is closed.
pub fn native_manifest_schema() -> Value {
    const SLUG: &str = "^[a-z][a-z0-9_]{0,31}$";
    let slug = json!({ "type": "string", "pattern": SLUG });
    let slug_list = |what: &str| {
        json!({
            "type": "array",
            "description": format!("Ids this plugin contributes to the host's {what} registry; each a slug, unique across all extends lists."),
            "items": slug,
            "uniqueItems": true,
            "default": []
        })
    };
    let ms = |what: &str, default: Option<u64>| {
        let mut v = json!({
            "type": "integer",
            "minimum": 1,
            "maximum": 3_600_000,
            "description": what,
        });
        if let Some(d) = default {
            v["default"] = json!(d);
        }
        v
    };

    let requires = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "nexo_capabilities": {
                "type": "array",
                "items": { "enum": ["broker", "memory", "llm"] },
                "description": "Host services the plugin needs, e.g. [\"broker\"]; plugd refuses a plugin needing one it cannot provide. Not a permission: every approved plugin may use every host service unless plugd.yaml host_services.deny says otherwise."
            }
        }
    });
    let entrypoint = json!({
        "type": "object",
        "description": "The subprocess to start.",
        "additionalProperties": false,
        "required": ["command"],
        "properties": {
            "command": {
                "type": "string", "minLength": 1,
                "description": "Absolute path, a program on PATH, or a relative path (with '/') inside the plugin directory."
            },
            "args": {
                "type": "array", "items": { "type": "string" },
                "description": "Arguments."
            },
            "env": {
                "type": "object",
                "description": "Extra environment. Keys starting with NEXO_ or PLUGD_ are reserved for the host.",
                "propertyNames": { "minLength": 1, "pattern": "^[^=]*$", "not": { "pattern": "^([Nn][Ee][Xx][Oo]|[Pp][Ll][Uu][Gg][Dd])_" } },
                "additionalProperties": { "type": "string" }
            }
        }
    });
    let extends = json!({
        "type": "object",
        "description": "Ids the plugin contributes to host registries.",
        "additionalProperties": false,
        "properties": {
            "channels": slug_list("channel adapter"),
            "llm_providers": slug_list("LLM provider"),
            "memory_backends": slug_list("memory backend"),
            "hooks": slug_list("hook"),
            "tools": {
                "type": "array",
                "description": "Tool names, each \"<id>_<name>\" or \"ext_<id>_<name>\".",
                "items": slug,
                "uniqueItems": true,
                "default": []
            }
        }
    });
    let channels = json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "register": {
                "type": "array",
                "description": "Channel kinds the plugin exposes; drives the broker topic allowlist.",
                "items": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["kind"],
                    "properties": {
                        "kind": { "type": "string", "pattern": SLUG, "description": "Channel kind, unique." },
                        "adapter": { "type": "string", "description": "Adapter name." }
                    }
                }
            }
        }
    });
    let supervisor = json!({
        "type": "object",
        "description": "Start, restart and timeout policy. Unknown keys are accepted with a warning.",
        "additionalProperties": true,
        "properties": {
            "start": { "enum": ["lazy", "eager"], "default": "lazy", "description": "Start on first use or with the host." },
            "restart_attempts": { "type": "integer", "minimum": 0, "maximum": 100, "default": 3, "description": "Restarts before the plugin is marked failed." },
            "backoff_base_ms": ms("First restart delay; doubles per attempt.", Some(1000)),
            "backoff_max_ms": ms("Cap on the restart delay.", Some(60_000)),
            "stable_after_ms": ms("Uptime after which the restart budget resets.", Some(60_000)),
            "init_timeout_ms": ms("Wait for the initialize reply (host default 5000).", None),
            "call_timeout_ms": ms("Wait for a call reply (host default 60000).", None),
            "shutdown_timeout_ms": ms("Wait for the shutdown reply.", Some(2000)),
            "shutdown_grace_ms": ms("After the reply, wait for exit before SIGKILL.", Some(1000))
        }
    });
    let sandbox = json!({
        "type": "object",
        "description": "bubblewrap isolation (Linux).",
        "additionalProperties": false,
        "properties": {
            "enabled": { "type": "boolean", "default": false, "description": "Opt in to the sandbox." },
            "network": { "enum": ["deny", "host"], "default": "deny", "description": "\"host\" needs NEXO_PLUGIN_SANDBOX_HOST_NET_ALLOW=1." },
            "fs_read_paths": {
                "type": "array",
                "description": "Absolute paths bound read-only; none may touch the host denylist.",
                "items": { "type": "string", "pattern": "^/", "not": { "pattern": "\\$\\{" } }
            },
            "fs_write_paths": {
                "type": "array",
                "description": "Absolute paths bound read-write, or \"${state_dir}\" / \"${state_dir}/sub\".",
                "items": {
                    "type": "string",
                    "anyOf": [
                        { "pattern": "^/", "not": { "pattern": "\\$\\{" } },
                        { "pattern": "^\\$\\{state_dir\\}(/.*)?$", "not": { "pattern": "^\\$\\{state_dir\\}.*\\$\\{" } }
                    ]
                }
            },
            "drop_user": { "type": "boolean", "default": true, "description": "Run as nobody (uid 65534)." }
        }
    });

    let limit = |what: &str, max: u64| json!({ "type": "integer", "minimum": 1, "maximum": max, "description": what });
    let limits = json!({
        "type": "object",
        "description": "Resource limits (setrlimit on the child before exec); plugd.yaml `sandbox.plugins.<id>.limits` may narrow them.",
        "additionalProperties": false,
        "properties": {
            "address_space_mb": limit("RLIMIT_AS in MiB.", LimitsSpec::MAX_ADDRESS_SPACE_MB),
            "open_files": limit("RLIMIT_NOFILE.", LimitsSpec::MAX_OPEN_FILES),
            "processes": limit("RLIMIT_NPROC (counts every process of the user; not enforced for root).", LimitsSpec::MAX_PROCESSES),
            "cpu_seconds": limit("RLIMIT_CPU in seconds; the plugin gets SIGXCPU at the limit.", LimitsSpec::MAX_CPU_SECONDS)
        }
    });

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://plugd.invalid/schemas/nexo-plugin.schema.json",
        "title": "nexo-plugin.toml",
        "description": "Native nexo plugin manifest (nexo Plugin Contract §2), as read by plugd.",
        "type": "object",
        "additionalProperties": false,
        "required": ["plugin"],
        "properties": {
            "plugin": {
                "type": "object",
                "description": "The plugin. Unknown keys are accepted with a warning (forward compatibility).",
                "additionalProperties": true,
                "required": ["id", "version", "entrypoint"],
                "properties": {
                    "id": {
                        "type": "string", "pattern": SLUG,
                        "description": "Plugin id; the child must echo it in its initialize reply."
                    },
                    "version": {
                        "type": "string", "minLength": 1,
                        "description": "Plugin version, semver (MAJOR.MINOR.PATCH)."
                    },
                    "name": { "type": "string", "description": "Human-readable name." },
                    "description": { "type": "string", "description": "One-line description." },
                    "min_nexo_version": {
                        "type": "string",
                        "description": "Semver requirement on the nexo daemon version the host presents (plugd presents 0.1.5), e.g. \">=0.1.0\"; a plugin it does not match is refused."
                    },
                    "contract_version": {
                        "type": "string",
                        "description": "The nexo Plugin Contract version the plugin targets (semver); a major other than plugd's (1) is refused."
                    },
                    "requires": requires,
                    "entrypoint": entrypoint,
                    "extends": extends,
                    "channels": channels,
                    "supervisor": supervisor,
                    "sandbox": sandbox,
                    "limits": limits,
                    "config_schema": {
                        "type": ["object", "string"],
                        "description": "JSON Schema of the plugin's settings: inline, or a path to a JSON file inside the plugin. Properties with \"writeOnly\": true are secrets (stored encrypted, shown as ••••)."
                    }
                }
            }
        }
    })
}
