//! Sample records for the store tests of both backends (feature `test-util`): one definition each, so the SQLite store's tests and the generic suite build the same rows.

use std::path::PathBuf;

use crate::invocations::{InvocationRecord, TerminalStatus, rfc3339_ms};
use crate::packages::{Digest, Package, PackageExport, SignatureStatus};

/// An invocation record `inv_NNNN` of `plugin` started at `ms`, 5 ms long;
/// tool `t0`..`t2` by `n`, org `org_a` for even `n` and `org_b` for odd.
pub fn invocation(n: usize, ms: i64, plugin: &str, status: TerminalStatus) -> InvocationRecord {
    InvocationRecord {
        invocation_id: format!("inv_{n:04}"),
        export_kind: "tool".into(),
        export_id: format!("t{}", n % 3),
        tool: format!("{plugin}/t{}", n % 3),
        plugin_id: plugin.into(),
        dialect: "native".into(),
        binding_id: None,
        package_id: None,
        package_version: None,
        execution_class: None,
        started_at: rfc3339_ms(ms),
        ended_at: rfc3339_ms(ms + 5),
        started_ms: ms,
        duration_ms: 5,
        status,
        retry_count: 0,
        error_code: (status != TerminalStatus::Succeeded).then(|| "tool_failed".into()),
        caller: Some("cli:root".into()),
        org_id: Some(
            if n.is_multiple_of(2) {
                "org_a"
            } else {
                "org_b"
            }
            .into(),
        ),
        project_id: None,
        session_id: None,
        chain_id: None,
        run_id: None,
        trace_id: Some("tr_1".into()),
        execution_id: None,
        surface: None,
        payload: None,
    }
}

/// Package `acme/devkit` at `version` with digest `nn` repeated (`n` in
/// hex), one isolated tool export, installed at second `n` of 2026.
pub fn package(version: &str, n: u8) -> Package {
    Package {
        package_id: "acme/devkit".to_owned(),
        version: version.to_owned(),
        digest: Digest::from_sha256_hex(&format!("{n:02x}").repeat(32)).expect("64 hex digits"),
        source: "oci://127.0.0.1:5000/acme/devkit:latest".to_owned(),
        installed_at: format!("2026-01-01T00:00:{n:02}Z"),
        installed_by: "cli".to_owned(),
        path: PathBuf::from("/w/.plugd/packages/sha256/x"),
        manifest: "vai-plugin.toml".to_owned(),
        exports: vec![PackageExport {
            id: "jira_search".to_owned(),
            kind: "tool".to_owned(),
            display_name: Some("Jira Search".to_owned()),
            execution_class: Some("isolated".to_owned()),
        }],
        signature: SignatureStatus::Unverified {
            file: "marketplace.signature.json".to_owned(),
        },
        files: 3,
        size: 1234,
        tree_digest: Some(format!("sha256:{}", "ab".repeat(32))),
    }
}

/// A record as a call over HTTP writes it: minted ids, a trace id, a
/// token caller, no tenancy, no payload.
pub fn typical_invocation(n: u64) -> InvocationRecord {
    let ms = 1_795_000_000_000 + n as i64 * 3;
    InvocationRecord {
        invocation_id: format!(
            "inv_{:032x}",
            0x019a_0000_0000_7000_8000_0000_0000_0000u128 + n as u128 * 7919
        ),
        export_kind: "tool".into(),
        export_id: "echo".into(),
        tool: "hello_rust_echo".into(),
        plugin_id: "hello_rust".into(),
        dialect: "native".into(),
        binding_id: None,
        package_id: None,
        package_version: None,
        execution_class: None,
        started_at: rfc3339_ms(ms),
        ended_at: rfc3339_ms(ms + 1),
        started_ms: ms,
        duration_ms: 1,
        status: TerminalStatus::Succeeded,
        retry_count: 0,
        error_code: None,
        caller: Some("token:bench".into()),
        org_id: None,
        project_id: None,
        session_id: None,
        chain_id: None,
        run_id: None,
        trace_id: Some(format!(
            "{:032x}",
            0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736u128 ^ n as u128
        )),
        execution_id: None,
        surface: Some("http".into()),
        payload: None,
    }
}
