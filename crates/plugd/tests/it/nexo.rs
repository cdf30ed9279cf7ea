//! The nexo contract as the seed writes it, with no plugd-specific addition:
//! a `nexoai` plugin declaring only `nexo_capabilities = ["broker"]` recalls
//! memory, completes through a provider named "minimax" that another plugin
//! serves (`[plugin.extends].llm_providers`), and exchanges broker events
//! with a real `plugd serve`; plus the operator's deny switch and the
//! manifest checks that refuse a plugin (requires, min_nexo_version,
//! contract major).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::broker::services_plugin;
use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

/// A plugin `id` serving `providers` through `raw_provider.py`.
fn provider_plugin(ws: &Ws, id: &str, providers: &[&str]) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/llm/raw_provider.py"),
        dir.join("main.py"),
    )
    .unwrap();
    let list: Vec<String> = providers.iter().map(|p| format!("\"{p}\"")).collect();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\nmin_nexo_version = \">=0.1.0\"\n\n\
             [plugin.entrypoint]\ncommand = \"{}\"\nargs = [\"main.py\"]\n\n\
             [plugin.extends]\nllm_providers = [{}]\n",
            repo().join(".venv/bin/python3").display(),
            list.join(", ")
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

async fn call(rt: &plugd_runtime::Runtime, tool: &str, args: Value) -> Result<String, String> {
    rt.call_tool(tool, args, None)
        .await
        .map(|v| text(&v))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_only_plugin_recalls_memory_and_completes_through_a_named_plugin_provider() {
    let ws = Ws::new();
    services_plugin(&ws, "svc", &["broker"], None);
    provider_plugin(&ws, "mm", &["minimax"]);
    let rt = ws.runtime(quick(30_000)).await;
    rt.state()
        .memory_add("ventas_v1", "user prefers concise answers", &[])
        .await
        .unwrap();
    rt.approve("mm", "test").await.unwrap();
    rt.approve("svc", "test").await.unwrap();

    // memory.recall: a host service, not a permission.
    let got = call(
        &rt,
        "svc_recall",
        json!({"agent": "ventas_v1", "query": "concise answers"}),
    )
    .await
    .unwrap();
    assert_eq!(got, r#"["user prefers concise answers"]"#);

    // llm.complete {provider: "minimax"} reaches the plugin provider; the SDK
    // sends temperature 0.7 and the provider reads exactly 0.7 on its wire.
    let done: Value = serde_json::from_str(
        &call(
            &rt,
            "svc_complete",
            json!({"prompt": "summarize", "provider": "minimax"}),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let seen: Value = serde_json::from_str(done["content"].as_str().unwrap()).unwrap();
    assert_eq!(seen["temperature"], "0.7", "{seen}");
    assert_eq!(seen["provider"], "minimax");
    assert_eq!(seen["model"], "test-model");
    assert_eq!(seen["user"], "summarize");
    // The whole ChatRequest of §5.y is on the wire.
    for key in [
        "messages",
        "max_tokens",
        "temperature",
        "stop_sequences",
        "tool_choice",
        "system_blocks",
        "cache_tools",
    ] {
        assert!(
            seen["keys"].as_array().unwrap().contains(&json!(key)),
            "{key} missing from {seen}"
        );
    }

    // An unknown provider: -32603 naming the registered ones.
    let err = call(
        &rt,
        "svc_complete",
        json!({"prompt": "x", "provider": "cohere"}),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("provider \"cohere\" is not registered; registered: minimax (plugin mm)"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_providers_in_plugd_yaml_sit_beside_the_legacy_llm_section() {
    let (base, seen) = crate::llm::double().await;
    let ws = Ws::new();
    services_plugin(&ws, "named", &["broker"], Some(&base));
    // Keep `llm:` (the back-compatible single provider, named "openai") and
    // add a named endpoint.
    let mut yaml = std::fs::read_to_string(ws.dir().join("plugd.yaml")).unwrap();
    yaml.push_str(&format!(
        "llm_providers:\n  minimax:\n    provider: openai\n    base_url: \"{base}\"\n    model: minimax-m2.5\n"
    ));
    std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("named", "test").await.unwrap();
    for provider in ["openai", "minimax"] {
        let done: Value = serde_json::from_str(
            &call(
                &rt,
                "named_complete",
                json!({"prompt": "hi", "provider": provider}),
            )
            .await
            .unwrap(),
        )
        .unwrap();
        assert_eq!(done["content"], "echo: hi", "{provider}");
    }
    // The endpoint received the SDK's 0.7 as 0.7 in its raw body.
    let bodies = seen.lock().unwrap().bodies().to_vec();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    for body in &bodies {
        let raw = serde_json::to_string(body).unwrap();
        assert!(raw.contains("\"temperature\":0.7"), "{raw}");
    }
    let err = call(
        &rt,
        "named_complete",
        json!({"prompt": "x", "provider": "nope"}),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("provider \"nope\" is not registered; registered: minimax, openai"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_can_deny_a_host_service_to_one_plugin() {
    let ws = Ws::new();
    services_plugin(&ws, "narrow", &["broker"], None);
    services_plugin(&ws, "wide", &["broker"], None);
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "host_services:\n  deny:\n    narrow: [memory, broker]\n",
    )
    .unwrap();
    let rt = ws.runtime(quick(30_000)).await;
    let mut inbound = rt.bus().subscribe("plugin.inbound.>", 64).unwrap();
    rt.approve("narrow", "test").await.unwrap();
    rt.approve("wide", "test").await.unwrap();
    let err = call(&rt, "narrow_recall", json!({"agent": "a", "query": "x"}))
        .await
        .unwrap_err();
    assert!(
        err.contains("memory.recall is not configured for plugin \"narrow\"")
            && err.contains("plugd.yaml host_services.deny.narrow"),
        "{err}"
    );
    // The other plugin is not narrowed.
    assert_eq!(
        call(&rt, "wide_recall", json!({"agent": "a", "query": "x"}))
            .await
            .unwrap(),
        "[]"
    );
    // A denied broker: publishes dropped and counted, nothing delivered.
    call(
        &rt,
        "narrow_publish",
        json!({"topic": "plugin.inbound.loop"}),
    )
    .await
    .unwrap();
    call(&rt, "narrow_ping", json!({})).await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || rt
            .broker_stats("narrow")
            .is_some_and(|s| s.dropped == 1))
        .await,
        "{:?}",
        rt.broker_stats("narrow")
    );
    assert!(inbound.try_recv().is_none());
    let p = rt.bus().publish(plugd_host::bus::Event::new(
        "plugin.outbound.loop",
        "t",
        json!({"text": "x"}),
    ));
    assert_eq!(p.delivered, 1, "only the wide plugin receives it");
    rt.shutdown().await;
}

/// Writes a minimal native plugin `id` with `extra` lines in `[plugin]` and
/// returns what `plugd plugin approve` said.
fn approve_with(ws: &Ws, id: &str, plugin_lines: &str, requires: &str) -> (bool, String) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n{plugin_lines}\n\n\
             [plugin.requires]\nnexo_capabilities = [{requires}]\n\n\
             [plugin.entrypoint]\ncommand = \"/bin/true\"\n"
        ),
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", id]);
    (
        out.status.success(),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

#[test]
fn plugins_plugd_cannot_serve_are_refused_naming_why() {
    let ws = Ws::new();
    let (ok, out) = approve_with(&ws, "gpu_user", "", "\"broker\", \"gpu\"");
    assert!(!ok, "{out}");
    assert!(
        out.contains("requires nexo capability \"gpu\", which plugd cannot provide"),
        "{out}"
    );
    let (ok, out) = approve_with(
        &ws,
        "future",
        "min_nexo_version = \">=9.0.0\"",
        "\"broker\"",
    );
    assert!(!ok, "{out}");
    assert!(
        out.contains("requires nexo \">=9.0.0\", but plugd presents nexo 0.1.5"),
        "{out}"
    );
    let (ok, out) = approve_with(&ws, "v2", "contract_version = \"2.0.0\"", "\"broker\"");
    assert!(!ok, "{out}");
    assert!(
        out.contains("targets nexo contract \"2.0.0\", but plugd implements contract 1.10.0"),
        "{out}"
    );
    // What plugd does provide passes these checks.
    let list = ws.plugd(&["plugin", "list"]);
    assert!(stdout(&list).contains("gpu_user"), "{}", stdout(&list));
}

#[test]
fn serve_starts_channel_plugins_so_outbound_events_reach_them() {
    use std::io::Read;
    use std::process::Stdio;

    use crate::http::Serve;
    use crate::support::plugd_cmd;

    let ws = Ws::new();
    // No `start = "eager"`: the channel registration alone starts it.
    services_plugin(&ws, "chan", &["broker"], None);
    let out = ws.plugd(&["plugin", "approve", "chan"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _serve = Serve::start(&ws, "127.0.0.1:0");
    let mut tail = plugd_cmd(ws.dir())
        .args(["bus", "tail", "plugin.inbound.>", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let mut delivered = 0;
    while Instant::now() < end && tail.try_wait().unwrap().is_none() {
        let out = ws.plugd(&[
            "bus",
            "publish",
            "plugin.outbound.loop",
            "--payload",
            r#"{"text": "ping"}"#,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let published: Value = serde_json::from_str(&stdout(&out)).unwrap();
        delivered = delivered.max(published["delivered"].as_u64().unwrap());
        // The event id is a UUID, as the contract's examples show.
        let id = published["event"]["id"].as_str().unwrap().to_owned();
        assert!(is_uuid(&id), "{id}");
        std::thread::sleep(Duration::from_millis(300));
    }
    if tail.try_wait().unwrap().is_none() {
        let _ = tail.kill();
        let _ = tail.wait();
        panic!("no reply event within 20 s; delivered to the plugin: {delivered}");
    }
    let status = tail.wait().unwrap();
    let mut lines = String::new();
    tail.stdout
        .take()
        .unwrap()
        .read_to_string(&mut lines)
        .unwrap();
    assert!(status.success(), "tail failed: {lines}");
    assert!(
        delivered >= 1,
        "nothing was delivered to the channel plugin"
    );
    let echo: Value = serde_json::from_str(lines.trim()).unwrap();
    assert_eq!(echo["topic"], "plugin.inbound.loop");
    assert_eq!(echo["payload"]["echo"], "ping");
}

/// Whether `s` has the shape of a UUID.
pub(crate) fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && parts
            .iter()
            .all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_tool_the_plugin_does_not_advertise_is_tool_not_found() {
    let ws = Ws::new();
    services_plugin(&ws, "decl", &["broker"], None);
    let manifest = ws.plugin_dir("decl").join("nexo-plugin.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("tools = [", "tools = [\"decl_ghost\", ");
    std::fs::write(&manifest, text).unwrap();
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("decl", "test").await.unwrap();
    let err = call(&rt, "decl_ghost", json!({})).await.unwrap_err();
    assert!(err.contains("tool \"decl_ghost\" not found"), "{err}");
    assert!(err.contains("-33401"), "{err}");
    // A name nobody declares stays an unknown tool.
    let err = call(&rt, "decl_nothing", json!({})).await.unwrap_err();
    assert!(!err.contains("-33401"), "{err}");
    rt.shutdown().await;
}

/// §5.y's `stop_sequences`, `tool_choice` and `cache_tools`: what plugd.yaml's
/// `llm:` sets reaches the plugin provider's `llm.chat` request from an
/// agent turn (the tool chosen by its name among the turn's tools); without
/// them each field carries its neutral value, and `system_blocks` is `[]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_yaml_request_options_reach_the_plugin_providers_wire() {
    use plugd_agent::agent::Agent;
    use plugd_runtime::config::PlugdConfig;
    use plugd_runtime::hooks::HookContext;

    let ws = Ws::new();
    provider_plugin(&ws, "mm", &["minimax"]);
    ws.misbehave("tk", "good", None, "");
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("mm", "test").await.unwrap();
    rt.approve("tk", "test").await.unwrap();
    let options_seen = |yaml: &'static str| {
        let rt = rt.clone();
        let dir = ws.dir().to_path_buf();
        async move {
            std::fs::write(dir.join("plugd.yaml"), yaml).unwrap();
            let config = PlugdConfig::load(&dir).unwrap();
            let agent = Agent::from_config(&rt, &config).await.unwrap();
            let out = agent
                .turn("s1", "hello", &HookContext::default(), None)
                .await
                .unwrap();
            let seen: Value = serde_json::from_str(out.reply.as_deref().unwrap()).unwrap();
            seen["options"].clone()
        }
    };
    assert_eq!(
        options_seen(
            "llm: {provider: plugin, plugin: mm, name: minimax, model: m1, stop_sequences: [\"\\nUser:\"], tool_choice: {specific: tk_echo}, cache_tools: true}\n"
        )
        .await,
        json!({"stop_sequences": ["\nUser:"], "tool_choice": {"kind": "specific", "name": "tk_echo"},
               "system_blocks": [], "cache_tools": true})
    );
    assert_eq!(
        options_seen(
            "llm: {provider: plugin, plugin: mm, name: minimax, model: m1, tool_choice: any}\n"
        )
        .await,
        json!({"stop_sequences": [], "tool_choice": {"kind": "any"}, "system_blocks": [], "cache_tools": false})
    );
    assert_eq!(
        options_seen("llm: {provider: plugin, plugin: mm, name: minimax, model: m1}\n").await,
        json!({"stop_sequences": [], "tool_choice": {"kind": "auto"}, "system_blocks": [], "cache_tools": false})
    );
    rt.shutdown().await;
}
