//! `plugd tool call`: calls one tool and prints its result; with `--json`, a
//! failure is one JSON object on stderr and the exit code says its class.
//!
//! The object is `{"code", "message", "details"?, "http_status"}`, the same
//! code and details `plugd serve` answers over HTTP (the one list of codes
//! and the runtime's classification; the exit codes are this crate's
//! table, [`crate::errors`]), so a script reads one vocabulary whichever
//! way it calls.
//!
//! Exit codes with `--json` (docs/contracts/errors.md):
//! 0 success; 1 any other failure; 4 not found (`unknown_tool`,
//! `unknown_plugin`, `tool_not_found`, `not_found`: no binding of the
//! export in the `--org` scope); 5 invalid arguments
//! (`invalid_arguments`, `invalid_config`, `invalid_binding`); 6 the tool failed (`tool_failed`,
//! `plugin_error`); 7 unavailable, retry later (`tool_unavailable`,
//! `plugin_unavailable`, `plugin_timeout`, `plugin_stopped`,
//! `plugin_changed`, `rate_limited`); 8 refused (`tool_denied`, `blocked_by_hook`, `tool_disabled`,
//! `call_denied`, `approval_*`). Without `--json`, every failure is exit 1
//! with the one-line `plugd: error: …` as before.
//!
//! A hosted MCP server that asks a question during the call
//! (`elicitation/create`) is answered on the terminal ([`Terminal`]): the
//! server's message, then accept/decline/cancel, then each field of its
//! requested schema, checked against that schema before it is sent back.
//! Without a terminal on stdin nobody is asked and the server gets an error
//! saying where it could be answered (`plugd serve`'s pending approvals).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use plugd_host::dialect::CallContext;
use plugd_runtime::Runtime;
use plugd_runtime::governed::{Governed, Surface};
use plugd_runtime::mcp_requests::{
    AskFuture, Asked, ElicitAction, ElicitAnswer, ElicitMode, Elicitation, Elicitor, check_content,
};
use serde_json::{Value, json};

use crate::client::Client;
use crate::errors::Failure;
use crate::remote::{Remote, RemoteError};

/// Sets who answers hosted MCP servers' questions: serve's and `plugd
/// mcp`'s pending approvals when `queue` (their stdin is not a person's),
/// the terminal for everything else.
pub fn install_elicitor(rt: &Runtime, queue: bool) {
    if queue {
        rt.use_elicitation_queue();
    } else {
        rt.set_elicitor(Arc::new(Terminal::default()));
    }
}

/// How many times a person may give form content that does not match the
/// server's schema before the question is cancelled.
const FORM_ATTEMPTS: usize = 3;

/// The terminal elicitor: one prompt at a time on `/dev/tty`.
#[derive(Default)]
struct Terminal {
    prompt: tokio::sync::Mutex<()>,
}

impl Elicitor for Terminal {
    fn elicit<'a>(&'a self, question: &'a Elicitation) -> AskFuture<'a> {
        Box::pin(async move {
            if !std::io::stdin().is_terminal() {
                return Asked::Unavailable(
                    "standard input is not a terminal; run the call from a terminal, or through `plugd serve` and answer with `plugd approvals approve ID --content JSON`".into(),
                );
            }
            let _one = self.prompt.lock().await;
            let question = question.clone();
            tokio::task::spawn_blocking(move || ask(&question))
                .await
                .unwrap_or_else(|e| Asked::Unavailable(format!("the prompt failed ({e})")))
        })
    }
}

/// Asks on the controlling terminal.
fn ask(q: &Elicitation) -> Asked {
    let tty = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    {
        Ok(t) => t,
        Err(e) => return Asked::Unavailable(format!("the terminal could not be opened ({e})")),
    };
    let mut out = &tty;
    let mut input = std::io::BufReader::new(&tty);
    let mut line = |prompt: &str| -> Option<String> {
        let _ = out.write_all(prompt.as_bytes()).and_then(|()| out.flush());
        let mut answer = String::new();
        match input.read_line(&mut answer) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(answer.trim_end_matches(['\r', '\n']).to_owned()),
        }
    };
    let message: String = q.message.chars().take(2000).collect();
    let header = match &q.mode {
        ElicitMode::Form { .. } => format!("\nplugd: MCP server {:?} asks: {message}\n", q.server),
        ElicitMode::Url { url } => format!(
            "\nplugd: MCP server {:?} asks you to open {url}\n  {message}\n",
            q.server
        ),
    };
    let cancel = || {
        Asked::Answered(ElicitAnswer {
            action: ElicitAction::Cancel,
            content: None,
        })
    };
    let Some(choice) = line(&format!("{header}[a]ccept, [d]ecline or [c]ancel? ")) else {
        return cancel();
    };
    let action = match choice.trim().to_ascii_lowercase().as_str() {
        "a" | "accept" | "y" | "yes" => ElicitAction::Accept,
        "d" | "decline" | "n" | "no" => ElicitAction::Decline,
        _ => ElicitAction::Cancel,
    };
    let schema = match (&q.mode, action) {
        (ElicitMode::Form { schema }, ElicitAction::Accept) => schema,
        _ => {
            return Asked::Answered(ElicitAnswer {
                action,
                content: None,
            });
        }
    };
    for _ in 0..FORM_ATTEMPTS {
        let Some(content) = fill_form(schema, &mut line) else {
            return cancel();
        };
        match check_content(schema, &content) {
            Ok(()) => {
                return Asked::Answered(ElicitAnswer {
                    action,
                    content: Some(content),
                });
            }
            Err(why) => {
                let _ = line(&format!("plugd: {why}; press Enter to try again "));
            }
        }
    }
    cancel()
}

/// Asks for each property of a (flat, as MCP requires) requested schema;
/// an empty answer leaves an optional field out (or takes its default).
/// `None` when the terminal closed.
fn fill_form(schema: &Value, line: &mut impl FnMut(&str) -> Option<String>) -> Option<Value> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut content = serde_json::Map::new();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Some(Value::Object(content));
    };
    for (name, prop) in props {
        let kind = prop.get("type").and_then(Value::as_str).unwrap_or("string");
        let choices: Vec<String> = prop
            .get("enum")
            .and_then(Value::as_array)
            .map(|e| {
                e.iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let mut hint = kind.to_owned();
        if required.contains(&name.as_str()) {
            hint.push_str(", required");
        }
        if !choices.is_empty() {
            hint.push_str(&format!(", one of {}", choices.join("|")));
        }
        if let Some(d) = prop.get("default") {
            hint.push_str(&format!(", default {d}"));
        }
        let label = prop
            .get("title")
            .or_else(|| prop.get("description"))
            .and_then(Value::as_str)
            .map(|t| format!(" ({})", t.chars().take(200).collect::<String>()))
            .unwrap_or_default();
        let text = line(&format!("  {name}{label} [{hint}]: "))?;
        if text.is_empty() {
            if let Some(d) = prop.get("default") {
                content.insert(name.clone(), d.clone());
            }
            continue;
        }
        let value = match kind {
            "integer" | "number" => serde_json::from_str::<Value>(text.trim())
                .ok()
                .filter(Value::is_number)
                .unwrap_or(Value::String(text)),
            "boolean" => match text.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" => Value::Bool(true),
                "n" | "no" | "false" => Value::Bool(false),
                _ => Value::String(text),
            },
            _ => Value::String(text),
        };
        content.insert(name.clone(), value);
    }
    Some(Value::Object(content))
}

/// `plugd tool call NAME --args JSON [--agent ID] [--json]`: through a
/// running serve (its `POST /v1/tools/NAME:invoke`, in serve's plugin
/// process) whenever one runs, else in this process with plugd.yaml's hooks;
/// either way through the governed path ([`plugd_runtime::governed`]), by
/// [`Client::call_tool`].
pub async fn run(
    rt: &Runtime,
    name: &str,
    args: &str,
    agent: Option<&str>,
    json_out: bool,
) -> Result<()> {
    let args = args_object(args)?;
    let client = Client::of(rt).await?;
    let result = client.call_tool(name, args, agent).await?;
    finish(&client, result, json_out)
}

/// `--args` as the JSON object every tool takes.
fn args_object(args: &str) -> Result<Value> {
    let args: Value = serde_json::from_str(args)
        .with_context(|| format!("--args is not valid JSON: {args:?}"))?;
    if !args.is_object() {
        bail!("--args must be a JSON object, got {args}");
    }
    Ok(args)
}

/// Prints a call's result, or reports its failure: with `--json` the typed
/// [`Failure`] (so [`crate::errors::report`] finds it after the plugins shut
/// down), else one line, naming serve's pid when serve made the call.
fn finish(client: &Client<'_>, result: Result<Value, Failure>, json_out: bool) -> Result<()> {
    match result {
        Ok(v) => crate::print_json(&v, !json_out),
        Err(e) if json_out => Err(e.into()),
        Err(e) => match client {
            Client::Serve(serve) => bail!("{} (in plugd serve pid {})", e.message, serve.pid()),
            Client::Local(_) => bail!("{}", e.message),
        },
    }
}

/// Runs `call` in this process under plugd.yaml's hooks (no serve runs, so
/// the pipeline is built here, installed in the runtime, and cleaned up
/// after the call).
async fn with_local_hooks<T>(rt: &Runtime, call: impl Future<Output = T>) -> Result<T> {
    let config = plugd_runtime::config::PlugdConfig::load(rt.dir())?;
    let pipeline = plugd_agent::hooks::build::build_pipeline(&config, rt).await?;
    let out = call.await;
    pipeline.cleanup().await;
    Ok(out)
}

/// A call's failure: the outer error is the command's own (a broken
/// plugd.yaml, serve not answering), the inner one the call's.
type CallResult = Result<Result<Value, Failure>>;

impl Client<'_> {
    /// Calls tool `name` through serve's streamed invoke or in this
    /// process; progress goes to stderr either way.
    pub async fn call_tool(&self, name: &str, args: Value, agent: Option<&str>) -> CallResult {
        match self {
            Client::Serve(serve) => call_via_serve(serve, name, args, agent).await,
            Client::Local(rt) => {
                let (progress, mut events) = tokio::sync::mpsc::unbounded_channel();
                let printer = tokio::spawn(async move {
                    while let Some(event) = events.recv().await {
                        eprintln!("progress: {}", crate::describe_progress(&event));
                    }
                });
                let ctx = CallContext {
                    agent_id: agent.map(str::to_owned),
                    progress: Some(progress),
                    caller: Some(format!("cli:{}", crate::approver(None))),
                    ..CallContext::default()
                };
                let gov = Governed::new(Surface::Cli);
                let result = with_local_hooks(rt, async {
                    let out = rt.call_tool_governed(name, args, &ctx, &gov).await.outcome;
                    drop(ctx);
                    let _ = printer.await;
                    out
                })
                .await?;
                Ok(result.map_err(Failure::from))
            }
        }
    }

    /// Calls package export `export` through the caller's binding in
    /// `scope`: serve's `POST /v1/plugin-tools/EXPORT:invoke` (as this user
    /// over the socket) or [`Runtime::call_export`] here.
    pub async fn call_export(
        &self,
        export: &str,
        args: Value,
        scope: &BoundScope<'_>,
    ) -> CallResult {
        match self {
            Client::Serve(serve) => {
                let body = json!({
                    "input": args,
                    "org_id": scope.org,
                    "project_id": scope.project,
                    "session_id": scope.session,
                });
                // serve's refusal stays the remote error it was (its own
                // report), as `plugd binding` and the other commands show it.
                let result = serve
                    .post(
                        &format!("/v1/plugin-tools/{export}:invoke"),
                        &body,
                        format!("tool call {export} --org {}", scope.org),
                    )
                    .await?;
                Ok(Ok(result))
            }
            Client::Local(rt) => {
                let call = plugd_runtime::bindings_rt::ExportCall {
                    org_id: scope.org.to_owned(),
                    project_id: scope.project.map(str::to_owned),
                    session_id: scope.session.map(str::to_owned),
                    caller: Some(format!("cli:{}", crate::approver(None))),
                    trace_id: None,
                };
                let result =
                    with_local_hooks(rt, rt.call_export(export, args, &call, None)).await?;
                Ok(result.map_err(Failure::from))
            }
        }
    }
}

/// How often a call through serve looks for a pending approval of itself.
const APPROVAL_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// [`Client::call_tool`] through serve: its streamed invoke (progress on
/// stderr, as here), the result returned; a call that waits on serve's
/// approval queue says on stderr how to decide it.
async fn call_via_serve(
    serve: &Remote,
    name: &str,
    args: Value,
    agent: Option<&str>,
) -> CallResult {
    let body = json!({"args": args, "agent_id": agent});
    let watcher = tokio::spawn(announce_approvals(
        serve.url("/v1/approvals"),
        serve.unbounded_client()?,
        name.to_owned(),
        serve.pid(),
    ));
    let mut result = None;
    let mut failure = None;
    let streamed = serve
        .post_sse(
            &format!("/v1/tools/{name}:invoke"),
            &body,
            format!("tool call {name}"),
            |event, data| {
                let v: Value =
                    serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_owned()));
                match event {
                    "progress" => eprintln!("progress: {}", crate::describe_progress(&v)),
                    "result" => result = Some(v),
                    "error" => failure = Some(v),
                    _ => {}
                }
            },
        )
        .await;
    watcher.abort();
    let api = |status: u16, code: &str, message: &str, details: Option<Value>| Failure {
        code: code.to_owned(),
        message: message.to_owned(),
        details,
        http_status: status,
    };
    Ok(Err(match (streamed, result, failure) {
        (Ok(()), Some(v), _) => return Ok(Ok(v)),
        (Ok(()), None, Some(body)) => api(
            body["status"].as_u64().unwrap_or(500) as u16,
            body["error"]["code"].as_str().unwrap_or("internal"),
            body["error"]["message"].as_str().unwrap_or("(no message)"),
            body["error"].get("details").cloned(),
        ),
        (Ok(()), None, None) => bail!(
            "plugd serve (pid {}) ended the call of {name:?} without a result; see serve's log",
            serve.pid()
        ),
        (
            Err(RemoteError::Api {
                status,
                code,
                message,
                ..
            }),
            _,
            _,
        ) => api(status, &code, &message, None),
        (Err(e), _, _) => return Err(e.into()),
    }))
}

/// Says on stderr, once per approval, how to decide a pending approval of
/// tool `name` in serve while the call waits on it.
async fn announce_approvals(url: String, client: reqwest::Client, name: String, pid: u32) {
    let mut told = std::collections::HashSet::new();
    loop {
        tokio::time::sleep(APPROVAL_POLL).await;
        let Ok(resp) = client.get(&url).send().await else {
            continue;
        };
        let Ok(list) = resp.json::<Value>().await else {
            continue;
        };
        for a in list.as_array().into_iter().flatten() {
            let (Some(id), Some(tool)) = (a["id"].as_str(), a["tool"].as_str()) else {
                continue;
            };
            if tool == name && told.insert(id.to_owned()) {
                eprintln!(
                    "plugd: the call of {name} (risk {}) waits for approval {id} in plugd serve (pid {pid}): run `plugd approvals approve {id}` (or `plugd approvals deny {id}`), or decide it in the console",
                    a["risk"].as_str().unwrap_or("?")
                );
            }
        }
    }
}

/// Where `plugd tool call EXPORT --org ORG` calls.
#[derive(Debug, Clone, Copy)]
pub struct BoundScope<'a> {
    /// `--org`.
    pub org: &'a str,
    /// `--project`.
    pub project: Option<&'a str>,
    /// `--session`.
    pub session: Option<&'a str>,
}

/// `plugd tool call EXPORT --org ORG [--project P] [--session S] --args JSON`:
/// through a running serve (its `POST /v1/plugin-tools/EXPORT:invoke`, as
/// this user over the socket) when one runs (a serve that does not answer
/// is an error naming its pid), else in this process through
/// [`Runtime::call_export`] with plugd.yaml's hooks, by [`Client::call_export`].
pub async fn run_bound(
    rt: &Runtime,
    export: &str,
    args: &str,
    scope: &BoundScope<'_>,
    json_out: bool,
) -> Result<()> {
    let args = args_object(args)?;
    let client = Client::of(rt).await?;
    let result = client.call_export(export, args, scope).await?;
    finish(&client, result, json_out)
}
