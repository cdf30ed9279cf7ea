//! Host services of the nexo contract with a real plugin written with the
//! PyPI `nexoai` SDK: broker.publish and broker.event through the bus,
//! memory.recall from the state store, llm.complete (plain and streamed)
//! through an OpenAI-compatible provider (the local HTTP double of `llm.rs`,
//! the only stand-in: no model is reachable here).

use std::time::{Duration, Instant};

use plugd_host::bus::Event;
use plugd_runtime::Runtime;
use serde_json::{Value, json};

use crate::support::{Ws, eventually, quick, repo};

/// A nexoai plugin `id` using every service; `requires` are its
/// `nexo_capabilities`; the workspace's LLM is the double at `llm_base`.
pub(crate) fn services_plugin(ws: &Ws, id: &str, requires: &[&str], llm_base: Option<&str>) {
    services_plugin_in(&ws.plugin_dir(id), id, requires);
    if let Some(base) = llm_base {
        std::fs::write(
            ws.dir().join("plugd.yaml"),
            format!("llm:\n  provider: openai\n  base_url: \"{base}\"\n  model: test-model\n"),
        )
        .unwrap();
    }
}

/// The plugin of [`services_plugin`] written into directory `dir`.
pub(crate) fn services_plugin_in(dir: &std::path::Path, id: &str, requires: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/broker/nexoai_services.py"),
        dir.join("main.py"),
    )
    .unwrap();
    let python = repo().join(".venv/bin/python3");
    let tools: Vec<String> = ["recall", "complete", "stream", "publish", "flood", "ping"]
        .iter()
        .map(|t| format!("\"{id}_{t}\""))
        .collect();
    let caps: Vec<String> = requires.iter().map(|c| format!("\"{c}\"")).collect();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n\
             [plugin.requires]\nnexo_capabilities = [{}]\n\n\
             [plugin.entrypoint]\ncommand = \"{}\"\nargs = [\"main.py\"]\n\n\
             [[plugin.channels.register]]\nkind = \"loop\"\n\n\
             [plugin.extends]\ntools = [{}]\n",
            caps.join(", "),
            python.display(),
            tools.join(", ")
        ),
    )
    .unwrap();
}

fn text(v: &Value) -> String {
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_owned()
}

/// The next event of `sub`, within 10 s.
async fn next(sub: &mut plugd_host::bus::Subscription) -> Event {
    tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .expect("no event within 10 s")
        .expect("the bus is gone")
}

async fn call(rt: &Runtime, tool: &str, args: Value) -> Result<String, String> {
    rt.call_tool(tool, args, None)
        .await
        .map(|v| text(&v))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_is_completed_checked_against_the_allowlist_and_counted() {
    let ws = Ws::new();
    services_plugin(&ws, "svc", &["broker"], None);
    let rt = ws.runtime(quick(30_000)).await;
    let mut inbound = rt.bus().subscribe("plugin.inbound.>", 64).unwrap();
    let mut core = rt.bus().subscribe("agent.>", 64).unwrap();
    rt.approve("svc", "test").await.unwrap();

    call(
        &rt,
        "svc_publish",
        json!({"topic": "plugin.inbound.loop.team_a", "text": "hi"}),
    )
    .await
    .unwrap();
    let event = next(&mut inbound).await;
    assert_eq!(event.topic, "plugin.inbound.loop.team_a");
    assert_eq!(event.source, "loop");
    assert_eq!(event.payload, json!({"text": "hi"}));
    // The SDK sends neither id nor timestamp: the host completes them.
    assert!(crate::nexo::is_uuid(&event.id), "{event:?}");
    assert!(event.timestamp.ends_with('Z'), "{event:?}");

    // A source naming someone else is replaced by the plugin's id.
    call(
        &rt,
        "svc_publish",
        json!({"topic": "plugin.inbound.loop", "source": "agent.coordinator"}),
    )
    .await
    .unwrap();
    let event = next(&mut inbound).await;
    assert_eq!(event.source, "svc");

    // Core subjects and other channels' subjects never reach the bus.
    for topic in [
        "agent.route.x",
        "command.shutdown",
        "plugin.inbound.slack",
        "plugin.outbound.loop",
    ] {
        call(&rt, "svc_publish", json!({"topic": topic}))
            .await
            .unwrap();
    }
    call(&rt, "svc_ping", json!({})).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || rt
            .broker_stats("svc")
            .is_some_and(|s| s.dropped == 4))
        .await,
        "{:?}",
        rt.broker_stats("svc")
    );
    assert!(core.try_recv().is_none());
    assert!(inbound.try_recv().is_none());
    let stats = rt.broker_stats("svc").unwrap();
    assert_eq!(stats.published, 2);
    assert_eq!(rt.plugin("svc").await.unwrap().broker.unwrap().dropped, 4);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_a_forbidden_subject_is_dropped_and_counted_exactly() {
    let ws = Ws::new();
    services_plugin(&ws, "flooder", &["broker"], None);
    let rt = ws.runtime(quick(60_000)).await;
    let mut all = rt.bus().subscribe(">", 64).unwrap();
    rt.approve("flooder", "test").await.unwrap();
    call(
        &rt,
        "flooder_flood",
        json!({"topic": "agent.route.hijack", "n": 2000}),
    )
    .await
    .unwrap();
    call(&rt, "flooder_ping", json!({})).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || rt
            .broker_stats("flooder")
            .is_some_and(|s| s.dropped == 2000))
        .await,
        "{:?}",
        rt.broker_stats("flooder")
    );
    assert!(all.try_recv().is_none(), "nothing reached the bus");
    assert_eq!(rt.broker_stats("flooder").unwrap().published, 0);
    // The plugin still answers.
    assert_eq!(call(&rt, "flooder_ping", json!({})).await.unwrap(), "pong");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_events_are_delivered_and_the_plugin_answers_inbound() {
    let ws = Ws::new();
    services_plugin(&ws, "chan", &["broker"], None);
    let rt = ws.runtime(quick(30_000)).await;
    let mut inbound = rt.bus().subscribe("plugin.inbound.loop", 64).unwrap();
    rt.approve("chan", "test").await.unwrap();

    let mut out = Event::new(
        "plugin.outbound.loop.team_a",
        "agent.coordinator",
        json!({"text": "hello"}),
    );
    out.session_id = Some("s1".into());
    let published = rt.bus().publish(out);
    assert_eq!(published.delivered, 1);
    let echo = next(&mut inbound).await;
    assert_eq!(
        echo.payload,
        json!({"echo": "hello", "topic": "plugin.outbound.loop.team_a"})
    );
    // Topics outside the plugin's outbound allowlist are not delivered.
    assert_eq!(
        rt.bus()
            .publish(Event::new("plugin.outbound.slack", "x", json!({})))
            .delivered,
        0
    );
    assert_eq!(rt.broker_stats("chan").unwrap().delivered, 1);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_sheds_broker_events_and_counts_each_one() {
    let ws = Ws::new();
    services_plugin(&ws, "slow", &["broker"], None);
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("slow", "test").await.unwrap();
    // 5000 events at once cannot all fit the 64-frame queue of a Python
    // child; every one is either delivered or shed, none blocks.
    let t = Instant::now();
    let (mut delivered, mut shed) = (0, 0);
    for i in 0..5000 {
        let p = rt.bus().publish(Event::new(
            "plugin.outbound.loop",
            "t",
            json!({"text": i.to_string()}),
        ));
        delivered += p.delivered;
        shed += p.shed;
    }
    let took = t.elapsed();
    assert_eq!(delivered + shed, 5000);
    assert!(shed > 0, "some events must be shed");
    let stats = rt.broker_stats("slow").unwrap();
    assert_eq!(stats.shed as usize, shed);
    assert_eq!(stats.delivered as usize, delivered);
    assert_eq!(
        rt.plugin("slow")
            .await
            .unwrap()
            .stats
            .unwrap()
            .shed_notifications as usize,
        shed
    );
    assert!(
        took < Duration::from_secs(30),
        "publishing never waits: {took:?}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_recall_reads_the_agents_memory_from_inside_a_tool() {
    let ws = Ws::new();
    services_plugin(&ws, "mem", &["memory"], None);
    let rt = ws.runtime(quick(30_000)).await;
    let store = rt.state().clone();
    store
        .memory_add(
            "ventas_v1",
            "user prefers concise answers",
            &["preference".into()],
        )
        .await
        .unwrap();
    store
        .memory_add("ventas_v1", "the deploy is on Friday", &[])
        .await
        .unwrap();
    store
        .memory_add("other", "concise is good", &[])
        .await
        .unwrap();
    rt.approve("mem", "test").await.unwrap();
    let got = call(
        &rt,
        "mem_recall",
        json!({"agent": "ventas_v1", "query": "concise answers"}),
    )
    .await
    .unwrap();
    assert_eq!(got, r#"["user prefers concise answers"]"#);
    // Bad params are -32602 (the SDK surfaces the host's error).
    let err = call(&rt, "mem_recall", json!({"agent": "", "query": "x"}))
        .await
        .unwrap_err();
    assert!(err.contains("agent_id must be a non-empty string"), "{err}");
    let err = call(
        &rt,
        "mem_recall",
        json!({"agent": "a", "query": "x", "limit": -3}),
    )
    .await
    .unwrap_err();
    assert!(err.contains("limit must be a positive integer"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_services_are_served_without_any_requires() {
    // `nexo_capabilities` says what a plugin needs, not what it may do: a
    // plugin requiring nothing still gets every host service (issue 11).
    let ws = Ws::new();
    services_plugin(&ws, "bare", &[], None);
    let rt = ws.runtime(quick(30_000)).await;
    let mut inbound = rt.bus().subscribe("plugin.inbound.loop", 64).unwrap();
    rt.state()
        .memory_add("a", "x marks the spot", &[])
        .await
        .unwrap();
    rt.approve("bare", "test").await.unwrap();
    let got = call(&rt, "bare_recall", json!({"agent": "a", "query": "spot"}))
        .await
        .unwrap();
    assert_eq!(got, r#"["x marks the spot"]"#);
    // No llm: section: the contract's "not configured", never "not granted".
    let err = call(&rt, "bare_complete", json!({"prompt": "hi"}))
        .await
        .unwrap_err();
    assert!(err.contains("llm not configured"), "{err}");
    assert!(!err.contains("not granted"), "{err}");
    call(&rt, "bare_publish", json!({"topic": "plugin.inbound.loop"}))
        .await
        .unwrap();
    assert_eq!(next(&mut inbound).await.topic, "plugin.inbound.loop");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_complete_plain_and_streamed_through_the_configured_provider() {
    let (base, _seen) = crate::llm::double().await;
    let ws = Ws::new();
    services_plugin(&ws, "brain", &["llm"], Some(&base));
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("brain", "test").await.unwrap();

    let plain: Value = serde_json::from_str(
        &call(&rt, "brain_complete", json!({"prompt": "say hi"}))
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        plain,
        json!({"content": "echo: say hi", "finish": "stop", "usage": [5, 4]})
    );

    let streamed: Value = serde_json::from_str(
        &call(&rt, "brain_stream", json!({"prompt": "one two three"}))
            .await
            .unwrap(),
    )
    .unwrap();
    // Chunks arrive in order before the final reply, which omits content.
    assert_eq!(
        streamed["chunks"].as_array().unwrap().concat_strings(),
        "echo: one two three"
    );
    assert!(streamed["chunks"].as_array().unwrap().len() > 1);
    assert_eq!(streamed["content"], Value::Null);
    assert_eq!(streamed["finish"], "stop");

    // Tool calls from the provider are -32601; an unknown provider -32603.
    let err = call(&rt, "brain_complete", json!({"prompt": "[tool:lookup]"}))
        .await
        .unwrap_err();
    assert!(err.contains("tool calls instead of text"), "{err}");
    let err = call(
        &rt,
        "brain_complete",
        json!({"prompt": "x", "provider": "minimax"}),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("provider \"minimax\" is not registered"),
        "{err}"
    );
    let err = call(&rt, "brain_complete", json!({"prompt": "[status:401]"}))
        .await
        .unwrap_err();
    assert!(err.contains("authentication failed"), "{err}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_llm_complete_never_delays_a_concurrent_tool_reply() {
    let (base, _seen) = crate::llm::double().await;
    let ws = Ws::new();
    services_plugin(&ws, "busy", &["llm"], Some(&base));
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("busy", "test").await.unwrap();
    let slow = {
        let rt = rt.clone();
        tokio::spawn(async move { call(&rt, "busy_complete", json!({"prompt": "[slow] x"})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The double holds the slow answer for 5 s; the ping must come back
    // while the completion is still outstanding.
    assert_eq!(call(&rt, "busy_ping", json!({})).await.unwrap(), "pong");
    assert!(!slow.is_finished(), "the slow completion is still running");
    let done = slow.await.unwrap().unwrap();
    assert!(done.contains("echo: [slow] x"), "{done}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_complete_without_an_llm_section_is_not_configured() {
    let ws = Ws::new();
    services_plugin(&ws, "nollm", &["llm"], None);
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("nollm", "test").await.unwrap();
    let err = call(&rt, "nollm_complete", json!({"prompt": "x"}))
        .await
        .unwrap_err();
    assert!(err.contains("llm not configured"), "{err}");
    rt.shutdown().await;
}

trait ConcatStrings {
    fn concat_strings(&self) -> String;
}

impl ConcatStrings for Vec<Value> {
    fn concat_strings(&self) -> String {
        self.iter().filter_map(Value::as_str).collect()
    }
}

#[test]
fn bus_cli_publishes_into_serve_and_tails_what_plugins_answer() {
    use std::io::Read;
    use std::process::Stdio;

    use crate::http::Serve;
    use crate::support::{plugd_cmd, stderr, stdout};

    let ws = Ws::new();
    services_plugin(&ws, "chan", &["broker"], None);
    let manifest = ws.plugin_dir("chan").join("nexo-plugin.toml");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("\n[plugin.supervisor]\nstart = \"eager\"\n");
    std::fs::write(&manifest, text).unwrap();

    // Without a serve, the bus commands say what to do.
    let out = ws.plugd(&["bus", "tail", "plugin.>"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no plugd serve is running"),
        "{}",
        stderr(&out)
    );

    let out = ws.plugd(&["plugin", "approve", "chan"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let serve = Serve::start(&ws, "127.0.0.1:0");

    let mut tail = plugd_cmd(ws.dir())
        .args(["bus", "tail", "plugin.inbound.>", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The tail subscribes asynchronously: publish until it has seen one echo.
    let end = Instant::now() + Duration::from_secs(20);
    let mut published = None;
    while Instant::now() < end && tail.try_wait().unwrap().is_none() {
        let out = ws.plugd(&[
            "bus",
            "publish",
            "plugin.outbound.loop",
            "--payload",
            r#"{"text": "ping"}"#,
            "--session",
            "s1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        published = Some(serde_json::from_str::<Value>(&stdout(&out)).unwrap());
        std::thread::sleep(Duration::from_millis(300));
    }
    let status = tail.wait().unwrap();
    let mut lines = String::new();
    tail.stdout
        .take()
        .unwrap()
        .read_to_string(&mut lines)
        .unwrap();
    assert!(status.success(), "tail failed: {lines}");
    let published = published.unwrap();
    assert_eq!(published["event"]["topic"], "plugin.outbound.loop");
    assert_eq!(published["event"]["source"], "operator");
    assert_eq!(published["event"]["session_id"], "s1");
    assert!(crate::nexo::is_uuid(
        published["event"]["id"].as_str().unwrap()
    ));
    assert_eq!(published["delivered"], 1, "{published}");
    let echo: Value = serde_json::from_str(lines.trim()).unwrap();
    assert_eq!(echo["topic"], "plugin.inbound.loop");
    assert_eq!(echo["source"], "loop");
    assert_eq!(echo["payload"]["echo"], "ping");

    // `plugin show` reads the live counters from serve.
    let show = ws.plugd(&["plugin", "show", "chan"]);
    let text = stdout(&show);
    assert!(text.contains("(in plugd serve pid "), "{text}");
    let delivered: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("broker:    "))
        .and_then(|l| l.split("delivered=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or_else(|| panic!("no broker line in {text}"))
        .parse()
        .unwrap();
    assert!(delivered >= 1, "{text}");

    // The counters are in serve's metrics.
    let metrics = serve.get("/metrics");
    assert_eq!(metrics.status, 200);
    let metrics = metrics.text();
    let value = |name: &str| -> u64 {
        let prefix = format!("{name}{{plugin=\"chan\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    };
    assert!(value("plugd_broker_delivered_total") >= 1, "{metrics}");
    assert!(value("plugd_broker_published_total") >= 1, "{metrics}");
    assert_eq!(value("plugd_broker_dropped_total"), 0, "{metrics}");
    assert!(metrics.contains("# TYPE plugd_broker_shed_total counter"));

    // Bad subjects and payloads are refused with the reason.
    let out = ws.plugd(&["bus", "publish", "plugin.*.x"]);
    assert!(
        stderr(&out).contains("contains a wildcard"),
        "{}",
        stderr(&out)
    );
    let out = ws.plugd(&["bus", "publish", "a..b"]);
    assert!(stderr(&out).contains("empty segment"), "{}", stderr(&out));
    let out = ws.plugd(&["bus", "publish", "x", "--payload", "{nope"]);
    assert!(
        stderr(&out).contains("--payload is not valid JSON"),
        "{}",
        stderr(&out)
    );
    let out = ws.plugd(&["bus", "tail", "a.>.b"]);
    assert!(
        stderr(&out).contains("misuses a wildcard"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_grants_extend_what_a_plugin_may_publish_and_receive() {
    let ws = Ws::new();
    services_plugin(&ws, "granted", &["broker"], None);
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "broker:\n  grants:\n    granted:\n      publish: [\"alerts.granted.>\"]\n      subscribe: [\"ops.notice\"]\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(30_000)).await;
    let mut alerts = rt.bus().subscribe("alerts.>", 64).unwrap();
    let mut inbound = rt.bus().subscribe("plugin.inbound.loop", 64).unwrap();
    rt.approve("granted", "test").await.unwrap();

    call(
        &rt,
        "granted_publish",
        json!({"topic": "alerts.granted.disk", "text": "90%"}),
    )
    .await
    .unwrap();
    let e = next(&mut alerts).await;
    assert_eq!(e.topic, "alerts.granted.disk");
    // Outside the grant it is still dropped.
    call(&rt, "granted_publish", json!({"topic": "alerts.other"}))
        .await
        .unwrap();
    call(&rt, "granted_ping", json!({})).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || rt
            .broker_stats("granted")
            .is_some_and(|s| s.dropped == 1))
        .await
    );
    assert!(alerts.try_recv().is_none());
    // A granted subscription is delivered (the plugin echoes it inbound).
    let p = rt.bus().publish(Event::new(
        "ops.notice",
        "operator",
        json!({"text": "maintenance"}),
    ));
    assert_eq!(p.delivered, 1);
    let echo = next(&mut inbound).await;
    assert_eq!(echo.payload["echo"], "maintenance");
    assert_eq!(echo.payload["topic"], "ops.notice");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_complete_has_its_own_deadline_from_the_environment() {
    let (base, _seen) = crate::llm::double().await;
    let ws = Ws::new();
    services_plugin(&ws, "patient", &["llm"], Some(&base));
    let dir = ws.dir().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        let approve = crate::support::plugd_cmd(&dir)
            .args(["plugin", "approve", "patient"])
            .output()
            .unwrap();
        assert!(
            approve.status.success(),
            "{}",
            crate::support::stderr(&approve)
        );
        crate::support::plugd_cmd(&dir)
            .env("NEXO_PLUGIN_LLM_TIMEOUT_MS", "800")
            .args([
                "tool",
                "call",
                "patient_complete",
                "--args",
                r#"{"prompt": "[slow] x"}"#,
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = crate::support::stderr(&out);
    assert!(!out.status.success());
    assert!(err.contains("llm.complete timed out after 800 ms"), "{err}");
}
