//! plugd-sdk: write a native plugd / nexo plugin in Rust — a synchronous stdio JSON-RPC child loop.
//!
//! ```no_run
//! use plugd_sdk::{Plugin, ToolDef, text_result};
//! use serde_json::json;
//!
//! const MANIFEST: &str = r#"
//! [plugin]
//! id = "demo"
//! version = "0.1.0"
//! [plugin.extends]
//! tools = ["demo_greet"]
//! "#;
//!
//! fn main() -> std::io::Result<()> {
//!     Plugin::from_manifest(MANIFEST)
//!         .expect("valid manifest")
//!         .tool(
//!             ToolDef::new("demo_greet", "Greet someone", json!({"type": "object"})),
//!             |inv| Ok(text_result(&format!("Hello, {}!", inv.str_arg("name")?))),
//!         )
//!         .run_stdio()
//! }
//! ```
//!
//! The loop reads newline-delimited JSON-RPC 2.0 (contract §1) and answers
//! `initialize`, `tool.invoke` and `shutdown`. It is deliberately
//! single-threaded: handlers run in arrival order on the reading thread, and
//! replies are buffered and flushed only when no further input is already
//! buffered, so a pipelined burst of requests costs one `write(2)`.
//!
//! **API boundary:** nothing here touches stdout except [`Plugin::run_stdio`];
//! diagnostics go to stderr with `[WARN] ` / `[ERROR] ` prefixes.

mod manifest;
mod tool;

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Serialize;
use serde_json::{Value, json};

pub use manifest::SdkError;
pub use tool::{Invocation, ToolDef, ToolError, text_result};

/// Default cap on one inbound line; longer lines are skipped.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

const READ_BUFFER: usize = 64 * 1024;
const WRITE_BUFFER: usize = 64 * 1024;

type Handler = Box<dyn Fn(&Invocation) -> Result<Value, ToolError> + Send + Sync + 'static>;

/// A plugin: its manifest, its tools, and the stdio loop that serves them.
pub struct Plugin {
    manifest: manifest::Manifest,
    server_version: String,
    tools: Vec<ToolDef>,
    handlers: HashMap<String, Handler>,
    duplicate: Option<String>,
    max_frame_bytes: usize,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("id", &self.manifest.id)
            .field("version", &self.manifest.version)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Plugin {
    /// Parses `nexo-plugin.toml` text: checks `plugin.id` and
    /// `plugin.version`, and keeps the whole manifest (as JSON) to echo in
    /// the `initialize` reply.
    pub fn from_manifest(toml_text: &str) -> Result<Plugin, SdkError> {
        let manifest = manifest::Manifest::parse(toml_text)?;
        Ok(Plugin {
            server_version: format!("{}-{}", manifest.id, manifest.version),
            manifest,
            tools: Vec::new(),
            handlers: HashMap::new(),
            duplicate: None,
            max_frame_bytes: MAX_FRAME_BYTES,
        })
    }

    /// Registers a tool and its handler. The catalog is checked against the
    /// manifest when serving starts (see [`Plugin::check`]).
    pub fn tool<F>(mut self, def: ToolDef, handler: F) -> Self
    where
        F: Fn(&Invocation) -> Result<Value, ToolError> + Send + Sync + 'static,
    {
        if self
            .handlers
            .insert(def.name.clone(), Box::new(handler))
            .is_some()
        {
            self.duplicate.get_or_insert_with(|| def.name.clone());
        } else {
            self.tools.push(def);
        }
        self
    }

    /// Overrides `server_version` in the `initialize` reply (default
    /// `<id>-<version>`).
    pub fn server_version(mut self, v: impl Into<String>) -> Self {
        self.server_version = v.into();
        self
    }

    /// Overrides the inbound line cap (default [`MAX_FRAME_BYTES`]).
    pub fn max_frame_bytes(mut self, n: usize) -> Self {
        self.max_frame_bytes = n.max(1);
        self
    }

    /// The manifest's `plugin.id`.
    pub fn id(&self) -> &str {
        &self.manifest.id
    }

    /// Fails the way the host would refuse the plugin: a tool registered
    /// twice, not namespaced, or not in `[plugin.extends] tools`.
    pub fn check(&self) -> Result<(), SdkError> {
        if let Some(d) = &self.duplicate {
            return Err(SdkError::DuplicateTool(d.clone()));
        }
        for t in &self.tools {
            if !manifest::is_namespaced(&t.name, &self.manifest.id) {
                return Err(SdkError::UnnamespacedTool {
                    tool: t.name.clone(),
                    plugin_id: self.manifest.id.clone(),
                });
            }
            if !self.manifest.declared_tools.contains(&t.name) {
                return Err(SdkError::UndeclaredTool(t.name.clone()));
            }
        }
        Ok(())
    }

    /// Serves stdin/stdout until `shutdown` or end of input.
    pub fn run_stdio(self) -> io::Result<()> {
        let stdin = io::stdin();
        let stdout = io::stdout();
        self.serve(stdin.lock(), stdout.lock())
    }

    /// Serves any byte stream pair until `shutdown` or end of input (the
    /// in-memory twin of [`Plugin::run_stdio`]). Replies are flushed only
    /// when the reader has no more buffered input.
    pub fn serve<R: Read, W: Write>(&self, input: R, output: W) -> io::Result<()> {
        self.check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut reader = BufReader::with_capacity(READ_BUFFER, input);
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, output);
        let mut line = Vec::with_capacity(4096);
        loop {
            match read_frame(&mut reader, &mut line, self.max_frame_bytes)? {
                Frame::Eof => break,
                Frame::TooLong(n) => warn(format_args!(
                    "skipped an inbound line of {n} bytes; the limit is {} bytes",
                    self.max_frame_bytes
                )),
                Frame::Line => {
                    if self.handle_line(&line, &mut out)? == Flow::Shutdown {
                        out.flush()?;
                        return Ok(());
                    }
                }
            }
            if reader.buffer().is_empty() {
                out.flush()?;
            }
        }
        out.flush()
    }

    fn handle_line<W: Write>(&self, line: &[u8], out: &mut W) -> io::Result<Flow> {
        let text = line.trim_ascii();
        if text.is_empty() {
            return Ok(Flow::Continue);
        }
        let msg: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => {
                warn(format_args!(
                    "ignored a line that is not JSON ({e}): {}",
                    preview(text)
                ));
                return Ok(Flow::Continue);
            }
        };
        let Some(obj) = msg.as_object() else {
            warn(format_args!(
                "ignored a JSON line that is not an object: {}",
                preview(text)
            ));
            return Ok(Flow::Continue);
        };
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            warn(format_args!(
                "ignored a frame without a method: {}",
                preview(text)
            ));
            return Ok(Flow::Continue);
        };
        // A request without an id is a notification: never answered.
        let Some(id) = obj.get("id") else {
            return Ok(Flow::Continue);
        };
        let params = obj.get("params").unwrap_or(&Value::Null);
        match method {
            "initialize" => {
                let result = json!({
                    "manifest": self.manifest.json,
                    "server_version": self.server_version,
                    "tools": self.tools,
                });
                write_result(out, id, &result)?;
            }
            "tool.invoke" => self.invoke(id, params, out)?,
            "shutdown" => {
                write_result(out, id, &json!({ "ok": true }))?;
                return Ok(Flow::Shutdown);
            }
            other => write_error(out, id, -32601, &format!("method not found: {other}"), None)?,
        }
        Ok(Flow::Continue)
    }

    fn invoke<W: Write>(&self, id: &Value, params: &Value, out: &mut W) -> io::Result<()> {
        let Some(tool_name) = params.get("tool_name").and_then(Value::as_str) else {
            return write_error(
                out,
                id,
                -32602,
                "invalid params: `tool_name` must be a string",
                None,
            );
        };
        let Some(handler) = self.handlers.get(tool_name) else {
            let e = ToolError::NotFound(tool_name.to_owned());
            return write_error(out, id, e.code(), &e.to_string(), e.data());
        };
        let inv = Invocation {
            plugin_id: params
                .get("plugin_id")
                .and_then(Value::as_str)
                .unwrap_or(&self.manifest.id)
                .to_owned(),
            tool_name: tool_name.to_owned(),
            args: params.get("args").cloned().unwrap_or(Value::Null),
            agent_id: params
                .get("agent_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
        };
        match catch_unwind(AssertUnwindSafe(|| handler(&inv))) {
            Ok(Ok(result)) => write_result(out, id, &result),
            Ok(Err(e)) => write_error(out, id, e.code(), &e.to_string(), e.data()),
            Err(_) => {
                let e = ToolError::ExecutionFailed(format!("handler for {tool_name:?} panicked"));
                write_error(out, id, e.code(), &e.to_string(), None)
            }
        }
    }
}

#[derive(PartialEq)]
enum Flow {
    Continue,
    Shutdown,
}

enum Frame {
    Eof,
    Line,
    TooLong(usize),
}

/// Reads one `\n`-terminated line into `line` (without the newline). A line
/// longer than `max` is consumed and dropped without being held in memory.
/// A final line without a newline still counts.
fn read_frame<R: Read>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Frame> {
    line.clear();
    let mut skipped: Option<usize> = None;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(match skipped {
                Some(n) => Frame::TooLong(n),
                None if line.is_empty() => Frame::Eof,
                None => Frame::Line,
            });
        }
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        match skipped.as_mut() {
            Some(n) => *n += chunk.len(),
            None if line.len() + chunk.len() > max => {
                skipped = Some(line.len() + chunk.len());
                line.clear();
            }
            None => line.extend_from_slice(chunk),
        }
        let used = done.unwrap_or(buf.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(match skipped {
                Some(n) => Frame::TooLong(n),
                None => Frame::Line,
            });
        }
    }
}

#[derive(Serialize)]
struct ResultFrame<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    result: &'a Value,
}

#[derive(Serialize)]
struct ErrorFrame<'a> {
    jsonrpc: &'static str,
    id: &'a Value,
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: i64,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
}

fn write_result<W: Write>(out: &mut W, id: &Value, result: &Value) -> io::Result<()> {
    serde_json::to_writer(
        &mut *out,
        &ResultFrame {
            jsonrpc: "2.0",
            id,
            result,
        },
    )?;
    out.write_all(b"\n")
}

fn write_error<W: Write>(
    out: &mut W,
    id: &Value,
    code: i64,
    message: &str,
    data: Option<Value>,
) -> io::Result<()> {
    serde_json::to_writer(
        &mut *out,
        &ErrorFrame {
            jsonrpc: "2.0",
            id,
            error: ErrorBody {
                code,
                message,
                data,
            },
        },
    )?;
    out.write_all(b"\n")
}

fn preview(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(120)]);
    format!("{s:?}")
}

fn warn(args: std::fmt::Arguments<'_>) {
    // Best effort: a closed stderr must not stop the plugin.
    let _ = writeln!(io::stderr().lock(), "[WARN] plugd-sdk: {args}");
}

#[cfg(test)]
mod tests;
