//! `module:` naming an npm package (seed 002: `module:
//! "@mycompany/dexto-tenant-plugin"  # from node_modules`): the specifier's
//! grammar, checked when plugd.yaml loads. Its resolution to one file of the
//! workspace's `node_modules`, done when the pipeline is built, is
//! plugd-agent's (`plugd_agent::hooks::dexto_package`, with the tests of both).

use std::path::Path;

/// Longest package name (npm's limit).
pub const MAX_NAME: usize = 214;

/// Largest package.json read, in bytes.
pub const MAX_PACKAGE_JSON: u64 = 1024 * 1024;

/// The conditions plugd's `import()` matches, besides `default`.
pub const CONDITIONS: [&str; 2] = ["node", "import"];

/// A checked package specifier: `name` (`pkg` or `@scope/pkg`) and an
/// optional subpath (`lib/plugin.js`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSpec {
    /// The package name.
    pub name: String,
    /// What follows the name, without the leading `/`.
    pub subpath: Option<String>,
}

/// Whether `module` names a package of `workspace` rather than a file: it
/// does not start with `/`, `.`, `~` or a `${{…}}` template, and it is
/// scoped (`@scope/name…`), a bare name (`dexto-audit`), or `name/sub…`
/// with `node_modules/name` installed. Anything else with a `/`
/// (`plugins/audit.js`) is taken for the relative file path it most likely
/// is, and plugd.yaml refuses it as such, with the template to write.
pub fn is_package_form(module: &str, workspace: &Path) -> bool {
    if module.is_empty()
        || module.starts_with('/')
        || module.starts_with('.')
        || module.starts_with('~')
        || module.starts_with("${{")
    {
        return false;
    }
    match module.split_once('/') {
        None => true,
        Some(_) if module.starts_with('@') => true,
        Some((name, _)) => workspace.join("node_modules").join(name).is_dir(),
    }
}

fn name_segment_ok(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && !s.starts_with('_')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// Checks a specifier's grammar. The message says what is wrong and what to
/// write instead.
pub fn parse(spec: &str) -> Result<PackageSpec, String> {
    let q = format!("{:?}", spec.chars().take(120).collect::<String>());
    if spec.contains('\\')
        || spec.contains('%')
        || spec.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!(
            "{q} is not an npm package specifier (no backslashes, '%', spaces or control characters); write a package name like \"@mycompany/dexto-tenant-plugin\" or an absolute path"
        ));
    }
    let mut parts = spec.split('/');
    let first = parts.next().unwrap_or_default();
    let name = if let Some(scope) = first.strip_prefix('@') {
        let pkg = parts.next().unwrap_or_default();
        if !name_segment_ok(scope) || !name_segment_ok(pkg) {
            return Err(format!(
                "{q} is not an npm package name; a scoped package is \"@scope/name\" of letters, digits, '-', '.', '_' and '~', neither part starting with '.' or '_'"
            ));
        }
        format!("@{scope}/{pkg}")
    } else {
        if !name_segment_ok(first) {
            return Err(format!(
                "{q} is not an npm package name (letters, digits, '-', '.', '_' and '~', not starting with '.' or '_'); for a file, write module: \"${{{{dexto.agent_dir}}}}/<file>.js\""
            ));
        }
        first.to_owned()
    };
    if name.len() > MAX_NAME {
        return Err(format!(
            "{q}: an npm package name is at most {MAX_NAME} characters"
        ));
    }
    let rest: Vec<&str> = parts.collect();
    if rest.is_empty() {
        return Ok(PackageSpec {
            name,
            subpath: None,
        });
    }
    if rest
        .iter()
        .any(|s| s.is_empty() || *s == "." || *s == ".." || s.eq_ignore_ascii_case("node_modules"))
    {
        return Err(format!(
            "{q} escapes its package: a subpath may not have empty, '.', '..' or node_modules segments; name a file inside the package"
        ));
    }
    Ok(PackageSpec {
        name,
        subpath: Some(rest.join("/")),
    })
}
