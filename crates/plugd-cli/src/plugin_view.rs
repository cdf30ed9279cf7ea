//! `plugd plugin list|show`: the plugin table, its JSON rows, and one
//! plugin's detail (with serve's live state and counters when serve runs).

use anyhow::Result;
use plugd_runtime::{PluginInfo, PluginRow, Runtime};
use serde_json::Value;

use crate::print_json;

/// `plugd plugin list`.
pub async fn list(rt: &Runtime, json: bool) -> Result<()> {
    let plugins = rt.plugin_list().await?;
    if json {
        print_json(&plugin_rows(&plugins), false)?;
    } else {
        print_plugin_table(&plugins);
    }
    Ok(())
}

/// `plugd plugin show ID`: this process's view of the plugin, with the
/// live state and counters of the serve that runs it, if one does.
pub async fn show(rt: &Runtime, id: &str, json: bool) -> Result<()> {
    let mut info = rt.plugin(id).await?;
    let mut via = None;
    let mut live_json = None;
    // The live counters belong to the process running the plugin.
    if let Some(serve) = crate::remote::Remote::find(rt.dir()).await {
        match serve
            .get(&format!("/v1/plugins/{id}"), format!("plugin show {id}"))
            .await
        {
            Ok(live) => {
                info.stats = serde_json::from_value(live["stats"].clone()).unwrap_or(None);
                info.broker = serde_json::from_value(live["broker"].clone()).unwrap_or(None);
                if let Some(state) = live["state"].as_str() {
                    // State and its reason from one source: serve
                    // knows a failure before the store records it.
                    info.state = state.to_owned();
                    info.error = live["error"].as_str().map(str::to_owned);
                    via = Some(serve.pid());
                }
                live_json = Some(live);
            }
            Err(e) => tracing::warn!("cannot read the live state from plugd serve: {e}"),
        }
    }
    if json {
        // Serve's whole view of it when serve runs, else ours.
        match &live_json {
            Some(live) => print_json(live, true)?,
            None => print_json(&info, true)?,
        }
    } else {
        if let Some(pid) = via {
            info.state = format!("{} (in plugd serve pid {pid})", info.state);
        }
        print_plugin_detail(&info);
    }
    Ok(())
}

fn plugin_rows(plugins: &[PluginInfo]) -> Vec<PluginRow<'_>> {
    plugins.iter().map(PluginRow::local).collect()
}

fn print_plugin_table(plugins: &[PluginInfo]) {
    if plugins.is_empty() {
        println!("no plugins in .plugins/ of this workspace");
        return;
    }
    let width = plugins.iter().map(|p| p.id.len()).max().unwrap_or(2).max(2);
    println!(
        "{:width$}  {:8}  {:10}  {:8}  NOTE",
        "ID", "DIALECT", "STATE", "APPROVED"
    );
    for p in plugins {
        let note = p
            .error
            .clone()
            .unwrap_or_else(|| format!("{} tools", p.tools.len()));
        let note: String = note.chars().take(100).collect();
        println!(
            "{:width$}  {:8}  {:10}  {:8}  {note}",
            p.id,
            p.dialect,
            p.state,
            if p.approved { "yes" } else { "no" }
        );
    }
}

fn print_plugin_detail(p: &PluginInfo) {
    println!("id:        {}", p.id);
    println!("dialect:   {}", p.dialect);
    println!("version:   {}", p.version.as_deref().unwrap_or("-"));
    println!("state:     {}", p.state);
    if let Some(e) = &p.error {
        println!("error:     {e}");
    }
    println!("dir:       {}", p.dir.display());
    println!("signature: {}", p.signature.summary());
    println!("digest:    {}", p.digest.as_deref().unwrap_or("-"));
    match &p.approval {
        Some(a) if p.approved => {
            println!("approved:  yes, by {} at {}", a.approved_by, a.approved_at)
        }
        Some(a) => println!(
            "approved:  no (approval covers {}, files changed since)",
            a.digest
        ),
        None => println!("approved:  no"),
    }
    for w in &p.withheld_tools {
        use plugd_control::store::tool_pins::WithheldReason;
        let why = match w.reason {
            WithheldReason::Changed => "its definition changed since approval",
            WithheldReason::New => "new since approval",
        };
        println!(
            "withheld:  {} ({why}; `plugd plugin approve {}` accepts it)",
            w.name, p.id
        );
        for line in w.diff.lines() {
            println!("             {line}");
        }
    }
    if let Some(start) = &p.start {
        println!("start:     {start}");
    }
    let remote_url = (p.details.get("transport").and_then(Value::as_str) == Some("http"))
        .then(|| p.details.get("url").and_then(Value::as_str))
        .flatten();
    if let Some(url) = remote_url {
        // What approving sends where: the URL and, per header, the operator
        // secrets its value names (`${NAME}`; never the values).
        println!("remote:    {url} (Streamable HTTP, runs inside plugd)");
        if let Some(headers) = p.details.get("headers").and_then(Value::as_object) {
            for (k, v) in headers {
                let v = v.as_str().unwrap_or_default();
                let names = plugd_manifest::mcp::placeholders(v);
                let secrets = if names.is_empty() {
                    String::new()
                } else {
                    format!(" (sends secret {})", names.join(", "))
                };
                println!("header:    {k}: {v}{secrets}");
            }
        }
    } else if !p.command.is_empty() {
        println!(
            "command:   {}",
            p.command
                .iter()
                .map(|a| shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if let Some(cwd) = &p.cwd {
            println!("cwd:       {}", cwd.display());
        }
        println!("env:       (cleared, then exactly these)");
        for (k, v) in &p.env {
            println!("  {k}={}", shell_quote(v));
        }
    }
    for line in p.permissions.iter().flat_map(|e| e.text_lines()) {
        println!("{line}");
    }
    if !p.processes.is_empty() {
        println!("processes:");
        for g in &p.processes {
            let pids = if g.pids.is_empty() {
                String::new()
            } else {
                format!(
                    " pid {}",
                    g.pids
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )
            };
            println!(
                "  {}{}: {}{pids}, restarts {}; exports {}{}",
                g.group,
                if g.per_invocation {
                    " (a process per invocation)"
                } else {
                    ""
                },
                g.state,
                g.restarts,
                if g.exports.is_empty() {
                    "-".to_owned()
                } else {
                    g.exports.join(", ")
                },
                g.error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            );
        }
    }
    println!(
        "tools:     {}",
        if p.tools.is_empty() {
            "-".into()
        } else {
            p.tools.join(", ")
        }
    );
    for c in &p.config {
        let v = match &c.value {
            Value::Null => "(unset)".to_owned(),
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        println!("config:    {} = {v} ({})", c.key, c.source);
    }
    if let Some(s) = &p.stats {
        println!(
            "counters:  shed={} junk={} unknown_ids={} oversized={}",
            s.shed_notifications, s.junk_frames, s.unknown_ids, s.oversized_frames
        );
    }
    if let Some(b) = &p.broker {
        println!(
            "broker:    published={} dropped={} delivered={} shed={}",
            b.published, b.dropped, b.delivered, b.shed
        );
    }
    if let Some(exports) = p.details.get("exports").and_then(Value::as_array) {
        println!("exports:");
        for e in exports {
            let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("-").to_owned();
            let perms = e.get("permissions").cloned().unwrap_or(Value::Null);
            let perm = |k: &str| {
                perms
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned()
            };
            let id = field("id");
            // The class plugd runs it with, when it differs from the
            // manifest's, and its process group.
            let placed = p
                .permissions
                .iter()
                .flat_map(|r| &r.vai)
                .find(|x| x.export == id);
            let class = match placed {
                Some(x) if x.effective_class != x.requested_class => format!(
                    "{} -> {}",
                    field("execution_class"),
                    plugd_host::groups::class_str(x.effective_class)
                ),
                _ => field("execution_class"),
            };
            let group = placed
                .map(|x| format!(" in {}", x.group))
                .unwrap_or_default();
            println!(
                "  {id} ({}, {class}{group}): network={} filesystem={}",
                field("kind"),
                perm("network"),
                perm("filesystem")
            );
            let words = |v: Option<&Value>| -> Vec<String> {
                v.and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let scopes = words(perms.get("gateway_api_scopes"));
            if !scopes.is_empty() {
                println!("    delegated scopes: {}", scopes.join(", "));
            }
            if let Some(h) = e.get("harness").filter(|h| h.is_object()) {
                let supports = words(h.get("supports"));
                println!(
                    "    harness: fidelity={} supports=[{}]",
                    h.get("fidelity").and_then(Value::as_str).unwrap_or("-"),
                    supports.join(", ")
                );
            }
        }
    } else if !p.details.is_null() {
        println!("{}:  {}", p.dialect, p.details);
    }
    crate::risk_cmd::print_tool_risks(p);
    for w in &p.warnings {
        println!("warning:   {w}");
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
