//! Channels (nexo §5.x): the example webhook channel end to end under a real
//! `plugd serve` (inbound POST → `before_message` → scripted agent turn →
//! outbound POST), every typed error of `channel.send_outbound` through
//! `Runtime::channel`, the send deadline, and microapp `nexo/dispatch`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugd_host::extensions::{ChannelError, OutboundMessage};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

/// A loopback HTTP receiver: records each POSTed JSON body; answers 200, or
/// `429` with `Retry-After: 17` while `busy` is set.
pub(crate) struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Value>>>,
    busy: Arc<Mutex<bool>>,
}

impl Receiver {
    pub(crate) fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let busy = Arc::new(Mutex::new(false));
        let (g, b) = (got.clone(), busy.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut r = BufReader::new(conn);
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                let busy = *b.lock().unwrap();
                if !busy && let Ok(v) = serde_json::from_slice(&body) {
                    g.lock().unwrap().push(v);
                }
                let head = if busy {
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 17\r\n"
                } else {
                    "HTTP/1.1 200 OK\r\n"
                };
                let mut s = r.into_inner();
                let _ = s.write_all(
                    format!("{head}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes(),
                );
            }
        });
        Receiver { addr, got, busy }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/outbound", self.addr)
    }

    pub(crate) fn got(&self) -> Vec<Value> {
        self.got.lock().unwrap().clone()
    }
}

/// POSTs `body` to `port` on loopback; the status (0 when nothing listens).
pub(crate) fn post(port: u16, body: &Value) -> u16 {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let body = body.to_string();
    let req = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return 0;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// `log` without ANSI colour sequences.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A port the webhook channel can bind a moment later. Taken below Linux's
/// ephemeral range (32768-60999), where every `127.0.0.1:0` bind of the
/// tests running beside this one (serve, registries, receivers) draws its
/// port: a port from that range could be taken by one of them in between
/// (seen once: the channel's port answered serve's 401).
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 4_000) as u16 * 2;
    for _ in 0..8_000 {
        let port = 20_000 + (start - 20_000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 31999 on 127.0.0.1");
}

fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "plugd failed: {}{}",
        stdout(o),
        stderr(o)
    );
}

/// A workspace with the example webhook channel (port and outbound URL set
/// through `plugd plugin config`), approved.
pub(crate) fn webhook_ws(outbound: &str) -> (Ws, u16) {
    let (ws, port) = webhook_ws_unapproved(outbound);
    ok(&ws.plugd(&["plugin", "approve", "webhook_channel"]));
    (ws, port)
}

/// [`webhook_ws`] without the approval.
fn webhook_ws_unapproved(outbound: &str) -> (Ws, u16) {
    let ws = Ws::new();
    ws.example("webhook-channel");
    let port = free_port();
    ok(&ws.plugd(&[
        "plugin",
        "config",
        "webhook_channel",
        "set",
        "port",
        &port.to_string(),
    ]));
    ok(&ws.plugd(&[
        "plugin",
        "config",
        "webhook_channel",
        "set",
        "outbound_url",
        outbound,
    ]));
    (ws, port)
}

/// A native plugin `id` running errchan.py for channel `kind`.
fn errchan(ws: &Ws, id: &str, kind: &str) {
    let dir = ws.plugin_dir(id);
    let log = ws.dir().join(format!("{id}-calls.jsonl"));
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&log, "").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/channels/errchan.py"),
        dir.join("errchan.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"errchan.py\"]\nenv = {{ CALLS_LOG = {log:?} }}\n\n[plugin.extends]\nchannels = [\"{kind}\"]\n"
        ),
    )
    .unwrap();
}

async fn err_of(rt: &Runtime, kind: &str, to: &str) -> ChannelError {
    rt.channel(kind)
        .unwrap()
        .send_outbound(OutboundMessage::text(to, "hi"))
        .await
        .unwrap_err()
}

#[test]
fn inbound_webhook_posts_become_turns_and_replies_go_out_per_sender() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    // A native before_message guard that blocks bodies containing "forbidden"
    // and logs every event it sees.
    let guard = ws.plugin_dir("guard");
    std::fs::create_dir_all(&guard).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/hooks/hook_plugin.py"),
        guard.join("hook_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        guard.join("nexo-plugin.toml"),
        "[plugin]\nid = \"guard\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"hook_plugin.py\"]\n\n[plugin.extends]\nhooks = [\"before_message\"]\n",
    )
    .unwrap();
    let hook_log = ws.dir().join("hook.jsonl");
    // The containment baseline: a plugin cannot create new files in the
    // workspace root, only use those that exist when it starts.
    std::fs::write(&hook_log, "").unwrap();
    std::fs::write(
        guard.join("hooks.json"),
        json!({"log": hook_log, "before_message": {"block_contains": "forbidden", "field": "body", "reason": "that word is not allowed here"}}).to_string(),
    )
    .unwrap();
    ok(&ws.plugd(&["plugin", "approve", "guard"]));
    // Each session walks the script from its start: step 0 answers a first
    // message, step 1 a second one (and checks it is the one expected).
    std::fs::write(
        ws.dir().join("script.yaml"),
        "steps:\n  - text: hello from the agent\n  - expect_user_contains: again\n    text: second answer\n  - expect_user_contains: three\n    text: third answer\n  - expect_user_contains: four\n    text: fourth answer\n",
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: scripted, script: \"${{workspace_dir}}/script.yaml\"}\nplugins:\n  custom:\n    - {name: guard, plugin: guard, hook: before_message, priority: 1, blocking: true}\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    // channel.start runs in the background: wait for the port.
    let first = json!({"from": "ana", "text": "hi there"});
    let mut status = 0;
    for _ in 0..300 {
        status = post(port, &first);
        if status != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 202, "the webhook channel never listened on {port}");
    let wait_for = |n: usize| {
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while rx.got().len() < n && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        rx.got()
    };
    let got = wait_for(1);
    assert_eq!(got, [json!({"to": "ana", "body": "hello from the agent"})]);

    // A blocked message: the sender gets the block message; the LLM never
    // sees it (the next message of the session is still step 1).
    assert_eq!(
        post(port, &json!({"from": "ana", "text": "a forbidden word"})),
        202
    );
    let got = wait_for(2);
    assert_eq!(got[1]["to"], "ana");
    assert_eq!(got[1]["body"], "that word is not allowed here");
    assert_eq!(post(port, &json!({"from": "ana", "text": "again"})), 202);
    let got = wait_for(3);
    assert_eq!(got[2], json!({"to": "ana", "body": "second answer"}));

    // Another sender has a session of their own (step 0 again).
    assert_eq!(post(port, &json!({"from": "bo", "text": "hey"})), 202);
    let got = wait_for(4);
    assert_eq!(got[3], json!({"to": "bo", "body": "hello from the agent"}));

    // Messages of one session run in order, one turn at a time: two posted
    // back to back get steps 2 and 3 (concurrent turns would both see two
    // assistant messages and both answer step 2).
    assert_eq!(post(port, &json!({"from": "ana", "text": "three"})), 202);
    assert_eq!(post(port, &json!({"from": "ana", "text": "four"})), 202);
    let got = wait_for(6);
    assert_eq!(
        got[4..],
        [
            json!({"to": "ana", "body": "third answer"}),
            json!({"to": "ana", "body": "fourth answer"})
        ]
    );

    let ana = serve.get("/v1/sessions/channel-webhook-ana").json();
    let texts: Vec<&str> = ana["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts,
        [
            "hi there",
            "hello from the agent",
            "again",
            "second answer",
            "three",
            "third answer",
            "four",
            "fourth answer"
        ],
        "{ana}"
    );
    let bo = serve.get("/v1/sessions/channel-webhook-bo").json();
    assert_eq!(bo["transcript"].as_array().unwrap().len(), 2, "{bo}");
    assert_eq!(bo["transcript"][0]["content"], "hey");

    // The guard saw the message as a before_message payload.
    let seen: Vec<Value> = std::fs::read_to_string(&hook_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen[0]["hook_name"], "before_message");
    assert_eq!(seen[0]["event"]["body"], "hi there");
    assert_eq!(seen[0]["event"]["from"], "ana");
    assert_eq!(seen[0]["event"]["channel"], "webhook");

    // Malformed inbound bodies are refused by the plugin; a malformed event
    // on the bus is dropped, logged and counted; serve lives on.
    assert_eq!(post(port, &json!({"text": "no sender"})), 400);
    ok(&ws.plugd(&[
        "bus",
        "publish",
        "plugin.inbound.webhook",
        "--payload",
        r#"{"text": "no sender"}"#,
    ]));
    log_has(&ws, "inbound event dropped");
    // The counters, per kind, in GET /metrics.
    let metrics = serve.get("/metrics").text();
    for line in [
        "plugd_channel_inbound_total{kind=\"webhook\"} 7",
        "plugd_channel_replies_total{kind=\"webhook\"} 6",
        "plugd_channel_blocked_total{kind=\"webhook\"} 1",
        "plugd_channel_unhandled_total{kind=\"webhook\"} 0",
        "plugd_channel_failed_total{kind=\"webhook\"} 1",
        "plugd_channel_shed_total{kind=\"webhook\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let (status, log) = serve.stop();
    let log = plain(&log);
    assert!(status.success(), "{log}");
    assert!(log.contains("channel started"), "{log}");
    assert!(log.contains("channel stopped"), "{log}");
    assert!(
        log.contains(
            "inbound event dropped: payload needs a non-empty string \"from\" (the sender)"
        ),
        "{log}"
    );
    assert!(
        log.contains("channel counters kind=webhook received=7 replied=6 blocked=1 unhandled=0 failed=1 shed=0"),
        "{log}"
    );
}

#[test]
fn do_not_reply_again_from_a_before_message_hook_suppresses_the_automatic_reply() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    let quiet = ws.plugin_dir("quiet");
    std::fs::create_dir_all(&quiet).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/hooks/hook_plugin.py"),
        quiet.join("hook_plugin.py"),
    )
    .unwrap();
    std::fs::write(
        quiet.join("nexo-plugin.toml"),
        "[plugin]\nid = \"quiet\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"hook_plugin.py\"]\n\n[plugin.extends]\nhooks = [\"before_message\"]\n",
    )
    .unwrap();
    std::fs::write(
        quiet.join("hooks.json"),
        json!({"before_message": {"quiet_contains": "[human took over]", "field": "body"}})
            .to_string(),
    )
    .unwrap();
    ok(&ws.plugd(&["plugin", "approve", "quiet"]));
    std::fs::write(
        ws.dir().join("script.yaml"),
        "steps:\n  - text: hello from the agent\n",
    )
    .unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: scripted, script: \"${{workspace_dir}}/script.yaml\"}\nplugins:\n  custom:\n    - {name: quiet, plugin: quiet, hook: before_message, priority: 1}\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let hushed = json!({"from": "ana", "text": "[human took over] I will answer"});
    let mut status = 0;
    for _ in 0..300 {
        status = post(port, &hushed);
        if status != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 202, "the webhook channel never listened on {port}");
    // Another conversation still gets its reply; by then ana's message has
    // long been through the hook.
    assert_eq!(post(port, &json!({"from": "bo", "text": "hi"})), 202);
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while rx.got().is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        rx.got(),
        [json!({"to": "bo", "body": "hello from the agent"})],
        "ana got no automatic reply"
    );
    let (status, log) = serve.stop();
    let log = plain(&log);
    assert!(status.success(), "{log}");
    assert!(
        log.contains("no automatic reply: a before_message hook said do_not_reply_again"),
        "{log}"
    );
}

/// Posts `body` to `port` until something listens there (the channel starts
/// in the background); the final status.
fn post_when_listening(port: u16, body: &Value) -> u16 {
    for _ in 0..300 {
        let status = post(port, body);
        if status != 0 {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    0
}

#[test]
fn a_restarted_channel_plugin_gets_channel_start_again() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    std::fs::write(ws.dir().join("script.yaml"), "steps:\n  - text: pong\n").unwrap();
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "llm: {provider: scripted, script: \"${{workspace_dir}}/script.yaml\"}\n",
    )
    .unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    assert_eq!(
        post_when_listening(port, &json!({"from": "ana", "text": "ping"})),
        202
    );
    let wait_for = |n: usize| {
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while rx.got().len() < n && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        rx.got()
    };
    assert_eq!(wait_for(1), [json!({"to": "ana", "body": "pong"})]);
    // A settings change under serve restarts the plugin: the new process
    // gets channel.start and listens on the new port; the old one is gone.
    let port2 = free_port();
    ok(&ws.plugd(&[
        "plugin",
        "config",
        "webhook_channel",
        "set",
        "port",
        &port2.to_string(),
    ]));
    assert_eq!(
        post_when_listening(port2, &json!({"from": "bo", "text": "ping"})),
        202
    );
    assert_eq!(post(port, &json!({"from": "cy", "text": "ping"})), 0);
    assert_eq!(
        wait_for(2),
        [
            json!({"to": "ana", "body": "pong"}),
            json!({"to": "bo", "body": "pong"})
        ]
    );
    let (_, log) = serve.stop();
    assert_eq!(plain(&log).matches("channel started").count(), 2, "{log}");
}

/// Waits until serve's log holds `needle`; the log without colours.
fn log_has(ws: &Ws, needle: &str) -> String {
    let path = ws.dir().join("serve-127.0.0.1_0.log");
    let end = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let log = plain(&std::fs::read_to_string(&path).unwrap_or_default());
        if log.contains(needle) || std::time::Instant::now() > end {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_failed_channel_start_is_retried_and_serve_keeps_serving() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    // Someone else holds the port: channel.start fails with -33001.
    let squatter = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let needle = format!("connection failed: cannot listen on 127.0.0.1:{port}");
    let log = log_has(&ws, &needle);
    assert!(
        log.contains("channel.start failed") && log.contains(&needle),
        "{log}"
    );
    assert!(log.contains("plugin=webhook_channel"), "{log}");
    // serve answers meanwhile.
    assert_eq!(serve.get("/v1/plugins").status, 200);
    // The port comes free: the retry starts the channel.
    drop(squatter);
    assert_eq!(
        post_when_listening(port, &json!({"from": "ana", "text": "hi"})),
        202
    );
    let (_, log) = serve.stop();
    assert!(plain(&log).contains("channel started"), "{log}");
}

#[test]
fn a_channel_plugin_starts_when_approved_under_serve_and_stops_when_revoked() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws_unapproved(&rx.url());
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let log = log_has(&ws, "channel waits for approval");
    assert!(
        log.contains(
            "channel waits for approval: `plugd plugin approve webhook_channel` starts it"
        ),
        "{log}"
    );
    assert_eq!(post(port, &json!({"from": "ana", "text": "hi"})), 0);
    // Approved through serve: the new process gets channel.start.
    let o = ws.plugd(&["plugin", "approve", "webhook_channel"]);
    ok(&o);
    assert!(stdout(&o).contains("via plugd serve"), "{}", stdout(&o));
    assert_eq!(
        post_when_listening(port, &json!({"from": "ana", "text": "hi"})),
        202
    );
    // Revoked: the plugin is stopped and not started again.
    ok(&ws.plugd(&["plugin", "revoke", "webhook_channel"]));
    let mut status = 202;
    for _ in 0..100 {
        status = post(port, &json!({"from": "ana", "text": "hi"}));
        if status == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 0, "the revoked channel still listens");
    let (_, log) = serve.stop();
    let log = plain(&log);
    assert_eq!(log.matches("channel started").count(), 1, "{log}");
    assert!(!log.contains("channel.start failed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_turn_of_one_sender_does_not_hold_up_another_sender() {
    // The OpenAI-compatible double answers "[slow]" after 5 s, else at once.
    let (base, _seen) = crate::llm::double().await;
    tokio::task::spawn_blocking(move || {
        let rx = Receiver::start();
        let (ws, port) = webhook_ws(&rx.url());
        std::fs::write(
            ws.dir().join("plugd.yaml"),
            format!("llm:\n  provider: openai\n  base_url: \"{base}\"\n  model: test-model\n"),
        )
        .unwrap();
        let serve = Serve::start(&ws, "127.0.0.1:0");
        assert_eq!(
            post_when_listening(port, &json!({"from": "slowpoke", "text": "[slow] one"})),
            202
        );
        assert_eq!(post(port, &json!({"from": "quick", "text": "two"})), 202);
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while rx.got().len() < 2 && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = rx.got();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], json!({"to": "quick", "body": "echo: two"}));
        assert_eq!(got[1]["to"], "slowpoke");
        drop(serve);
    })
    .await
    .unwrap();
}

/// The value of `metric` for kind webhook in `GET /metrics`.
fn metric(serve: &Serve, metric: &str) -> u64 {
    let text = serve.get("/metrics").text();
    let prefix = format!("{metric}{{kind=\"webhook\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_sender_is_shed_beyond_its_session_queue_and_every_message_is_counted() {
    let (base, _seen) = crate::llm::double().await;
    tokio::task::spawn_blocking(move || {
        let rx = Receiver::start();
        let (ws, port) = webhook_ws(&rx.url());
        std::fs::write(
            ws.dir().join("plugd.yaml"),
            format!("llm:\n  provider: openai\n  base_url: \"{base}\"\n  model: test-model\n"),
        )
        .unwrap();
        let serve = Serve::start(&ws, "127.0.0.1:0");
        // The first turn takes 5 s; 99 more messages of the same session
        // arrive meanwhile: 64 wait, the rest are shed.
        assert_eq!(
            post_when_listening(port, &json!({"from": "flood", "text": "[slow] 0"})),
            202
        );
        for i in 1..100 {
            assert_eq!(
                post(port, &json!({"from": "flood", "text": format!("m{i}")})),
                202
            );
        }
        let end = std::time::Instant::now() + Duration::from_secs(60);
        let (mut replied, mut shed) = (0, 0);
        while std::time::Instant::now() < end {
            replied = metric(&serve, "plugd_channel_replies_total");
            shed = metric(&serve, "plugd_channel_shed_total");
            if replied + shed == 100 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(metric(&serve, "plugd_channel_inbound_total"), 100);
        assert_eq!(replied + shed, 100, "replied {replied}, shed {shed}");
        assert!(shed >= 1 && replied >= 64, "replied {replied}, shed {shed}");
        assert_eq!(rx.got().len() as u64, replied);
        // Replies of one session go out in the order the messages came.
        let got = rx.got();
        assert_eq!(got[0]["body"], "echo: [slow] 0");
        let mut last = 0;
        for v in &got[1..] {
            let n: u64 = v["body"].as_str().unwrap()["echo: m".len()..]
                .parse()
                .unwrap();
            assert!(n > last, "{got:?}");
            last = n;
        }
        let (_, log) = serve.stop();
        assert!(
            plain(&log)
                .contains("inbound message shed: 64 messages of this session are already waiting"),
            "{log}"
        );
    })
    .await
    .unwrap();
}

#[test]
fn without_an_llm_section_inbound_messages_are_logged_as_unhandled() {
    let rx = Receiver::start();
    let (ws, port) = webhook_ws(&rx.url());
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let mut status = 0;
    for _ in 0..300 {
        status = post(port, &json!({"from": "ana", "text": "hi"}));
        if status != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 202);
    std::thread::sleep(Duration::from_millis(300));
    let (_, log) = serve.stop();
    let log = plain(&log);
    assert!(
        log.contains("inbound message unhandled: plugd.yaml has no llm: section"),
        "{log}"
    );
    assert!(log.contains("unhandled=1"), "{log}");
    assert!(rx.got().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_channel_maps_its_failures_to_typed_errors() {
    let rx = Receiver::start();
    let dead = format!("http://127.0.0.1:{}/outbound", free_port());
    let (ws, _) = webhook_ws(&rx.url());
    let rt = ws.runtime(quick(30_000)).await;
    let ch = rt.channel("webhook").unwrap();
    assert_eq!(ch.owner(), "webhook_channel");
    let r = ch
        .send_outbound(OutboundMessage::text("ana", "hello"))
        .await
        .unwrap();
    assert!(!r.message_id.is_empty());
    assert_eq!(rx.got(), [json!({"to": "ana", "body": "hello"})]);

    let e = ch
        .send_outbound(OutboundMessage::text("a b", "x"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ChannelError::Recipient { kind, recipient, .. } if kind == "webhook" && recipient == "a b"),
        "{e:?}"
    );
    *rx.busy.lock().unwrap() = true;
    let e = ch
        .send_outbound(OutboundMessage::text("ana", "x"))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ChannelError::RateLimited {
            kind: "webhook".into(),
            retry_after_secs: Some(17)
        }
    );
    let mut media = OutboundMessage::text("ana", "x");
    media.kind = "media".into();
    media.fields.insert("url".into(), json!("http://x/y.png"));
    let e = ch.send_outbound(media).await.unwrap_err();
    assert_eq!(
        e,
        ChannelError::Unsupported {
            kind: "webhook".into(),
            feature: "media".into()
        }
    );
    rt.shutdown().await;
    // An unreachable outbound URL is a connection failure.
    ok(&ws.plugd(&[
        "plugin",
        "config",
        "webhook_channel",
        "set",
        "outbound_url",
        &dead,
    ]));
    let o = ws.plugd(&["channel", "send", "webhook", "--to", "ana", "--body", "x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "plugin \"webhook_channel\": channel \"webhook\": connection failed: cannot reach"
        ),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_typed_channel_error_is_mapped() {
    let ws = Ws::new();
    errchan(&ws, "errchan", "fake");
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("errchan", "test").await.unwrap();
    let kind = || "fake".to_owned();
    assert_eq!(
        err_of(&rt, "fake", "conn").await,
        ChannelError::Connection {
            kind: kind(),
            message: "connection refused by the upstream".into()
        }
    );
    assert_eq!(
        err_of(&rt, "fake", "auth").await,
        ChannelError::Authentication {
            kind: kind(),
            reason: "token rejected".into()
        }
    );
    assert_eq!(
        err_of(&rt, "fake", "bad").await,
        ChannelError::Recipient {
            kind: kind(),
            recipient: "bad".into(),
            reason: "unknown user".into()
        }
    );
    assert_eq!(
        err_of(&rt, "fake", "busy").await,
        ChannelError::RateLimited {
            kind: kind(),
            retry_after_secs: Some(9)
        }
    );
    assert_eq!(
        err_of(&rt, "fake", "media").await,
        ChannelError::Unsupported {
            kind: kind(),
            feature: "media".into()
        }
    );
    assert_eq!(
        err_of(&rt, "fake", "nomethod").await,
        ChannelError::Unsupported {
            kind: kind(),
            feature: "channel.send_outbound".into()
        }
    );
    let e = err_of(&rt, "fake", "junk").await;
    assert!(
        matches!(&e, ChannelError::Other { message, .. } if message.contains("not {message_id, sent_at_unix}")),
        "{e:?}"
    );
    // channel.stop is not implemented by errchan: unsupported, named.
    let e = rt.channel("fake").unwrap().stop().await.unwrap_err();
    assert_eq!(
        e,
        ChannelError::Unsupported {
            kind: kind(),
            feature: "channel.stop".into()
        }
    );
    let ok = rt
        .channel("fake")
        .unwrap()
        .send_outbound(OutboundMessage::text("ana", "hi"))
        .await
        .unwrap();
    assert_eq!(ok.message_id, "m-ana");
    assert_eq!(ok.sent_at_unix, Some(1741032000));
    // What the plugin received: {kind, msg: {kind: text, to, body}}.
    let calls = std::fs::read_to_string(ws.dir().join("errchan-calls.jsonl")).unwrap();
    let mut last: Value = serde_json::from_str(calls.lines().last().unwrap()).unwrap();
    assert!(last["pid"].is_u64(), "{last}");
    last.as_object_mut().unwrap().remove("pid");
    assert_eq!(
        last,
        json!({"method": "channel.send_outbound", "params": {"kind": "fake", "msg": {"kind": "text", "to": "ana", "body": "hi"}}})
    );
    // An unknown kind names the ones there are.
    let e = rt.channel("slack").err().unwrap();
    assert!(matches!(e, RuntimeError::UnknownChannel { .. }));
    assert_eq!(
        e.to_string(),
        "no channel \"slack\"; the channels here are fake"
    );
    rt.shutdown().await;
}

#[test]
fn send_outbound_times_out_at_the_env_deadline() {
    let ws = Ws::new();
    errchan(&ws, "errchan", "fake");
    ok(&ws.plugd(&["plugin", "approve", "errchan"]));
    let t = std::time::Instant::now();
    let o = crate::support::plugd_cmd(ws.dir())
        .env("NEXO_PLUGIN_CHANNEL_TIMEOUT_MS", "400")
        .args(["channel", "send", "fake", "--to", "hang", "--body", "x"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did not answer channel.send_outbound within 400ms"),
        "{}",
        stderr(&o)
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let o = crate::support::plugd_cmd(ws.dir())
        .env("NEXO_PLUGIN_CHANNEL_TIMEOUT_MS", "soon")
        .args(["channel", "send", "fake", "--to", "ana", "--body", "x"])
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains("NEXO_PLUGIN_CHANNEL_TIMEOUT_MS=\"soon\" is not a positive integer"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microapp_dispatch_goes_out_through_the_channel_when_granted() {
    let rx = Receiver::start();
    let (ws, _) = webhook_ws(&rx.url());
    let mut yaml = String::from("entries:\n");
    for (id, rest) in [
        ("granted", ", capabilities: [dispatch_outbound]"),
        ("bare", ""),
    ] {
        let dir = ws.dir().join("extensions").join(id);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            repo().join("tests/plugins/microapp/app.py"),
            dir.join("app.py"),
        )
        .unwrap();
        yaml.push_str(&format!("  {id}: {{path: extensions/{id}/app.py{rest}}}\n"));
    }
    std::fs::write(ws.dir().join("extensions.yaml"), yaml).unwrap();
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("granted", "test").await.unwrap();
    rt.approve("bare", "test").await.unwrap();
    let requests = json!({"requests": [
        {"method": "nexo/dispatch", "params": {"to": "ana", "channel": "webhook", "body": "from the app"}},
        {"method": "nexo/dispatch", "params": {"to": "a b", "channel": "webhook", "body": "x"}},
        {"method": "nexo/dispatch", "params": {"to": "ana", "channel": "sms", "body": "x"}},
        {"method": "nexo/dispatch", "params": {"to": "ana", "channel": "webhook"}},
    ]});
    let replies = rt
        .call_tool("granted_outbound", requests.clone(), None)
        .await
        .unwrap();
    assert!(
        replies[0]["result"]["message_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{replies}"
    );
    assert!(
        replies[0]["result"]["sent_at_unix"].as_i64().unwrap() > 1_700_000_000,
        "{replies}"
    );
    assert_eq!(rx.got(), [json!({"to": "ana", "body": "from the app"})]);
    assert_eq!(replies[1]["error"]["code"], -33003, "{replies}");
    assert_eq!(replies[1]["error"]["data"]["recipient"], "a b");
    assert_eq!(replies[2]["error"]["code"], -32603);
    assert!(
        replies[2]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no channel \"sms\" is available in this plugd (channels here: webhook)"),
        "{replies}"
    );
    assert_eq!(replies[3]["error"]["code"], -32602, "{replies}");

    // Without dispatch_outbound nothing goes out.
    let replies = rt.call_tool("bare_outbound", requests, None).await.unwrap();
    assert_eq!(replies[0]["error"]["code"], -32000, "{replies}");
    assert!(
        !eventually(Duration::from_millis(300), || rx.got().len() > 1).await,
        "{:?}",
        rx.got()
    );
    rt.shutdown().await;
}

/// The `channel.start` requests errchan's processes logged in `ws` for
/// plugin `id`, as the pids that got them.
fn channel_starts(ws: &Ws, id: &str) -> Vec<u64> {
    std::fs::read_to_string(ws.dir().join(format!("{id}-calls.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["method"] == "channel.start")
        .filter_map(|v| v["pid"].as_u64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_nodes_runs_a_channel_and_the_other_takes_over_when_it_stops() {
    use plugd_agent::channels::{CHANNEL_LEASE_EVERY, ChannelService};
    use plugd_runtime::hooks::Pipeline;
    // Two runtimes on one state store (two nodes of one cluster in the
    // PostgreSQL pass), each with its own process of the channel plugin.
    let ws = Ws::new();
    errchan(&ws, "solo", "solo");
    ok(&ws.plugd(&["plugin", "approve", "solo"]));
    let node_a = ws.runtime(quick(10_000)).await;
    let node_b = ws.runtime(quick(10_000)).await;
    let pipeline = Arc::new(Pipeline::default());
    let a = ChannelService::start(&node_a, None, pipeline.clone()).await;
    assert!(
        eventually(Duration::from_secs(20), || channel_starts(&ws, "solo")
            .len()
            == 1)
        .await,
        "A never started the channel"
    );
    let b = ChannelService::start(&node_b, None, pipeline).await;
    // B tries for the lease twice and more meanwhile: A holds it.
    tokio::time::sleep(CHANNEL_LEASE_EVERY * 2 + Duration::from_millis(500)).await;
    let starts = channel_starts(&ws, "solo");
    assert_eq!(
        starts.len(),
        1,
        "both nodes started the channel: {starts:?}"
    );
    // A stops (and gives the lease up): B takes the channel over at its next try.
    a.shutdown().await;
    assert!(
        eventually(CHANNEL_LEASE_EVERY + Duration::from_secs(5), || {
            channel_starts(&ws, "solo").len() == 2
        })
        .await,
        "B did not take the channel over: {:?}",
        channel_starts(&ws, "solo")
    );
    let starts = channel_starts(&ws, "solo");
    assert_ne!(
        starts[0], starts[1],
        "the same process started twice: {starts:?}"
    );
    b.shutdown().await;
    node_a.shutdown().await;
    node_b.shutdown().await;
}
