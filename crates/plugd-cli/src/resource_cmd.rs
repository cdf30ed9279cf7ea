//! `plugd resource list|templates|read` and `plugd prompt list|get`: the
//! resources and prompts of hosted MCP servers, in-process like `plugd tool
//! call` (the servers start on demand and stop when the command ends).
//!
//! Without `--server` a listing asks every approved MCP server; a server
//! that fails is a `warning:` on stderr (in `errors` with `--json`) and the
//! others are listed. With `--server S`, S's failure is the command's.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use clap::Subcommand;
use plugd_runtime::Runtime;
use plugd_runtime::mcp_features::{Listing, ServerItem};
use serde_json::{Value, json};

/// `plugd resource …`.
#[derive(Subcommand, Debug)]
pub enum ResourceCmd {
    /// List the resources of approved MCP servers.
    List {
        /// Only this server (its name in .mcp.json).
        #[arg(long)]
        server: Option<String>,
        /// Print `{"resources": [{"server", "item"}], "errors": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// List the resource templates (URI templates) of approved MCP servers.
    Templates {
        /// Only this server.
        #[arg(long)]
        server: Option<String>,
        /// Print `{"templates": [...], "errors": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Read one resource and print its text contents.
    Read {
        /// The MCP server.
        server: String,
        /// The resource URI (listed, or a template filled in).
        uri: String,
        /// Print the whole `resources/read` result (blobs as base64).
        #[arg(long)]
        json: bool,
    },
}

/// `plugd prompt …`.
#[derive(Subcommand, Debug)]
pub enum PromptCmd {
    /// List the prompts of approved MCP servers.
    List {
        /// Only this server.
        #[arg(long)]
        server: Option<String>,
        /// Print `{"prompts": [...], "errors": [...]}`.
        #[arg(long)]
        json: bool,
    },
    /// Get one prompt, filled in with its arguments, and print its messages.
    Get {
        /// The MCP server.
        server: String,
        /// The prompt's name.
        name: String,
        /// An argument, `NAME=VALUE` (repeat for more).
        #[arg(long = "arg", value_name = "NAME=VALUE")]
        args: Vec<String>,
        /// Print the whole `prompts/get` result.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `plugd resource`.
pub async fn resource(rt: &Runtime, cmd: &ResourceCmd) -> Result<()> {
    match cmd {
        ResourceCmd::List { server, json } => {
            let listing = match server {
                Some(s) => Listing::of_server(s, rt.resources(s).await?),
                None => rt.all_resources().await,
            };
            print_listing("resources", listing, *json, |i| {
                let r = &i.item;
                vec![
                    i.server.clone(),
                    text(r, "uri"),
                    text(r, "name"),
                    text(r, "mimeType"),
                    text(r, "title"),
                ]
            })
        }
        ResourceCmd::Templates { server, json } => {
            let listing = match server {
                Some(s) => Listing::of_server(s, rt.resource_templates(s).await?),
                None => rt.all_resource_templates().await,
            };
            print_listing("templates", listing, *json, |i| {
                let t = &i.item;
                vec![
                    i.server.clone(),
                    text(t, "uriTemplate"),
                    text(t, "name"),
                    text(t, "mimeType"),
                    text(t, "title"),
                ]
            })
        }
        ResourceCmd::Read { server, uri, json } => {
            let result = rt.read_resource(server, uri).await?;
            if *json {
                return crate::print_json(&result, false);
            }
            let contents = result["contents"].as_array().cloned().unwrap_or_default();
            if contents.is_empty() {
                eprintln!("{server} returned no contents for {uri}");
            }
            for c in &contents {
                match (c["text"].as_str(), c["blob"].as_str()) {
                    (Some(t), _) => {
                        print!("{t}");
                        if !t.ends_with('\n') {
                            println!();
                        }
                    }
                    (_, Some(b)) => println!(
                        "[blob {}: {} bytes of base64, {}; --json prints it]",
                        text(c, "uri"),
                        b.len(),
                        c["mimeType"].as_str().unwrap_or("no mimeType")
                    ),
                    _ => {}
                }
            }
            Ok(())
        }
    }
}

/// Runs `plugd prompt`.
pub async fn prompt(rt: &Runtime, cmd: &PromptCmd) -> Result<()> {
    match cmd {
        PromptCmd::List { server, json } => {
            let listing = match server {
                Some(s) => Listing::of_server(s, rt.prompts(s).await?),
                None => rt.all_prompts().await,
            };
            print_listing("prompts", listing, *json, |i| {
                let p = &i.item;
                let args: Vec<String> = p["arguments"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|arg| {
                                let req = if arg["required"] == json!(true) {
                                    "*"
                                } else {
                                    ""
                                };
                                format!("{}{req}", text(arg, "name"))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                vec![
                    i.server.clone(),
                    text(p, "name"),
                    args.join(","),
                    text(p, "description"),
                ]
            })
        }
        PromptCmd::Get {
            server,
            name,
            args,
            json,
        } => {
            let mut arguments = BTreeMap::new();
            for a in args {
                let Some((k, v)) = a.split_once('=').filter(|(k, _)| !k.is_empty()) else {
                    bail!("--arg {a:?} is not NAME=VALUE; e.g. --arg city=Paris");
                };
                arguments.insert(k.to_owned(), v.to_owned());
            }
            let result = rt.get_prompt(server, name, &arguments).await?;
            if *json {
                return crate::print_json(&result, false);
            }
            if let Some(d) = result["description"].as_str() {
                println!("# {d}");
            }
            for m in result["messages"].as_array().into_iter().flatten() {
                let content = &m["content"];
                let body = match content["text"].as_str() {
                    Some(t) => t.to_owned(),
                    None => content.to_string(),
                };
                println!("{}: {body}", text(m, "role"));
            }
            Ok(())
        }
    }
}

/// A string member of `v`, or `-`, on one line.
fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .map(|s| s.replace(['\n', '\t'], " "))
        .unwrap_or_else(|| "-".into())
}

fn print_listing(
    key: &str,
    listing: Listing,
    json: bool,
    row: impl Fn(&ServerItem) -> Vec<String>,
) -> Result<()> {
    if json {
        return crate::print_json(
            &json!({key: listing.items, "errors": listing.errors}),
            false,
        );
    }
    for e in &listing.errors {
        eprintln!("warning: {}: {}", e.server, e.error);
    }
    if listing.items.is_empty() {
        println!("no {key} (approved MCP servers that declare them are listed here)");
    }
    for item in &listing.items {
        println!("{}", row(item).join("  "));
    }
    Ok(())
}
