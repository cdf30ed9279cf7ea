//! `module:` naming an npm package (seed 002: `module:
//! "@mycompany/dexto-tenant-plugin"  # from node_modules`): the specifier's
//! grammar, checked when plugd.yaml loads, and its resolution to one file of
//! the workspace's `node_modules`, done when the pipeline is built.
//!
//! Resolution follows Node's ESM resolver (`PACKAGE_RESOLVE`) for an
//! `import()` with the conditions `node`, `import` and `default`, in the
//! package's own order:
//!
//! * the package is `WORKSPACE/node_modules/<name>` (scoped names
//!   `@scope/name` included); parent directories' `node_modules` and
//!   `NODE_PATH` are **not** searched, so a module never comes from outside
//!   the agent's directory by accident;
//! * with `exports` in its package.json: the subpath (`.` or `./sub`) is
//!   looked up exactly, then in `*` patterns (most specific first), and the
//!   target is resolved through strings, condition objects and fallback
//!   arrays; targets must start with `./` and may not contain `..`, `.` or
//!   `node_modules` segments; a subpath not exported is an error, as in Node;
//! * without `exports`: `main` (then `main` + `.js`/`.json`/`.node`, then
//!   `main/index.js`…) or `index.js` for the package itself, the exact file
//!   for a subpath.
//!
//! The file found must be a file and, once symlinks are resolved, inside the
//! workspace: a package symlinked from elsewhere (`npm link`) is refused, so
//! a specifier can never reach past the workspace (give such a module by its
//! absolute path instead, which is the file form's business).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, MapAccess, SeqAccess, Visitor};

pub use plugd_runtime::hooks::dexto_package::{
    CONDITIONS, MAX_NAME, MAX_PACKAGE_JSON, PackageSpec, is_package_form, parse,
};

/// A JSON value with object keys in file order (conditions are tried in
/// the order the package lists them; `serde_json::Value` sorts keys).
#[derive(Debug, Clone, PartialEq)]
enum Ordered {
    Null,
    Str(String),
    Arr(Vec<Ordered>),
    Obj(Vec<(String, Ordered)>),
    Other,
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Null)
            }
            fn visit_none<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Null)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Ordered, E> {
                Ok(Ordered::Other)
            }
            fn visit_str<E>(self, s: &str) -> Result<Ordered, E> {
                Ok(Ordered::Str(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<Ordered, E> {
                Ok(Ordered::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Ordered::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, Ordered>()? {
                    v.push((k, x));
                }
                Ok(Ordered::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Ordered {
    fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Obj(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why a target does not resolve: `Invalid` is the package's fault (Node
/// throws), `NoMatch` lets a fallback array try the next one.
enum Miss {
    NoMatch,
    Invalid(String),
}

/// Resolves `spec` in `workspace`'s `node_modules` to the module file
/// (canonical). The error says what was looked for and what to do.
pub fn resolve(workspace: &Path, spec: &PackageSpec) -> Result<PathBuf, String> {
    let modules = workspace.join("node_modules");
    let dir = modules.join(&spec.name);
    let shown = match &spec.subpath {
        Some(s) => format!("{}/{s}", spec.name),
        None => spec.name.clone(),
    };
    if !dir.is_dir() {
        return Err(format!(
            "package {:?} is not installed in {} (plugd looks only there, not in parent directories); run `npm install {}` in the workspace",
            spec.name,
            modules.display(),
            spec.name
        ));
    }
    let manifest = dir.join("package.json");
    let pkg: Option<Ordered> = match std::fs::metadata(&manifest) {
        Err(_) => None,
        Ok(m) if m.len() > MAX_PACKAGE_JSON => {
            return Err(format!(
                "{} is {} bytes (at most {MAX_PACKAGE_JSON}); reinstall the package",
                manifest.display(),
                m.len()
            ));
        }
        Ok(_) => {
            let text = std::fs::read_to_string(&manifest)
                .map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
            Some(serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{} is not valid JSON ({e}); reinstall the package",
                    manifest.display()
                )
            })?)
        }
    };
    let subpath = match &spec.subpath {
        Some(s) => format!("./{s}"),
        None => ".".to_owned(),
    };
    let exports = pkg
        .as_ref()
        .and_then(|p| p.get("exports"))
        .filter(|e| **e != Ordered::Null);
    let file = match exports {
        Some(exports) => exports_resolve(&dir, &subpath, exports).map_err(|why| {
            format!("package {shown:?}: {why}")
        })?,
        None => match &spec.subpath {
            Some(s) => dir.join(s),
            None => legacy_main(&dir, pkg.as_ref()).ok_or_else(|| {
                format!(
                    "package {:?} has no \"exports\", no usable \"main\" and no index.js in {}; check the package's package.json",
                    spec.name,
                    dir.display()
                )
            })?,
        },
    };
    if !file.is_file() {
        return Err(format!(
            "package {shown:?} resolves to {}, which is not a file; check the package's \"exports\"/\"main\" or reinstall it",
            file.display()
        ));
    }
    let real = file
        .canonicalize()
        .map_err(|e| format!("package {shown:?}: cannot resolve {}: {e}", file.display()))?;
    let root = workspace
        .canonicalize()
        .map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
    if !real.starts_with(&root) {
        return Err(format!(
            "package {shown:?} resolves to {}, outside the workspace {} (a symlinked package, e.g. npm link); install it into the workspace's node_modules or give module: the file's absolute path",
            real.display(),
            root.display()
        ));
    }
    Ok(real)
}

/// Node's `PACKAGE_EXPORTS_RESOLVE`.
fn exports_resolve(dir: &Path, subpath: &str, exports: &Ordered) -> Result<PathBuf, String> {
    let exported = || match exports {
        Ordered::Obj(e) if e.iter().all(|(k, _)| k.starts_with('.')) => e
            .iter()
            .map(|(k, _)| k.clone())
            .collect::<Vec<_>>()
            .join(", "),
        _ => ".".to_owned(),
    };
    let not_exported = || {
        format!(
            "{subpath:?} is not exported by the package (it exports: {}); name an exported subpath",
            exported()
        )
    };
    // Sugar: a string, an array or a conditions object is the "." export.
    let map: Vec<(String, Ordered)> = match exports {
        Ordered::Obj(e) => {
            let dots = e.iter().filter(|(k, _)| k.starts_with('.')).count();
            if dots == 0 {
                vec![(".".to_owned(), exports.clone())]
            } else if dots != e.len() {
                return Err(
                    "its \"exports\" mixes subpaths (\"./x\") with conditions; fix the package's package.json"
                        .to_owned(),
                );
            } else {
                e.clone()
            }
        }
        other => vec![(".".to_owned(), other.clone())],
    };
    // Exact key first.
    if let Some((_, target)) = map.iter().find(|(k, _)| k == subpath && !k.contains('*')) {
        return match target_resolve(dir, target, None) {
            Ok(p) => Ok(p),
            Err(Miss::NoMatch) => Err(not_exported()),
            Err(Miss::Invalid(why)) => Err(why),
        };
    }
    // Then patterns with one `*`, most specific (longest prefix) first.
    let mut best: Option<(&str, &Ordered, String)> = None;
    for (key, target) in &map {
        let Some(star) = key.find('*') else { continue };
        if key[star + 1..].contains('*') {
            continue;
        }
        let (prefix, suffix) = (&key[..star], &key[star + 1..]);
        let fits = subpath.starts_with(prefix)
            && subpath != prefix
            && (suffix.is_empty() || (subpath.ends_with(suffix) && subpath.len() >= key.len()));
        if fits {
            let better = best
                .as_ref()
                .is_none_or(|(b, _, _)| pattern_key_compare(key, b));
            if better {
                let matched = subpath[prefix.len()..subpath.len() - suffix.len()].to_owned();
                best = Some((key, target, matched));
            }
        }
    }
    match best {
        Some((_, target, matched)) => match target_resolve(dir, target, Some(&matched)) {
            Ok(p) => Ok(p),
            Err(Miss::NoMatch) => Err(not_exported()),
            Err(Miss::Invalid(why)) => Err(why),
        },
        None => Err(not_exported()),
    }
}

/// Node's `PATTERN_KEY_COMPARE`: whether `a` sorts before (is more specific
/// than) `b`.
fn pattern_key_compare(a: &str, b: &str) -> bool {
    let base = |k: &str| k.find('*').map_or(k.len(), |i| i + 1);
    let (ba, bb) = (base(a), base(b));
    if ba != bb {
        return ba > bb;
    }
    a.len() > b.len()
}

/// Node's `PACKAGE_TARGET_RESOLVE`.
fn target_resolve(dir: &Path, target: &Ordered, matched: Option<&str>) -> Result<PathBuf, Miss> {
    match target {
        Ordered::Str(t) => {
            let bad = |why: &str| {
                Miss::Invalid(format!(
                    "its \"exports\" target {t:?} {why}; fix the package's package.json"
                ))
            };
            let Some(rest) = t.strip_prefix("./") else {
                return Err(bad("does not start with \"./\""));
            };
            let segment_bad = |s: &str| {
                s.is_empty() || s == "." || s == ".." || s.eq_ignore_ascii_case("node_modules")
            };
            if rest.contains('\\') || rest.contains('%') || rest.split('/').any(segment_bad) {
                return Err(bad("leaves the package (empty, '.', '..' or node_modules segments)"));
            }
            let path = match matched {
                None => rest.to_owned(),
                Some(m) => {
                    if m.contains('\\') || m.contains('%') || m.split('/').any(segment_bad) {
                        return Err(Miss::Invalid(format!(
                            "the subpath part {m:?} leaves the package; name a file inside it"
                        )));
                    }
                    rest.replace('*', m)
                }
            };
            Ok(dir.join(path))
        }
        Ordered::Arr(items) => {
            let mut last = Miss::NoMatch;
            for item in items {
                match target_resolve(dir, item, matched) {
                    Ok(p) => return Ok(p),
                    Err(Miss::Invalid(why)) => last = Miss::Invalid(why),
                    Err(Miss::NoMatch) => {}
                }
            }
            Err(last)
        }
        Ordered::Obj(conditions) => {
            for (cond, value) in conditions {
                if cond == "default" || CONDITIONS.contains(&cond.as_str()) {
                    match target_resolve(dir, value, matched) {
                        Ok(p) => return Ok(p),
                        Err(Miss::NoMatch) => {}
                        Err(invalid) => return Err(invalid),
                    }
                }
            }
            Err(Miss::NoMatch)
        }
        Ordered::Null => Err(Miss::NoMatch),
        Ordered::Other => Err(Miss::Invalid(
            "its \"exports\" has a target that is not a string, array, object or null; fix the package's package.json"
                .to_owned(),
        )),
    }
}

/// Node's `LEGACY_MAIN_RESOLVE`.
fn legacy_main(dir: &Path, pkg: Option<&Ordered>) -> Option<PathBuf> {
    let main = pkg.and_then(|p| match p.get("main") {
        Some(Ordered::Str(m)) if !m.is_empty() => Some(m.clone()),
        _ => None,
    });
    let mut candidates = Vec::new();
    if let Some(m) = main.as_deref().map(|m| m.trim_start_matches("./"))
        && !m.split('/').any(|s| s == "..")
    {
        for suffix in [
            "",
            ".js",
            ".json",
            ".node",
            "/index.js",
            "/index.json",
            "/index.node",
        ] {
            candidates.push(dir.join(format!("{m}{suffix}")));
        }
    }
    for f in ["index.js", "index.json", "index.node"] {
        candidates.push(dir.join(f));
    }
    candidates.into_iter().find(|c| c.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> PackageSpec {
        parse(s).unwrap()
    }

    #[test]
    fn specifiers_parse_and_traversal_is_refused() {
        assert_eq!(
            spec("@mycompany/dexto-tenant-plugin"),
            PackageSpec {
                name: "@mycompany/dexto-tenant-plugin".into(),
                subpath: None
            }
        );
        assert_eq!(
            spec("audit/lib/x.js"),
            PackageSpec {
                name: "audit".into(),
                subpath: Some("lib/x.js".into())
            }
        );
        for (bad, wanted) in [
            ("pkg/../../etc/passwd", "escapes its package"),
            ("pkg/./x", "escapes its package"),
            ("pkg//x", "escapes its package"),
            ("pkg/node_modules/other", "escapes its package"),
            ("@scope/../x", "not an npm package name"),
            ("@scope", "not an npm package name"),
            ("_private", "not an npm package name"),
            ("a\\b", "not an npm package specifier"),
            ("pkg/%2e%2e/x", "not an npm package specifier"),
            ("has space", "not an npm package specifier"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(wanted), "{bad}: {e}");
        }
        assert!(parse(&"a".repeat(215)).unwrap_err().contains("at most 214"));
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        for file in [
            "/abs/x.js",
            "./x.js",
            "../x.js",
            "~/x.js",
            "${{dexto.agent_dir}}/x.js",
            "plugins/audit.js",
        ] {
            assert!(!is_package_form(file, w), "{file}");
        }
        assert!(
            is_package_form("@s/p", w)
                && is_package_form("@s/p/sub.js", w)
                && is_package_form("p", w)
        );
        std::fs::create_dir_all(w.join("node_modules/plugins")).unwrap();
        assert!(is_package_form("plugins/audit.js", w));
    }

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn exports_main_and_index_resolve_as_node_does() {
        let ws = tempfile::tempdir().unwrap();
        let w = ws.path();
        let nm = "node_modules";
        // Conditions in the package's order: "import" before "default".
        write(
            w,
            &format!("{nm}/@acme/cond/package.json"),
            r#"{"exports": {".": {"require": "./c.cjs", "import": "./i.mjs", "default": "./d.js"}, "./extra/*": "./lib/*.mjs", "./extra/special/*": "./special/*.mjs", "./gone": null}}"#,
        );
        for f in [
            "c.cjs",
            "i.mjs",
            "d.js",
            "lib/a.mjs",
            "special/b.mjs",
            "lib/special/b.mjs",
        ] {
            write(w, &format!("{nm}/@acme/cond/{f}"), "");
        }
        let r = |s: &str| resolve(w, &spec(s));
        let root = w.canonicalize().unwrap().join(nm);
        assert_eq!(r("@acme/cond").unwrap(), root.join("@acme/cond/i.mjs"));
        assert_eq!(
            r("@acme/cond/extra/a").unwrap(),
            root.join("@acme/cond/lib/a.mjs")
        );
        // The longer pattern prefix wins.
        assert_eq!(
            r("@acme/cond/extra/special/b").unwrap(),
            root.join("@acme/cond/special/b.mjs")
        );
        let e = r("@acme/cond/gone").unwrap_err();
        assert!(e.contains("\"./gone\" is not exported"), "{e}");
        let e = r("@acme/cond/c.cjs").unwrap_err();
        assert!(e.contains("not exported") && e.contains("./extra/*"), "{e}");
        // Sugar forms and fallback arrays.
        write(
            w,
            &format!("{nm}/sugar/package.json"),
            r#"{"exports": ["bad-target", "./s.js"]}"#,
        );
        write(w, &format!("{nm}/sugar/s.js"), "");
        assert_eq!(r("sugar").unwrap(), root.join("sugar/s.js"));
        // A target leaving the package is the package's error.
        write(
            w,
            &format!("{nm}/evil/package.json"),
            r#"{"exports": {".": "./../../plugd.yaml"}}"#,
        );
        let e = r("evil").unwrap_err();
        assert!(e.contains("leaves the package"), "{e}");
        // main, with Node's probing, then index.js.
        write(
            w,
            &format!("{nm}/legacy/package.json"),
            r#"{"main": "lib/plugin"}"#,
        );
        write(w, &format!("{nm}/legacy/lib/plugin.js"), "");
        assert_eq!(r("legacy").unwrap(), root.join("legacy/lib/plugin.js"));
        write(w, &format!("{nm}/bare/index.js"), "");
        assert_eq!(r("bare").unwrap(), root.join("bare/index.js"));
        // Not installed: only the workspace's node_modules is searched.
        let e = r("missing-pkg").unwrap_err();
        assert!(
            e.contains("is not installed in") && e.contains("npm install missing-pkg"),
            "{e}"
        );
    }

    #[test]
    fn a_package_symlinked_from_outside_the_workspace_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "pkg/index.js", "");
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join("node_modules")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("pkg"),
            ws.path().join("node_modules/linked"),
        )
        .unwrap();
        let e = resolve(ws.path(), &spec("linked")).unwrap_err();
        assert!(e.contains("outside the workspace"), "{e}");
    }
}
