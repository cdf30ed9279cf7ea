//! Typed field reading for the TOML manifests (`nexo-plugin.toml`,
//! `vai-plugin.toml`): every error names the file and the dotted field and
//! says how to fix it.

use std::path::Path;

use toml::{Table, Value};

use crate::error::ManifestError;
use crate::error::quote;

/// Turns a TOML parse error into [`ManifestError::Syntax`] with a 1-based
/// line and column computed from the error span.
pub(crate) fn syntax_error(path: &Path, text: &str, e: &toml::de::Error) -> ManifestError {
    let offset = e.span().map_or(0, |s| s.start).min(text.len());
    let offset = (0..=offset)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let message = e
        .message()
        .split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    ManifestError::Syntax {
        path: path.to_path_buf(),
        line,
        column,
        message: message.trim_end_matches('.').to_owned(),
    }
}

/// Joins a dotted prefix and a key; keys that are not bare TOML keys are
/// quoted so the field name stays unambiguous (the JSON loaders use it too).
pub(crate) fn join(prefix: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key = if bare { key.to_owned() } else { quote(key) };
    if prefix.is_empty() {
        key
    } else {
        format!("{prefix}.{key}")
    }
}

/// What to do with a key not in a section's schema.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// Refuse the manifest ([`ManifestError::UnknownKey`]).
    Error,
    /// Accept it with a warning (forward compatibility).
    Warn,
}

/// The manifest being read (for errors) and the warnings collected so far.
pub(crate) struct Fields<'a> {
    /// The manifest file.
    pub path: &'a Path,
    /// Non-fatal findings, for `plugd plugin show`.
    pub warnings: Vec<String>,
    /// Refuse NUL bytes in every string (VAI); native checks them per field.
    refuse_nul: bool,
}

impl<'a> Fields<'a> {
    /// Reading `path`; `refuse_nul` refuses a NUL byte in any string.
    pub fn new(path: &'a Path, refuse_nul: bool) -> Self {
        Fields {
            path,
            warnings: Vec::new(),
            refuse_nul,
        }
    }

    pub fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> ManifestError {
        ManifestError::Invalid {
            path: self.path.to_path_buf(),
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn missing(&self, field: String) -> ManifestError {
        ManifestError::MissingField {
            path: self.path.to_path_buf(),
            field,
        }
    }

    pub fn wrong_type(&self, field: &str, expected: &str, v: &Value) -> ManifestError {
        self.invalid(
            field,
            format!(
                "expected {expected}, found {}; change the value's type",
                v.type_str()
            ),
        )
    }

    /// Refuses (or warns about) keys of `t` not in `allowed`.
    pub fn check_keys(
        &mut self,
        t: &Table,
        prefix: &str,
        allowed: &[&str],
        unknown: Unknown,
    ) -> Result<(), ManifestError> {
        for key in t.keys() {
            if allowed.contains(&key.as_str()) {
                continue;
            }
            let field = join(prefix, key);
            match unknown {
                Unknown::Error => {
                    return Err(ManifestError::UnknownKey {
                        path: self.path.to_path_buf(),
                        field,
                        expected: allowed.iter().map(|s| (*s).to_owned()).collect(),
                    });
                }
                Unknown::Warn => {
                    if let Some(meant) = crate::guarded::near_containment(key) {
                        return Err(crate::guarded::refused(self.path, &field, key, meant));
                    }
                    self.warnings.push(format!(
                    "{field}: unknown key ignored (it may be meant for a newer host); remove it or fix its spelling"
                    ))
                }
            }
        }
        Ok(())
    }

    pub fn table<'v>(&self, v: &'v Value, field: &str) -> Result<&'v Table, ManifestError> {
        v.as_table()
            .ok_or_else(|| self.wrong_type(field, "a table", v))
    }

    pub fn required_table<'v>(
        &self,
        t: &'v Table,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Table, ManifestError> {
        let field = join(prefix, key);
        match t.get(key) {
            Some(v) => self.table(v, &field),
            None => Err(self.missing(field)),
        }
    }

    pub fn optional_table<'v>(
        &self,
        t: &'v Table,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v Table>, ManifestError> {
        t.get(key)
            .map(|v| self.table(v, &join(prefix, key)))
            .transpose()
    }

    pub fn string<'v>(&self, v: &'v Value, field: &str) -> Result<&'v str, ManifestError> {
        let s = v
            .as_str()
            .ok_or_else(|| self.wrong_type(field, "a string", v))?;
        if self.refuse_nul && s.contains('\0') {
            return Err(self.invalid(
                field,
                format!("{} contains a NUL byte; remove it", quote(s)),
            ));
        }
        Ok(s)
    }

    pub fn required_string<'v>(
        &self,
        t: &'v Table,
        prefix: &str,
        key: &str,
    ) -> Result<&'v str, ManifestError> {
        let field = join(prefix, key);
        match t.get(key) {
            Some(v) => self.string(v, &field),
            None => Err(self.missing(field)),
        }
    }

    pub fn optional_string<'v>(
        &self,
        t: &'v Table,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v str>, ManifestError> {
        t.get(key)
            .map(|v| self.string(v, &join(prefix, key)))
            .transpose()
    }

    pub fn optional_bool(
        &self,
        t: &Table,
        prefix: &str,
        key: &str,
    ) -> Result<Option<bool>, ManifestError> {
        t.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.wrong_type(&join(prefix, key), "a boolean", v))
            })
            .transpose()
    }

    /// An optional integer in `min..=max`.
    pub fn integer(
        &self,
        t: &Table,
        prefix: &str,
        key: &str,
        min: i64,
        max: i64,
    ) -> Result<Option<i64>, ManifestError> {
        let field = join(prefix, key);
        let Some(v) = t.get(key) else {
            return Ok(None);
        };
        let n = v
            .as_integer()
            .ok_or_else(|| self.wrong_type(&field, "an integer", v))?;
        if !(min..=max).contains(&n) {
            return Err(self.invalid(
                field,
                format!("{n} is out of range; use a value from {min} to {max}"),
            ));
        }
        Ok(Some(n))
    }

    /// An optional array of strings; returns `(field_of_element, value)` pairs.
    pub fn string_list<'v>(
        &self,
        t: &'v Table,
        prefix: &str,
        key: &str,
    ) -> Result<Vec<(String, &'v str)>, ManifestError> {
        let field = join(prefix, key);
        let Some(v) = t.get(key) else {
            return Ok(Vec::new());
        };
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong_type(&field, "an array of strings", v))?;
        arr.iter()
            .enumerate()
            .map(|(i, item)| {
                let f = format!("{field}[{i}]");
                let s = self.string(item, &f)?;
                Ok((f, s))
            })
            .collect()
    }
}
