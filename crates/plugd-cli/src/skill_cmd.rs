//! `plugd skill list|show`: the markdown skills of approved Salmex plugins
//! (`.skills/NAME.md` with `"skills": true`), as approved.

use anyhow::{Result, bail};
use clap::Subcommand;
use plugd_runtime::Runtime;

/// `plugd skill …`.
#[derive(Subcommand, Debug)]
pub enum SkillCmd {
    /// List the skills of approved plugins.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print one skill's markdown.
    Show {
        /// `PLUGIN/NAME`, as `plugd skill list` shows it.
        skill: String,
        /// Print `{plugin, name, text}` as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `plugd skill`.
pub async fn run(rt: &Runtime, cmd: &SkillCmd) -> Result<()> {
    match cmd {
        SkillCmd::List { json } => {
            let skills = rt.skills().await;
            if *json {
                return crate::print_json(&skills, false);
            }
            if skills.is_empty() {
                println!("no skills (plugins with \"skills\": true and .skills/*.md, approved)");
            }
            for s in &skills {
                let note = s.error.as_deref().map(|e| format!("  NOT SERVED: {e}"));
                println!(
                    "{}/{}  {} bytes{}",
                    s.plugin,
                    s.name,
                    s.bytes,
                    note.unwrap_or_default()
                );
            }
        }
        SkillCmd::Show { skill, json } => {
            let Some((plugin, name)) = skill.rsplit_once('/') else {
                bail!("{skill:?} is not PLUGIN/NAME; `plugd skill list` shows the skills");
            };
            let s = rt.skill(plugin, name).await?;
            if *json {
                return crate::print_json(&s, false);
            }
            print!("{}", s.text);
            if !s.text.ends_with('\n') {
                println!();
            }
        }
    }
    Ok(())
}
