//! `plugd bench --mcp-stdio -- SERVER_COMMAND…`: an MCP load generator over
//! stdio, measuring one MCP server talked to directly against the same server
//! behind `plugd mcp` (the gateway: session, governance, the runtime, the
//! hosted server's supervisor), in one run, as calls per second and their
//! ratio.
//!
//! Both sides get the same client: native, one process, JSON-RPC lines,
//! `initialize` then `tools/call` kept at a fixed number in flight for a
//! fixed time after a warm-up. The server runs as plugd runs it (plugd's
//! spawn helper, the same environment allowlist), so only plugd's own cost
//! differs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plugd_host::HostConfig;
use plugd_host::spawn::{SpawnSpec, spawn};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// What `--mcp-stdio` measures.
#[derive(Debug)]
pub struct McpBench<'a> {
    /// The server's command line.
    pub command: &'a [String],
    /// The tool called.
    pub tool: &'a str,
    /// Its arguments.
    pub args: Value,
    /// Calls in flight.
    pub in_flight: Vec<u32>,
    /// How long each level runs.
    pub duration: Duration,
}

#[derive(Debug, Serialize)]
struct Level {
    in_flight: u32,
    direct_calls_per_sec: f64,
    via_plugd_calls_per_sec: f64,
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct McpReport {
    machine: String,
    server: String,
    tool: String,
    levels: Vec<Level>,
}

/// A started MCP server (or `plugd mcp`) with an initialized session.
struct Client {
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    handle: plugd_host::spawn::ProcessHandle,
    _reaper: plugd_host::spawn::Reaper,
    next: u64,
}

impl Client {
    async fn start(program: &str, args: &[String], cwd: &Path) -> Result<Client> {
        let spawned = spawn(&SpawnSpec {
            plugin_id: "bench".into(),
            program: program.to_owned(),
            args: args.to_vec(),
            cwd: cwd.to_path_buf(),
            env: BTreeMap::new(),
            containment: Default::default(),
        })?;
        let mut c = Client {
            stdin: spawned.stdin,
            lines: BufReader::new(spawned.stdout).lines(),
            handle: spawned.handle,
            _reaper: spawned.reaper,
            next: 1,
        };
        let init = c
            .request(
                "initialize",
                json!({"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "plugd-bench", "version": env!("CARGO_PKG_VERSION")}}),
            )
            .await?;
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        c.answer(init, Duration::from_secs(60)).await?;
        Ok(c)
    }

    async fn send(&mut self, msg: Value) -> Result<()> {
        let mut line = serde_json::to_vec(&msg)?;
        line.push(b'\n');
        self.stdin.write_all(&line).await?;
        Ok(())
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<u64> {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    /// Reads until the answer to `id` (notifications and other answers skipped).
    async fn answer(&mut self, id: u64, limit: Duration) -> Result<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let line = tokio::time::timeout_at(deadline.into(), self.lines.next_line())
                .await
                .context("no answer in time")??
                .context("the server closed its output")?;
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v.get("id").and_then(Value::as_u64) == Some(id) && v.get("method").is_none() {
                if let Some(e) = v.get("error") {
                    bail!("request {id} failed: {e}");
                }
                return Ok(v);
            }
        }
    }

    /// Keeps `in_flight` calls outstanding for `duration`; calls per second.
    async fn load(
        &mut self,
        tool: &str,
        args: &Value,
        in_flight: u32,
        duration: Duration,
    ) -> Result<f64> {
        let params = json!({"name": tool, "arguments": args});
        let mut outstanding = 0u32;
        let mut done = 0u64;
        let started = Instant::now();
        while outstanding < in_flight {
            self.request("tools/call", params.clone()).await?;
            outstanding += 1;
        }
        while outstanding > 0 {
            let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
                .await
                .context("a call got no answer in 30 s")??
                .context("the server closed its output")?;
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v.get("id").is_none() || v.get("method").is_some() {
                continue;
            }
            if v.pointer("/result/isError") == Some(&Value::Bool(true)) || v.get("error").is_some()
            {
                bail!("a call failed: {line}");
            }
            outstanding -= 1;
            done += 1;
            if started.elapsed() < duration {
                self.request("tools/call", params.clone()).await?;
                outstanding += 1;
            }
        }
        Ok(done as f64 / started.elapsed().as_secs_f64())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.handle.kill_group();
    }
}

/// Runs the measurement and prints it.
pub async fn run(b: McpBench<'_>, json_out: bool) -> Result<()> {
    let Some((program, args)) = b.command.split_first() else {
        bail!("--mcp-stdio needs the server's command after `--`, e.g. `-- node server.js stdio`");
    };
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path();
    std::fs::write(
        ws.join(".mcp.json"),
        json!({"mcpServers": {"srv": {"command": program, "args": args}}}).to_string(),
    )?;
    {
        let rt = plugd_agent::open(ws, HostConfig::default()).await?;
        rt.approve("srv", "plugd bench").await?;
        rt.shutdown().await;
    }
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy().into_owned();
    let gateway_args = vec![
        "--workspace".to_owned(),
        ws.to_string_lossy().into_owned(),
        "mcp".to_owned(),
    ];
    let via_tool = format!("srv__{}", b.tool);
    let mut direct = Client::start(program, args, ws).await?;
    let mut via = Client::start(&exe, &gateway_args, ws).await?;
    // Warm-up: JITs, caches, the hosted server started by the gateway.
    direct
        .load(b.tool, &b.args, 4, Duration::from_millis(500))
        .await?;
    via.load(&via_tool, &b.args, 4, Duration::from_millis(500))
        .await?;
    let mut levels = Vec::new();
    for &n in &b.in_flight {
        // Alternate halves so a slow moment of the machine hits both.
        let half = b.duration / 2;
        let d1 = direct.load(b.tool, &b.args, n, half).await?;
        let v1 = via.load(&via_tool, &b.args, n, half).await?;
        let v2 = via.load(&via_tool, &b.args, n, half).await?;
        let d2 = direct.load(b.tool, &b.args, n, half).await?;
        let (d, v) = ((d1 + d2) / 2.0, (v1 + v2) / 2.0);
        levels.push(Level {
            in_flight: n,
            direct_calls_per_sec: d,
            via_plugd_calls_per_sec: v,
            ratio: v / d,
        });
    }
    let report = McpReport {
        machine: crate::machine(),
        server: b.command.join(" "),
        tool: b.tool.to_owned(),
        levels,
    };
    #[allow(clippy::print_stdout)]
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}; server: {}; tool {}",
            report.machine, report.server, report.tool
        );
        println!("in flight  direct calls/s  via plugd mcp calls/s  ratio");
        for l in &report.levels {
            println!(
                "{:>9}  {:>14.0}  {:>21.0}  {:>5.2}",
                l.in_flight, l.direct_calls_per_sec, l.via_plugd_calls_per_sec, l.ratio
            );
        }
    }
    Ok(())
}
