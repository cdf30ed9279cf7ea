//! `plugd bench --scale N` and `plugd bench --flood`: many plugins at once,
//! and one plugin flooding the host while another is called.
//!
//! Scale: a workspace of N small bash native plugins (eager) is built and
//! approved; a fresh runtime then starts them the way serve does (through the
//! start gate, `PLUGD_START_CONCURRENCY`) behind a real HTTP API on loopback.
//! Reported: approve-all time, time until every plugin runs, how many missed
//! their initialize deadline (restarts, failures), `GET /v1/plugins` latency
//! while they start and once they run, host RSS and fds per running plugin.
//!
//! Flood: `calm` is called sequentially, first alone, then while `flood`
//! writes 1,000,000 stderr lines and sends 1,000,000 dropped publishes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plugd_host::{HostConfig, Status};
use plugd_runtime::Runtime;
use serde::Serialize;
use serde_json::json;

const FLOOD_PY: &str = include_str!("../../../tests/plugins/resilience/flood.py");

/// A bash native plugin answering initialize and one echo tool, in the
/// style of examples/workspace/.plugins/hello-bash (no jq).
fn bash_plugin(id: &str) -> (String, String) {
    let manifest = format!(
        "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"bash\"\nargs = [\"plugin.sh\"]\n\n[plugin.extends]\ntools = [\"{id}_echo\"]\n\n[plugin.supervisor]\nstart = \"eager\"\n"
    );
    let script = format!(
        r#"#!/usr/bin/env bash
# {id}: a minimal bash native plugin for plugd bench --scale.
MANIFEST='{{"plugin":{{"id":"{id}","version":"0.1.0","entrypoint":{{"command":"bash","args":["plugin.sh"]}},"extends":{{"tools":["{id}_echo"]}},"supervisor":{{"start":"eager"}}}}}}'
TOOLS='[{{"name":"{id}_echo","description":"echo","input_schema":{{"type":"object"}}}}]'
re_id='"id"[[:space:]]*:[[:space:]]*(-?[0-9]+|"[^"]*")'
re_method='"method"[[:space:]]*:[[:space:]]*"([^"]*)"'
while IFS= read -r line; do
  [[ $line =~ $re_method ]] || continue
  method=${{BASH_REMATCH[1]}}
  [[ $line =~ $re_id ]] || continue
  id=${{BASH_REMATCH[1]}}
  case $method in
    initialize) printf '{{"jsonrpc":"2.0","id":%s,"result":{{"manifest":%s,"server_version":"{id}-0.1.0","tools":%s}}}}\n' "$id" "$MANIFEST" "$TOOLS" ;;
    tool.invoke) printf '{{"jsonrpc":"2.0","id":%s,"result":{{"ok":true}}}}\n' "$id" ;;
    shutdown) printf '{{"jsonrpc":"2.0","id":%s,"result":{{"ok":true}}}}\n' "$id"; exit 0 ;;
    *) printf '{{"jsonrpc":"2.0","id":%s,"error":{{"code":-32601,"message":"no"}}}}\n' "$id" ;;
  esac
done
"#
    );
    (manifest, script)
}

#[derive(Debug, Serialize)]
struct Ms {
    p50_ms: f64,
    p99_ms: f64,
    samples: usize,
}

fn quantiles(mut v: Vec<Duration>) -> Ms {
    v.sort();
    let at = |q: f64| {
        v.get(((v.len().max(1) - 1) as f64 * q) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Ms {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        samples: v.len(),
    }
}

#[derive(Debug, Serialize)]
struct ScaleReport {
    plugins: u32,
    start_concurrency: usize,
    approve_all_s: f64,
    open_s: f64,
    api_up_after_ms: f64,
    all_running_s: f64,
    running: usize,
    restarts: u64,
    failed: u64,
    list_while_starting: Ms,
    list_once_running: Ms,
    host_kib_per_plugin: f64,
    fds_per_plugin: f64,
}

fn fds() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

fn rss_kib() -> Result<f64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: f64 = statm.split_whitespace().nth(1).context("statm")?.parse()?;
    Ok(pages * rustix::param::page_size() as f64 / 1024.0)
}

/// A client that reaches the API over `socket` (as its owner: an admin).
fn client(socket: &Path) -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .no_proxy()
        .unix_socket(socket.to_owned())
        .timeout(Duration::from_secs(60))
        .build()?)
}

/// How long one `GET url` took, body included.
async fn timed_get(http: &reqwest::Client, url: &str) -> Result<Duration> {
    let q = Instant::now();
    http.get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    Ok(q.elapsed())
}

pub async fn scale(n: u32, json_out: bool) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path();
    let ids: Vec<String> = (0..n).map(|i| format!("p{i:04}")).collect();
    for id in &ids {
        let dir = ws.join(".plugins").join(id);
        std::fs::create_dir_all(&dir)?;
        let (manifest, script) = bash_plugin(id);
        std::fs::write(dir.join("nexo-plugin.toml"), manifest)?;
        std::fs::write(dir.join("plugin.sh"), script)?;
    }
    let config = HostConfig::from_env().map_err(anyhow::Error::msg)?;
    let concurrency = config.start_gate.size();

    // Approve all (each approval starts the plugin once for its catalog),
    // as many at once as the start gate allows.
    eprintln!("bench: approving {n} plugins");
    let rt = plugd_agent::open(ws, config.clone()).await?;
    let t = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut set = tokio::task::JoinSet::new();
    for id in &ids {
        let (rt, id, gate) = (rt.clone(), id.clone(), gate.clone());
        set.spawn(async move {
            let _p = gate.acquire_owned().await?;
            rt.approve(&id, "bench").await?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let approve_all_s = t.elapsed().as_secs_f64();
    rt.shutdown().await;
    drop(rt);

    // A fresh runtime, started the way serve starts.
    eprintln!("bench: opening the workspace and starting {n} eager plugins");
    let t = Instant::now();
    let rt = plugd_agent::open(ws, HostConfig::from_env().map_err(anyhow::Error::msg)?).await?;
    let open_s = t.elapsed().as_secs_f64();
    let (fds0, rss0) = (fds()?, rss_kib()?);
    let restarts = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    for id in &ids {
        let mut rx = rt.supervised(id)?.watch();
        let (restarts, failed) = (restarts.clone(), failed.clone());
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let s = rx.borrow_and_update().clone();
                match s {
                    Status::Backoff { .. } => {
                        restarts.fetch_add(1, Ordering::Relaxed);
                    }
                    Status::Failed { .. } => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        });
    }
    let t = Instant::now();
    let (socket, server) = plugd_node::bench_surface::api_on_socket(&rt).await?;
    let http = client(&socket)?;
    let url = "http://localhost/v1/plugins".to_owned();
    http.get(&url).send().await?.error_for_status()?;
    let api_up_after_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    rt.start_eager().await;
    let mut while_starting = Vec::new();
    let running = |rt: &Runtime| {
        ids.iter()
            .filter(|id| {
                rt.supervised(id)
                    .is_ok_and(|s| matches!(s.status(), Status::Running { .. }))
            })
            .count()
    };
    let limit = Duration::from_secs(600);
    while running(&rt) < ids.len() && t.elapsed() < limit {
        while_starting.push(timed_get(&http, &url).await?);
        if failed.load(Ordering::Relaxed) as usize + running(&rt) >= ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_running_s = t.elapsed().as_secs_f64();
    let up = running(&rt);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (fds1, rss1) = (fds()?, rss_kib()?);
    let mut once_running = Vec::new();
    for _ in 0..100 {
        once_running.push(timed_get(&http, &url).await?);
    }
    let per = |a: f64, b: f64| (b - a) / f64::from(n.max(1));
    let report = ScaleReport {
        plugins: n,
        start_concurrency: concurrency,
        approve_all_s,
        open_s,
        api_up_after_ms,
        all_running_s,
        running: up,
        restarts: restarts.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        list_while_starting: quantiles(while_starting),
        list_once_running: quantiles(once_running),
        host_kib_per_plugin: per(rss0, rss1),
        fds_per_plugin: per(fds0 as f64, fds1 as f64),
    };
    server.abort();
    eprintln!("bench: stopping {n} plugins");
    rt.shutdown().await;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let r = &report;
        println!(
            "plugd bench --scale {} (start concurrency {})",
            r.plugins, r.start_concurrency
        );
        println!("approve all:                 {:.1} s", r.approve_all_s);
        println!("open the workspace:          {:.2} s", r.open_s);
        println!("API answering after:         {:.0} ms", r.api_up_after_ms);
        println!(
            "all running after:           {:.1} s ({} of {} running)",
            r.all_running_s, r.running, r.plugins
        );
        println!(
            "missed deadline:             {} restarts, {} failed",
            r.restarts, r.failed
        );
        for (what, m) in [
            ("GET /v1/plugins, starting:", &r.list_while_starting),
            ("GET /v1/plugins, running:", &r.list_once_running),
        ] {
            println!(
                "{what:<28} p50 {:.1} ms, p99 {:.1} ms ({} requests)",
                m.p50_ms, m.p99_ms, m.samples
            );
        }
        println!(
            "host per running plugin:     {:.0} KiB RSS, {:.1} fds",
            r.host_kib_per_plugin, r.fds_per_plugin
        );
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct FloodReport {
    quiet: Ms,
    flooded: Ms,
    stderr_lines: u64,
    publishes: u64,
    dropped_publishes: u64,
    log_lines_dropped: u64,
    flood_s: f64,
}

fn flood_plugin(ws: &Path, id: &str) -> Result<()> {
    let dir = ws.join(".plugins").join(id);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("flood.py"), FLOOD_PY)?;
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"flood.py\"]\n\n[plugin.extends]\ntools = [\"{id}_go\", \"{id}_status\", \"{id}_echo\"]\n"
        ),
    )?;
    Ok(())
}

pub async fn flood(samples: u32, json_out: bool) -> Result<()> {
    const N: u64 = 1_000_000;
    let tmp = tempfile::tempdir()?;
    let ws = tmp.path();
    flood_plugin(ws, "flood")?;
    flood_plugin(ws, "calm")?;
    let rt = plugd_agent::open(ws, HostConfig::from_env().map_err(anyhow::Error::msg)?).await?;
    rt.approve("flood", "bench").await?;
    rt.approve("calm", "bench").await?;
    let call = |n: u32| {
        let rt = rt.clone();
        async move {
            let t = Instant::now();
            rt.call_tool("calm_echo", json!({ "n": n }), None).await?;
            anyhow::Ok(t.elapsed())
        }
    };
    for i in 0..200 {
        call(i).await?;
    }
    eprintln!("bench: {samples} calls of calm_echo, quiet");
    let mut quiet = Vec::new();
    for i in 0..samples {
        quiet.push(call(i).await?);
    }
    eprintln!("bench: calm_echo while flood writes {N} stderr lines and {N} dropped publishes");
    let t = Instant::now();
    rt.call_tool("flood_go", json!({"stderr": N, "publish": N}), None)
        .await?;
    let mut flooded = Vec::new();
    let mut i = 0;
    loop {
        flooded.push(call(i).await?);
        i += 1;
        if i % 50 == 0 {
            let s = rt.call_tool("flood_status", json!({}), None).await?;
            if s["done"] == true {
                break;
            }
        }
    }
    let flood_s = t.elapsed().as_secs_f64();
    let dropped = rt
        .plugin("flood")
        .await?
        .broker
        .map(|b| b.dropped)
        .unwrap_or_default();
    rt.shutdown().await;
    let report = FloodReport {
        quiet: quantiles(quiet),
        flooded: quantiles(flooded),
        stderr_lines: N,
        publishes: N,
        dropped_publishes: dropped,
        log_lines_dropped: plugd_node::log_writer::dropped(),
        flood_s,
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let r = &report;
        println!("plugd bench --flood: calm_echo round trips (sequential)");
        println!(
            "quiet:    p50 {:.3} ms, p99 {:.3} ms ({} calls)",
            r.quiet.p50_ms, r.quiet.p99_ms, r.quiet.samples
        );
        println!(
            "flooded:  p50 {:.3} ms, p99 {:.3} ms ({} calls during {:.1} s of flood)",
            r.flooded.p50_ms, r.flooded.p99_ms, r.flooded.samples, r.flood_s
        );
        println!(
            "flood:    {} stderr lines, {} publishes ({} counted as dropped); log lines the writer dropped: {}",
            r.stderr_lines, r.publishes, r.dropped_publishes, r.log_lines_dropped
        );
    }
    Ok(())
}
