//! Skills: the markdown files in a Salmex plugin's `.skills/` directory
//! (`"skills": true` in plugin.json), listed and read from what was approved.
//!
//! A skill is `.skills/NAME.md` (flat; subdirectories are not scanned). Only
//! approved, unchanged plugins have skills, and they are read from the
//! approval's pin, so the text served is the text the approval digest covers
//! (`.skills/` is inside the plugin directory the digest walks: editing a
//! skill withholds the plugin until it is approved again).
//!
//! Hostile input: names are `[A-Za-z0-9._-]`, not starting with `.` (so no
//! `..`, no `/`); a symlink or anything but a regular file is not a skill
//! (listed with the reason, never followed: files are opened `O_NOFOLLOW`);
//! a skill over [`MAX_SKILL_BYTES`] is listed with its size and the reason
//! but never served; at most [`MAX_SKILLS`] entries of `.skills/` are read.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::Runtime;

/// The largest skill served: 64 KiB (it goes into a model's instructions).
pub const MAX_SKILL_BYTES: u64 = 64 * 1024;

/// Most entries of one `.skills/` directory read.
pub const MAX_SKILLS: usize = 256;

/// One skill of the list.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SkillInfo {
    /// Plugin id.
    pub plugin: String,
    /// Skill name (the file name without `.md`).
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Why it is not served (too large, a symlink), when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One skill, read.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Skill {
    /// Plugin id.
    pub plugin: String,
    /// Skill name.
    pub name: String,
    /// The markdown text.
    pub text: String,
}

/// Why a skill cannot be read.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SkillError {
    /// The name is not a skill name (`..`, `/`, empty, other characters).
    #[error(
        "{0:?} is not a skill name: use PLUGIN/NAME with NAME of letters, digits, '.', '_', '-' (not starting with '.')"
    )]
    BadName(String),
    /// No such skill of an approved plugin.
    #[error("no skill {plugin}/{name}; `plugd skill list` shows the skills of approved plugins")]
    Unknown {
        /// Plugin id.
        plugin: String,
        /// Skill name.
        name: String,
    },
    /// It exists but is not served.
    #[error("skill {plugin}/{name} is not served: {reason}")]
    Refused {
        /// Plugin id.
        plugin: String,
        /// Skill name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// Whether `name` is an acceptable skill name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Runtime {
    /// The `.skills/` directory of approved plugin `id` as approved (its
    /// pin), when it declares `skills: true`.
    async fn skills_dir(&self, id: &str) -> Option<PathBuf> {
        let sup = self.supervised(id).ok()?;
        let spec = sup.spec();
        if !spec.salmex.as_ref().is_some_and(|s| s.skills) {
            return None;
        }
        let approval = self.inner.state.approval(id).await.ok()??;
        let digest = self.digest_now(id, false).ok()?;
        if approval.digest != digest {
            return None;
        }
        let dir = if spec.pin_dir {
            self.inner.pins.current(id)?
        } else {
            spec.dir.clone()
        };
        Some(dir.join(".skills"))
    }

    /// Every skill of every approved plugin, sorted by plugin and name.
    pub async fn skills(&self) -> Vec<SkillInfo> {
        let mut out = Vec::new();
        for id in self.inner.plugins.keys() {
            if let Some(dir) = self.skills_dir(&id).await {
                out.extend(list_dir(&id, &dir));
            }
        }
        out.sort_by(|a, b| (&a.plugin, &a.name).cmp(&(&b.plugin, &b.name)));
        out
    }

    /// Reads skill `name` of plugin `plugin`.
    pub async fn skill(&self, plugin: &str, name: &str) -> Result<Skill, SkillError> {
        if !valid_name(name) {
            return Err(SkillError::BadName(name.to_owned()));
        }
        let unknown = || SkillError::Unknown {
            plugin: plugin.to_owned(),
            name: name.to_owned(),
        };
        let dir = self.skills_dir(plugin).await.ok_or_else(unknown)?;
        let refused = |reason: String| SkillError::Refused {
            plugin: plugin.to_owned(),
            name: name.to_owned(),
            reason,
        };
        let text = read_skill(&dir.join(format!("{name}.md"))).map_err(|e| match e {
            ReadError::Missing => unknown(),
            ReadError::Refused(r) => refused(r),
        })?;
        Ok(Skill {
            plugin: plugin.to_owned(),
            name: name.to_owned(),
            text,
        })
    }

    /// The texts of `refs` (`PLUGIN/NAME`) for an agent's instructions, each
    /// under a `## Skill PLUGIN/NAME` heading; a reference that cannot be
    /// read is skipped with a warning (a revoked plugin must not stop the
    /// agent), and returned in the second list.
    pub async fn skill_instructions(&self, refs: &[String]) -> (String, Vec<String>) {
        let mut text = String::new();
        let mut skipped = Vec::new();
        for r in refs {
            let read = match r.rsplit_once('/') {
                Some((plugin, name)) => self.skill(plugin, name).await,
                None => Err(SkillError::BadName(r.clone())),
            };
            match read {
                Ok(s) => {
                    text.push_str(&format!(
                        "\n\n## Skill {}/{}\n\n{}",
                        s.plugin, s.name, s.text
                    ));
                }
                Err(e) => {
                    tracing::warn!(skill = %r, "agent.skills: {e}; left out of the instructions");
                    skipped.push(format!("{r}: {e}"));
                }
            }
        }
        (text, skipped)
    }

    /// `system_prompt` followed by the skills of `refs`.
    pub async fn system_prompt_with_skills(
        &self,
        system_prompt: Option<&str>,
        refs: &[String],
    ) -> Option<String> {
        if refs.is_empty() {
            return system_prompt.map(str::to_owned);
        }
        let (skills, _) = self.skill_instructions(refs).await;
        let base = system_prompt.unwrap_or_default();
        let all = format!("{base}{skills}");
        let all = all.trim_start().to_owned();
        (!all.is_empty()).then_some(all)
    }
}

fn list_dir(plugin: &str, dir: &Path) -> Vec<SkillInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_SKILLS) {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".md")) else {
            continue;
        };
        if !valid_name(name) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        let error = if meta.file_type().is_symlink() {
            Some("it is a symlink; skills must be regular files inside .skills/".to_owned())
        } else if !meta.is_file() {
            Some("it is not a regular file".to_owned())
        } else if meta.len() > MAX_SKILL_BYTES {
            Some(too_large(meta.len()))
        } else {
            None
        };
        out.push(SkillInfo {
            plugin: plugin.to_owned(),
            name: name.to_owned(),
            bytes: meta.len(),
            error,
        });
    }
    out
}

fn too_large(bytes: u64) -> String {
    format!("it is {bytes} bytes, over the {MAX_SKILL_BYTES}-byte cap on skills")
}

enum ReadError {
    Missing,
    Refused(String),
}

fn read_skill(path: &Path) -> Result<String, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            rustix::fs::OFlags::NOFOLLOW.bits() as i32 | rustix::fs::OFlags::NONBLOCK.bits() as i32,
        )
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Missing),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(ReadError::Refused(
                "it is a symlink; skills must be regular files inside .skills/".into(),
            ));
        }
        Err(e) => return Err(ReadError::Refused(format!("cannot open it: {e}"))),
    };
    let meta = file
        .metadata()
        .map_err(|e| ReadError::Refused(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(ReadError::Refused("it is not a regular file".into()));
    }
    if meta.len() > MAX_SKILL_BYTES {
        return Err(ReadError::Refused(too_large(meta.len())));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SKILL_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::Refused(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > MAX_SKILL_BYTES {
        return Err(ReadError::Refused(too_large(bytes.len() as u64)));
    }
    String::from_utf8(bytes).map_err(|_| ReadError::Refused("it is not UTF-8 text".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_names_refuse_traversal_and_odd_characters() {
        for ok in ["review", "git-flow", "a_b.v2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "..",
            "../x",
            "a/b",
            ".hidden",
            "a b",
            "é",
            &"x".repeat(129),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
