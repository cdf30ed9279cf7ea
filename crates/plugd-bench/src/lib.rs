//! `plugd bench`: plugd against the raw pipe baseline, measured in one run.
//!
//! * raw baseline: a minimal echo child (`raw-echo`, no JSON-RPC), one line
//!   out and one line back, with blocking pipe I/O on a dedicated thread;
//! * `tool.invoke` round trip to the Rust echo plugin through the whole
//!   runtime (registry, schema validation, supervisor, peer), sequential,
//!   measured in blocks alternating with the baseline's;
//! * throughput with 1, 16 and 64 calls in flight;
//! * cold start (spawn to `initialize` reply) of the Rust and Python examples,
//!   through plugd and through a bare harness (spawn, write, read one line);
//! * host memory per idle supervised plugin (RSS delta over N plugins).
//!
//! `--scale N` and `--flood` run other measurements instead (see
//! `scale.rs`), `--mcp-stdio` another (`mcp.rs`).
#![allow(clippy::print_stdout, clippy::print_stderr)] // the report and its progress lines are the bench's output

mod mcp;
mod scale;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use plugd_host::dialect::HostServices;
use plugd_host::spawn::{SpawnSpec, spawn};
use plugd_host::{HostConfig, NoObserver, Supervised};
use plugd_runtime::Runtime;
use serde::Serialize;
use serde_json::json;

const RUST_MANIFEST: &str =
    include_str!("../../../examples/workspace/.plugins/hello-rust/nexo-plugin.toml");
const PY_MANIFEST: &str =
    include_str!("../../../examples/workspace/.plugins/hello-python/nexo-plugin.toml");
const PY_PLUGIN: &str = include_str!("../../../examples/workspace/.plugins/hello-python/plugin.py");

/// Options of `plugd bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
    /// Sequential round trips measured (each of baseline and plugd).
    #[arg(long, default_value_t = 20_000)]
    iterations: u32,
    /// How long each concurrency level runs, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    duration_ms: u64,
    /// Cold starts measured per example.
    #[arg(long, default_value_t = 20)]
    cold_starts: u32,
    /// Idle plugins started for the memory measurement.
    #[arg(long, default_value_t = 20)]
    idle_plugins: u32,
    /// Instead: N eager bash plugins (default 1000): approve-all time, eager
    /// start through the start gate, GET /v1/plugins latency, RSS and fds per plugin.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1000")]
    scale: Option<u32>,
    /// Instead: another plugin's call latency alone and while one plugin
    /// writes 1,000,000 stderr lines and 1,000,000 dropped publishes.
    #[arg(long, conflicts_with = "scale")]
    flood: bool,
    /// Calls measured by `--flood` without the flood.
    #[arg(long, default_value_t = 2_000)]
    flood_samples: u32,
    /// Instead: an MCP load generator over stdio, the server given after
    /// `--` called directly and behind `plugd mcp`, as calls/s and ratio.
    #[arg(long, conflicts_with_all = ["scale", "flood"])]
    mcp_stdio: bool,
    /// `--mcp-stdio`: the tool called.
    #[arg(long, default_value = "echo")]
    mcp_tool: String,
    /// `--mcp-stdio`: its arguments (JSON).
    #[arg(long, default_value = r#"{"message":"the quick brown fox"}"#)]
    mcp_args: String,
    /// `--mcp-stdio`: calls kept in flight, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    mcp_in_flight: Vec<u32>,
    /// `--mcp-stdio`: the server's command line.
    #[arg(last = true)]
    command: Vec<String>,
    /// Instead: serve a bare axum server on ADDR that answers every request
    /// with a fixed JSON body (no auth, no store, no plugin), until killed:
    /// the machine's HTTP floor that `scripts/bench-http` measures beside
    /// serve.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["scale", "flood", "mcp_stdio"])]
    http_floor: Option<std::net::SocketAddr>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
}

#[derive(Debug, Serialize)]
struct Throughput {
    in_flight: u32,
    calls_per_sec: f64,
}

#[derive(Debug, Serialize)]
struct ColdStart {
    plugin: String,
    plugd_median_ms: f64,
    bare_median_ms: f64,
    overhead_ms: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    raw_pipe: Latency,
    /// The same `tool.invoke` line to the hello-rust plugin itself over a
    /// raw pipe, no plugd: the plugin's own share of a call.
    plugin_pipe: Latency,
    plugd_sequential: Latency,
    p50_ratio: f64,
    /// plugd's p50 over the plugin's own raw-pipe p50.
    p50_ratio_plugin: f64,
    throughput: Vec<Throughput>,
    cold_start: Vec<ColdStart>,
    idle_plugins: u32,
    host_kib_per_idle_plugin: f64,
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    anyhow::ensure!(
        path.is_file(),
        "{} not found next to plugd; build it with `cargo build --release --workspace --bins`",
        path.display()
    );
    Ok(path)
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1e6;
    let mean = samples.iter().map(Duration::as_secs_f64).sum::<f64>() / samples.len() as f64 * 1e6;
    Latency {
        p50_us: at(0.50),
        p99_us: at(0.99),
        mean_us: mean,
    }
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

/// Writes a plugin directory and returns it.
fn plugin_dir(root: &Path, name: &str, files: &[(&str, &str)]) -> Result<PathBuf> {
    let dir = root.join(".plugins").join(name);
    std::fs::create_dir_all(&dir)?;
    for (file, text) in files {
        std::fs::write(dir.join(file), text)?;
    }
    Ok(dir)
}

pub async fn run(args: &BenchArgs) -> Result<()> {
    if let Some(n) = args.scale {
        return crate::scale::scale(n, args.json).await;
    }
    if args.flood {
        return crate::scale::flood(args.flood_samples, args.json).await;
    }
    if let Some(addr) = args.http_floor {
        return http_floor(addr).await;
    }
    if args.mcp_stdio {
        let call_args: serde_json::Value =
            serde_json::from_str(&args.mcp_args).context("--mcp-args is not JSON")?;
        let bench = crate::mcp::McpBench {
            command: &args.command,
            tool: &args.mcp_tool,
            args: call_args,
            in_flight: args.mcp_in_flight.clone(),
            duration: Duration::from_millis(args.duration_ms),
        };
        return crate::mcp::run(bench, args.json).await;
    }
    let hello_rust = sibling("hello-rust")?;
    let raw_echo = sibling("raw-echo")?;
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path();
    // The echo plugin's command is a bare name, found next to plugd.
    plugin_dir(ws, "hello-rust", &[("nexo-plugin.toml", RUST_MANIFEST)])?;
    let py_dir = plugin_dir(
        ws,
        "hello-python",
        &[("nexo-plugin.toml", PY_MANIFEST), ("plugin.py", PY_PLUGIN)],
    )?;

    let payload = json!({"n": 0, "text": "the quick brown fox jumps over the lazy dog"});
    let line = format!(
        "{}\n",
        json!({"jsonrpc":"2.0","id":1,"method":"tool.invoke","params":{"plugin_id":"hello_rust","tool_name":"hello_rust_echo","args":payload,"agent_id":null}})
    );

    let rt = plugd_agent::open(ws, HostConfig::default()).await?;
    rt.approve("hello_rust", "bench").await?;
    eprintln!(
        "bench: raw pipes (raw-echo, hello-rust) and plugd round trips, interleaved ({} each)",
        args.iterations
    );
    let (raw, plugin_pipe, seq) = sequential(
        &rt,
        [&raw_echo, &hello_rust],
        &line,
        &payload,
        args.iterations,
    )
    .await?;

    let mut throughput = Vec::new();
    for in_flight in [1u32, 16, 64] {
        eprintln!("bench: {in_flight} in flight for {} ms", args.duration_ms);
        throughput.push(Throughput {
            in_flight,
            calls_per_sec: measure_throughput(
                &rt,
                &payload,
                in_flight,
                Duration::from_millis(args.duration_ms),
            )
            .await?,
        });
    }
    rt.shutdown().await;

    eprintln!("bench: cold starts ({} each)", args.cold_starts);
    let rust_spec = Arc::new(plugd_manifest::load_native(
        &ws.join(".plugins/hello-rust/nexo-plugin.toml"),
        &Default::default(),
    )?);
    let py_spec = Arc::new(plugd_manifest::load_native(
        &py_dir.join("nexo-plugin.toml"),
        &Default::default(),
    )?);
    let cold_start = vec![
        cold(&rust_spec, args.cold_starts).await?,
        cold(&py_spec, args.cold_starts).await?,
    ];

    eprintln!("bench: memory with {} idle plugins", args.idle_plugins);
    let per_plugin = idle_memory(&rust_spec, args.idle_plugins).await?;

    let report = Report {
        machine: machine(),
        p50_ratio: seq.p50_us / raw.p50_us,
        p50_ratio_plugin: seq.p50_us / plugin_pipe.p50_us,
        raw_pipe: raw,
        plugin_pipe,
        plugd_sequential: seq,
        throughput,
        cold_start,
        idle_plugins: args.idle_plugins,
        host_kib_per_idle_plugin: per_plugin,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// The `raw-echo` child, with plugd's spawn helper and no sandbox.
fn spawn_raw_echo(raw_echo: &Path) -> Result<plugd_host::spawn::Spawned> {
    Ok(spawn(&SpawnSpec {
        plugin_id: "raw-echo".into(),
        program: raw_echo.display().to_string(),
        args: Vec::new(),
        cwd: std::env::temp_dir(),
        containment: Default::default(),
        env: Default::default(),
    })?)
}

/// The raw baseline's child: one line out, one line back, blocking I/O on a
/// dedicated thread: the cheapest round trip a host can make with a child
/// over pipes.
struct RawEcho {
    stdin: std::fs::File,
    stdout: BufReader<std::fs::File>,
    line: String,
    _reaper: plugd_host::spawn::Reaper,
}

impl RawEcho {
    fn start(raw_echo: &Path, line: &str) -> Result<RawEcho> {
        let spawned = spawn_raw_echo(raw_echo)?;
        Ok(RawEcho {
            stdin: std::fs::File::from(spawned.stdin.into_owned_fd()?),
            stdout: BufReader::new(std::fs::File::from(spawned.stdout.into_owned_fd()?)),
            line: line.to_owned(),
            _reaper: spawned.reaper, // kills and reaps on drop
        })
    }

    /// `n` round trips; their durations are appended to `samples` when given.
    fn round_trips(&mut self, n: u32, mut samples: Option<&mut Vec<Duration>>) -> Result<()> {
        let mut buf = String::new();
        for _ in 0..n {
            let t = Instant::now();
            self.stdin.write_all(self.line.as_bytes())?;
            buf.clear();
            self.stdout.read_line(&mut buf)?;
            if let Some(s) = samples.as_deref_mut() {
                s.push(t.elapsed());
            }
        }
        Ok(())
    }
}

/// Sequential round trips, raw (to raw-echo, and to the plugin itself with
/// no plugd) and through plugd, in alternating blocks of 500 so all three
/// see the same machine (a shared VM drifts within seconds).
async fn sequential(
    rt: &Runtime,
    raw_children: [&Path; 2],
    line: &str,
    payload: &serde_json::Value,
    iterations: u32,
) -> Result<(Latency, Latency, Latency)> {
    const BLOCK: u32 = 500;
    let mut raws = [
        Some(RawEcho::start(raw_children[0], line)?),
        Some(RawEcho::start(raw_children[1], line)?),
    ];
    let mut raw_samples = [
        Vec::with_capacity(iterations as usize),
        Vec::with_capacity(iterations as usize),
    ];
    let mut plugd_samples = Vec::with_capacity(iterations as usize);
    // Warm-up of every side.
    for raw in &mut raws {
        raw.as_mut().expect("present").round_trips(1000, None)?;
    }
    for _ in 0..1000 {
        rt.call_tool("hello_rust_echo", payload.clone(), None)
            .await?;
    }
    let mut left = iterations;
    while left > 0 {
        let n = left.min(BLOCK);
        left -= n;
        for (raw, samples) in raws.iter_mut().zip(raw_samples.iter_mut()) {
            let mut echo = raw.take().expect("present");
            let (echo, block) =
                tokio::task::spawn_blocking(move || -> Result<(RawEcho, Vec<Duration>)> {
                    let mut block = Vec::with_capacity(n as usize);
                    echo.round_trips(n, Some(&mut block))?;
                    Ok((echo, block))
                })
                .await??;
            *raw = Some(echo);
            samples.extend(block);
        }
        // Callers of a running plugd (serve, HTTP handlers) are tasks on the
        // runtime's workers, not the thread blocked in `block_on`: measure that.
        let (rt2, payload2) = (rt.clone(), payload.clone());
        let block = tokio::spawn(async move {
            let mut block = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let t = Instant::now();
                rt2.call_tool("hello_rust_echo", payload2.clone(), None)
                    .await?;
                block.push(t.elapsed());
            }
            anyhow::Ok(block)
        })
        .await??;
        plugd_samples.extend(block);
    }
    let [raw, plugin] = raw_samples;
    Ok((latency(raw), latency(plugin), latency(plugd_samples)))
}

async fn measure_throughput(
    rt: &Runtime,
    payload: &serde_json::Value,
    in_flight: u32,
    dur: Duration,
) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let stop_at = start + dur;
    let mut tasks = Vec::new();
    for _ in 0..in_flight {
        let rt = rt.clone();
        let payload = payload.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop_at {
                rt.call_tool("hello_rust_echo", payload.clone(), None)
                    .await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn cold(spec: &Arc<plugd_manifest::PluginSpec>, n: u32) -> Result<ColdStart> {
    let config = Arc::new(HostConfig::default());
    let mut through_plugd = Vec::new();
    let mut bare = Vec::new();
    let init = format!(
        "{}\n",
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"nexo_version":"1.10.0"}})
    );
    for _ in 0..n {
        // Through plugd: spawn, peer, handshake with validation.
        let sup = Supervised::new(
            spec.clone(),
            config.clone(),
            Arc::new(NoObserver),
            HostServices::for_workspace(&spec.dir, plugd_dialects::table()),
        );
        let t = Instant::now();
        sup.connection(Instant::now() + Duration::from_secs(10))
            .await
            .with_context(|| format!("starting {}", spec.id))?;
        through_plugd.push(t.elapsed());
        sup.stop().await;

        // Bare: the same spawn, one line written, one line read.
        let t = Instant::now();
        let spawned = spawn(&SpawnSpec {
            plugin_id: spec.id.clone(),
            program: spec.command.program.clone(),
            args: spec.command.args.clone(),
            cwd: spec.dir.clone(),
            env: spec.command.env.clone(),
            containment: Default::default(),
        })?;
        let mut stdin = std::fs::File::from(spawned.stdin.into_owned_fd()?);
        let stdout = std::fs::File::from(spawned.stdout.into_owned_fd()?);
        let init = init.clone();
        let elapsed = tokio::task::spawn_blocking(move || -> Result<Duration> {
            stdin.write_all(init.as_bytes())?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            anyhow::ensure!(line.contains("\"result\""), "bad initialize reply: {line}");
            Ok(t.elapsed())
        })
        .await??;
        bare.push(elapsed);
        drop(spawned.reaper);
    }
    let plugd_median_ms = median_ms(through_plugd);
    let bare_median_ms = median_ms(bare);
    Ok(ColdStart {
        plugin: spec.id.clone(),
        plugd_median_ms,
        bare_median_ms,
        overhead_ms: plugd_median_ms - bare_median_ms,
    })
}

fn rss_kib() -> Result<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: f64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * rustix::param::page_size() as f64 / 1024.0)
}

async fn idle_memory(spec: &Arc<plugd_manifest::PluginSpec>, n: u32) -> Result<f64> {
    let config = Arc::new(HostConfig::default());
    // Warm up allocator and runtime with one plugin first.
    let warm = Supervised::new(
        spec.clone(),
        config.clone(),
        Arc::new(NoObserver),
        HostServices::for_workspace(&spec.dir, plugd_dialects::table()),
    );
    warm.connection(Instant::now() + Duration::from_secs(10))
        .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib()?;
    let mut sups = Vec::new();
    for _ in 0..n {
        let sup = Supervised::new(
            spec.clone(),
            config.clone(),
            Arc::new(NoObserver),
            HostServices::for_workspace(&spec.dir, plugd_dialects::table()),
        );
        sup.connection(Instant::now() + Duration::from_secs(10))
            .await?;
        sups.push(sup);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib()?;
    for s in sups.iter().chain(std::iter::once(&warm)) {
        s.stop().await;
    }
    Ok((after - before) / f64::from(n.max(1)))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!(
        "{cpu}, {cores} cores, {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

fn print_table(r: &Report) {
    println!("plugd bench on {}", r.machine);
    println!();
    println!(
        "{:<40} {:>10} {:>10} {:>10}",
        "round trip (sequential)", "p50 µs", "p99 µs", "mean µs"
    );
    for (name, l) in [
        ("raw pipe baseline (raw-echo)", &r.raw_pipe),
        ("raw pipe to hello-rust (no plugd)", &r.plugin_pipe),
        ("plugd tool.invoke (hello-rust)", &r.plugd_sequential),
    ] {
        println!(
            "{:<40} {:>10.1} {:>10.1} {:>10.1}",
            name, l.p50_us, l.p99_us, l.mean_us
        );
    }
    println!("{:<40} {:>10.2}x", "plugd p50 / raw p50", r.p50_ratio);
    println!(
        "{:<40} {:>10.2}x",
        "plugd p50 / hello-rust raw p50", r.p50_ratio_plugin
    );
    println!();
    println!("{:<40} {:>10}", "calls in flight", "calls/s");
    for t in &r.throughput {
        println!("{:<40} {:>10.0}", t.in_flight, t.calls_per_sec);
    }
    println!();
    println!(
        "{:<40} {:>10} {:>10} {:>10}",
        "cold start (median)", "plugd ms", "bare ms", "overhead"
    );
    for c in &r.cold_start {
        println!(
            "{:<40} {:>10.2} {:>10.2} {:>10.2}",
            c.plugin, c.plugd_median_ms, c.bare_median_ms, c.overhead_ms
        );
    }
    println!();
    println!(
        "host memory per idle supervised plugin: {:.0} KiB (over {} plugins)",
        r.host_kib_per_idle_plugin, r.idle_plugins
    );
}

/// `--http-floor`: serve's own listener (hyper, its timeouts and
/// connection cap) around an axum router with a fixed answer, minus
/// everything plugd does per request (auth, audit, routing, the runtime).
/// `POST /pipe` also takes each request's body (one line) to a `raw-echo`
/// child over pipes and answers with the line it sends back: HTTP plus the
/// one child round trip any out-of-process tool call needs, with no JSON,
/// no store and no bookkeeping; the floor of a tool invoke on this machine.
async fn http_floor(addr: std::net::SocketAddr) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let pipe = PipeFloor::start(&sibling("raw-echo")?)?;
    let app = axum::Router::new()
        .route(
            "/pipe",
            axum::routing::post(move |body: axum::body::Bytes| {
                let pipe = pipe.clone();
                async move {
                    match pipe.round_trip(body).await {
                        Some(line) => (
                            axum::http::StatusCode::OK,
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            line,
                        ),
                        None => (
                            axum::http::StatusCode::BAD_GATEWAY,
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            axum::body::Bytes::from_static(b"{\"error\":\"raw-echo is gone\"}"),
                        ),
                    }
                }
            }),
        )
        .fallback(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                r#"{"ok":true}"#,
            )
        });
    #[allow(clippy::print_stdout)]
    {
        println!("plugd bench http floor on http://{local}");
    }
    // No auth middleware on the floor: no unauthenticated pool either.
    plugd_node::bench_surface::listener_floor(listener, app).await
}

/// The `/pipe` route's child: lines written by one task (each burst in one
/// write) and read back by another, answered in order (raw-echo keeps the
/// order), so no ids and no JSON.
#[derive(Clone)]
struct PipeFloor {
    tx: tokio::sync::mpsc::UnboundedSender<(
        axum::body::Bytes,
        tokio::sync::oneshot::Sender<axum::body::Bytes>,
    )>,
}

impl PipeFloor {
    fn start(raw_echo: &Path) -> Result<PipeFloor> {
        use std::collections::VecDeque;
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let spawned = spawn_raw_echo(raw_echo)?;
        let mut stdin =
            tokio::fs::File::from_std(std::fs::File::from(spawned.stdin.into_owned_fd()?));
        let stdout =
            tokio::fs::File::from_std(std::fs::File::from(spawned.stdout.into_owned_fd()?));
        let reaper = spawned.reaper;
        type Waiting = Arc<Mutex<VecDeque<tokio::sync::oneshot::Sender<axum::body::Bytes>>>>;
        let waiting: Waiting = Arc::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(
            axum::body::Bytes,
            tokio::sync::oneshot::Sender<axum::body::Bytes>,
        )>();
        let w = waiting.clone();
        tokio::spawn(async move {
            let _reaper = reaper; // kills and reaps the child when this ends
            let mut buf = Vec::with_capacity(64 * 1024);
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                while let Some((line, reply)) = next.take() {
                    w.lock().unwrap_or_else(|p| p.into_inner()).push_back(reply);
                    // One line each, whatever the body holds.
                    buf.extend(
                        line.trim_ascii_end()
                            .iter()
                            .map(|&b| if b == b'\n' { b' ' } else { b }),
                    );
                    buf.push(b'\n');
                    next = rx.try_recv().ok();
                }
                if stdin.write_all(&buf).await.is_err() {
                    return;
                }
                buf.clear();
            }
        });
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::with_capacity(64 * 1024, stdout);
            let mut line = Vec::with_capacity(4096);
            loop {
                line.clear();
                match lines.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let reply = waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop_front();
                if let Some(reply) = reply {
                    let _ = reply.send(axum::body::Bytes::copy_from_slice(&line));
                }
            }
        });
        Ok(PipeFloor { tx })
    }

    /// `line` to the child and back; `None` when the child is gone.
    async fn round_trip(&self, line: axum::body::Bytes) -> Option<axum::body::Bytes> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx.send((line, reply)).ok()?;
        answer.await.ok()
    }
}
