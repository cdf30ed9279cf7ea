//! MCP resources, resource templates, prompts and completion: the real
//! `@modelcontextprotocol/server-everything` through the runtime, the CLI and
//! the HTTP API of a real serve, and a lying Python server
//! (`tests/plugins/mcp/resources_mcp.py`) whose every failure must name the
//! server and the cause, and never hang.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use plugd_dialects::FeatureError;
use plugd_host::CallError;
use plugd_host::dialect::McpEvent;
use plugd_host::{HostConfig, Status};
use plugd_runtime::{Runtime, RuntimeError};
use serde_json::{Value, json};

use crate::http::{Serve, make_token};
use crate::support::{Ws, eventually, quick, repo, stderr, stdout};

fn everything() -> Value {
    let js = repo()
        .join(".npm-tools/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.exists(),
        "{} is missing: run ./scripts/test, which installs @modelcontextprotocol/server-everything into .npm-tools/",
        js.display()
    );
    json!({"command": "node", "args": [js, "stdio"]})
}

fn lying(mode: &str) -> Value {
    let script = repo().join("tests/plugins/mcp/resources_mcp.py");
    json!({"command": "python3", "args": [script, mode]})
}

/// A workspace whose `.mcp.json` declares `servers`, and `yaml` as plugd.yaml.
fn mcp_ws(servers: Value, yaml: &str) -> Ws {
    let ws = Ws::new();
    std::fs::write(
        ws.dir().join(".mcp.json"),
        serde_json::to_vec_pretty(&json!({"mcpServers": servers})).unwrap(),
    )
    .unwrap();
    if !yaml.is_empty() {
        std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
    }
    ws
}

/// One lying server `r` in `mode`, approved.
async fn lying_rt(mode: &str, config: HostConfig) -> (Ws, Runtime) {
    let ws = mcp_ws(json!({"r": lying(mode)}), "");
    let rt = ws.runtime(config).await;
    rt.approve("r", "test").await.unwrap();
    (ws, rt)
}

/// The request methods the lying server `r` received so far.
async fn seen(rt: &Runtime) -> Vec<String> {
    let v = rt.call_tool("r/seen", json!({}), None).await.unwrap();
    serde_json::from_value(v["structuredContent"]["methods"].clone()).unwrap()
}

fn base64_decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        acc = (acc << 6) | A.iter().position(|a| *a == c).unwrap() as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// The error's text, after checking it names server `r`.
#[track_caller]
fn names_r(e: &RuntimeError) -> String {
    let text = e.to_string();
    assert!(text.contains("\"r\""), "the server is not named: {text}");
    text
}

// The real server.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_resources_templates_and_reads() {
    let ws = mcp_ws(json!({"everything": everything()}), "");
    let rt = ws.runtime(quick(20_000)).await;
    rt.approve("everything", "test").await.unwrap();

    let resources = rt.resources("everything").await.unwrap();
    let features = resources
        .iter()
        .find(|r| r["uri"] == "demo://resource/static/document/features.md")
        .unwrap_or_else(|| panic!("features.md not listed: {resources:?}"));
    assert_eq!(features["mimeType"], "text/markdown", "{features}");
    assert!(features["description"].is_string(), "{features}");

    let templates = rt.resource_templates("everything").await.unwrap();
    let uris: Vec<&str> = templates
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    assert!(
        uris.contains(&"demo://resource/dynamic/text/{resourceId}")
            && uris.contains(&"demo://resource/dynamic/blob/{resourceId}"),
        "{uris:?}"
    );

    // A listed text resource.
    let doc = rt
        .read_resource("everything", "demo://resource/static/document/features.md")
        .await
        .unwrap();
    assert!(
        doc["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Everything Server")),
        "{doc}"
    );
    // A templated text URI, and a templated blob.
    let text = rt
        .read_resource("everything", "demo://resource/dynamic/text/7")
        .await
        .unwrap();
    assert_eq!(text["contents"][0]["uri"], "demo://resource/dynamic/text/7");
    assert!(
        text["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Resource 7: This is a plaintext resource")),
        "{text}"
    );
    let blob = rt
        .read_resource("everything", "demo://resource/dynamic/blob/2")
        .await
        .unwrap();
    let bytes = base64_decode(blob["contents"][0]["blob"].as_str().unwrap());
    assert!(
        String::from_utf8(bytes)
            .unwrap()
            .starts_with("Resource 2: This is a base64 blob"),
        "{blob}"
    );
    // The server's own error for an unknown resource, naming it.
    let e = rt
        .read_resource("everything", "demo://nope")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            RuntimeError::Feature(FeatureError::Call(CallError::Remote { method, .. }))
                if method == "resources/read"
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"everything\""), "{e}");

    // The all-servers listing carries the server in each item.
    let all = rt.all_resources().await;
    assert!(all.errors.is_empty(), "{:?}", all.errors);
    assert!(
        all.items
            .iter()
            .all(|i| i.server == "everything" && i.item["uri"].is_string()),
        "{all:?}"
    );
    assert_eq!(all.items.len(), resources.len());
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_prompts_and_completion() {
    let ws = mcp_ws(json!({"everything": everything()}), "");
    let rt = ws.runtime(quick(20_000)).await;
    rt.approve("everything", "test").await.unwrap();

    let prompts = rt.prompts("everything").await.unwrap();
    let args_prompt = prompts
        .iter()
        .find(|p| p["name"] == "args-prompt")
        .unwrap_or_else(|| panic!("{prompts:?}"));
    assert_eq!(args_prompt["title"], "Arguments Prompt");
    assert_eq!(args_prompt["arguments"][0]["name"], "city");
    assert_eq!(args_prompt["arguments"][0]["required"], true);

    let args = BTreeMap::from([("city".to_owned(), "Paris".to_owned())]);
    let got = rt
        .get_prompt("everything", "args-prompt", &args)
        .await
        .unwrap();
    assert_eq!(got["messages"][0]["role"], "user");
    assert_eq!(
        got["messages"][0]["content"]["text"],
        "What's weather in Paris?"
    );
    let with_state = BTreeMap::from([
        ("city".to_owned(), "Austin".to_owned()),
        ("state".to_owned(), "Texas".to_owned()),
    ]);
    let got = rt
        .get_prompt("everything", "args-prompt", &with_state)
        .await
        .unwrap();
    assert!(got.to_string().contains("Austin, Texas"), "{got}");

    // Completion of a prompt argument, then of one that depends on it.
    let prompt_ref = json!({"type": "ref/prompt", "name": "completable-prompt"});
    let c = rt
        .complete(
            "everything",
            &prompt_ref,
            &json!({"name": "department", "value": "E"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(c["values"], json!(["Engineering"]), "{c}");
    let c = rt
        .complete(
            "everything",
            &prompt_ref,
            &json!({"name": "name", "value": "A"}),
            Some(&json!({"arguments": {"department": "Engineering"}})),
        )
        .await
        .unwrap();
    assert_eq!(c["values"], json!(["Alice"]), "{c}");
    // Completion of a resource template's variable.
    let c = rt
        .complete(
            "everything",
            &json!({"type": "ref/resource", "uri": "demo://resource/dynamic/text/{resourceId}"}),
            &json!({"name": "resourceId", "value": "3"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(c["values"], json!(["3"]), "{c}");
    // A reference of the wrong shape is refused before it is sent.
    let e = rt
        .complete(
            "everything",
            &json!({"type": "ref/tool", "name": "echo"}),
            &json!({"name": "x", "value": ""}),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, RuntimeError::Feature(FeatureError::Invalid { .. })),
        "{e:?}"
    );
    rt.shutdown().await;
}

#[test]
fn server_everything_resources_and_prompts_through_the_cli() {
    let ws = mcp_ws(json!({"everything": everything()}), "");
    let o = ws.plugd(&["plugin", "approve", "everything"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = ws.plugd(&["resource", "list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["errors"], json!([]), "{v}");
    assert!(
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["server"] == "everything"
                && r["item"]["uri"] == "demo://resource/static/document/features.md"),
        "{v}"
    );
    let o = ws.plugd(&["resource", "templates", "--server", "everything"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("everything  demo://resource/dynamic/blob/{resourceId}"),
        "{}",
        stdout(&o)
    );
    let o = ws.plugd(&[
        "resource",
        "read",
        "everything",
        "demo://resource/dynamic/text/5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("Resource 5: "), "{}", stdout(&o));
    let o = ws.plugd(&[
        "resource",
        "read",
        "everything",
        "demo://resource/dynamic/blob/5",
    ]);
    assert!(
        stdout(&o).contains("[blob demo://resource/dynamic/blob/5: "),
        "{}",
        stdout(&o)
    );

    let o = ws.plugd(&["prompt", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("everything  args-prompt  city*,state  "),
        "{}",
        stdout(&o)
    );
    let o = ws.plugd(&[
        "prompt",
        "get",
        "everything",
        "args-prompt",
        "--arg",
        "city=Paris",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "user: What's weather in Paris?");
    let o = ws.plugd(&[
        "prompt",
        "get",
        "everything",
        "args-prompt",
        "--arg",
        "city",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--arg \"city\" is not NAME=VALUE"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn server_everything_over_http_with_roles() {
    let ws = mcp_ws(
        json!({"everything": everything(), "plain": lying("no_caps")}),
        "",
    );
    for id in ["everything", "plain"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let viewer = make_token(&ws, "viewer");
    let agent = make_token(&ws, "agent");
    let mut serve = Serve::start(&ws, "127.0.0.1:0");

    let r = serve.get("/v1/resources");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["server"] == "everything"),
        "a server without the capability is left out: {v}"
    );
    assert_eq!(v["errors"], json!([]));
    let v = serve
        .get("/v1/resources/templates?server=everything")
        .json();
    assert!(v["templates"][0]["item"]["uriTemplate"].is_string(), "{v}");
    let v = serve.get("/v1/prompts").json();
    assert!(
        v["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["item"]["name"] == "args-prompt"),
        "{v}"
    );

    let read = json!({"server": "everything", "uri": "demo://resource/dynamic/text/3"});
    let v = serve.post("/v1/resources:read", &read).json();
    assert!(
        v["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Resource 3:")),
        "{v}"
    );
    let v = serve
        .post(
            "/v1/prompts:get",
            &json!({"server": "everything", "name": "args-prompt", "arguments": {"city": "Rome"}}),
        )
        .json();
    assert_eq!(
        v["messages"][0]["content"]["text"],
        "What's weather in Rome?"
    );
    let v = serve
        .post(
            "/v1/completions",
            &json!({"server": "everything",
                    "ref": {"type": "ref/prompt", "name": "completable-prompt"},
                    "argument": {"name": "department", "value": "S"}}),
        )
        .json();
    assert_eq!(
        v["completion"]["values"],
        json!(["Sales", "Support"]),
        "{v}"
    );

    // Typed errors.
    serve
        .post(
            "/v1/resources:read",
            &json!({"server": "nobody", "uri": "x://y"}),
        )
        .error(404, "unknown_plugin");
    let e = serve
        .get("/v1/resources?server=plain")
        .error(422, "capability_missing");
    assert_eq!(e["error"]["details"]["server"], "plain", "{e}");
    assert_eq!(e["error"]["details"]["capability"], "resources", "{e}");
    serve
        .post(
            "/v1/prompts:get",
            &json!({"server": "everything", "name": "args-prompt"}),
        )
        .error(422, "invalid_params");
    serve
        .post("/v1/resources:read", &json!({"server": "everything"}))
        .error(422, "invalid_body");

    // A viewer lists but does not read; an agent reads.
    let admin = std::mem::replace(&mut serve.token, viewer);
    assert_eq!(serve.get("/v1/prompts?server=everything").status, 200);
    serve
        .post("/v1/resources:read", &read)
        .error(403, "forbidden");
    serve.token = agent;
    assert_eq!(serve.post("/v1/resources:read", &read).status, 200);
    serve.token = admin;
    let (status, _) = serve.stop();
    assert!(status.success(), "{status:?}");
}

// The lying server.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_keep_every_field_and_are_cached_until_list_changed() {
    let (_ws, rt) = lying_rt("good", quick(10_000)).await;
    let mut events = rt.mcp_events();
    let listed = rt.resources("r").await.unwrap();
    let uris: Vec<&str> = listed.iter().filter_map(|r| r["uri"].as_str()).collect();
    assert_eq!(
        uris,
        ["mem://text", "mem://blob", "mem://a", "mem://b", "mem://c"],
        "all three pages, in order"
    );
    assert_eq!(
        listed[0],
        json!({"uri": "mem://text", "name": "text", "title": "A text", "description": "plain text",
               "mimeType": "text/plain", "size": 11,
               "annotations": {"audience": ["user"], "priority": 0.5},
               "icons": [{"src": "data:image/png;base64,AAAA", "mimeType": "image/png"}],
               "_meta": {"example.com/origin": "memory"}}),
        "kept as the server gave it"
    );
    // listChanged declared: the second listing is the cache.
    rt.resources("r").await.unwrap();
    let count = |m: &[String]| m.iter().filter(|x| *x == "resources/list").count();
    assert_eq!(count(&seen(&rt).await), 3, "one listing of three pages");

    rt.call_tool("r/grow", json!({}), None).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, McpEvent::ResourcesListChanged { server: "r".into() });
    let listed = rt.resources("r").await.unwrap();
    assert!(
        listed.iter().any(|r| r["uri"] == "mem://new"),
        "list_changed drops the cache: {listed:?}"
    );
    assert_eq!(count(&seen(&rt).await), 6);

    let t = rt.resource_templates("r").await.unwrap();
    assert_eq!(t[0]["uriTemplate"], "mem://item/{id}");
    let item = rt.read_resource("r", "mem://item/42").await.unwrap();
    assert_eq!(item["contents"][0]["text"], "item 42");
    let text = rt.read_resource("r", "mem://text").await.unwrap();
    assert_eq!(text["contents"][0]["_meta"], json!({"example.com/read": 1}));
    let blob = rt.read_resource("r", "mem://blob").await.unwrap();
    assert_eq!(
        base64_decode(blob["contents"][0]["blob"].as_str().unwrap()),
        [0, 1, 2, 3]
    );
    let e = rt.read_resource("r", "mem://missing").await.unwrap_err();
    assert!(
        names_r(&e).contains("Resource not found: mem://missing"),
        "{e}"
    );

    let p = rt
        .get_prompt(
            "r",
            "greet",
            &BTreeMap::from([("name".into(), "Ada".into())]),
        )
        .await
        .unwrap();
    assert_eq!(p["messages"][0]["content"]["text"], "Hello, Ada!");
    let c = rt
        .complete(
            "r",
            &json!({"type": "ref/prompt", "name": "greet"}),
            &json!({"name": "name", "value": "al"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(c["values"], json!(["alpha", "alpine"]));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_forward_updates_and_survive_a_restart() {
    let (_ws, rt) = lying_rt("good", quick(10_000)).await;
    let mut events = rt.mcp_events();
    rt.subscribe_resource("r", "mem://text").await.unwrap();
    // An update for a URI nobody subscribed to is not forwarded.
    rt.call_tool("r/touch", json!({"uri": "mem://other"}), None)
        .await
        .unwrap();
    rt.call_tool("r/touch", json!({"uri": "mem://text"}), None)
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ev,
        McpEvent::ResourceUpdated {
            server: "r".into(),
            uri: "mem://text".into()
        }
    );

    // A crash and a restart: the new process is subscribed again.
    let sup = rt.supervised("r").unwrap().clone();
    let Status::Running { pid, .. } = sup.status() else {
        panic!("{:?}", sup.status())
    };
    let _ = rt.call_tool("r/crash", json!({}), None).await;
    assert!(
        eventually(Duration::from_secs(15), || matches!(
            sup.status(),
            Status::Running { pid: p, .. } if p != pid
        ))
        .await,
        "{:?}",
        sup.status()
    );
    let methods = seen(&rt).await;
    assert!(
        methods.contains(&"resources/subscribe".to_owned()),
        "not subscribed again after the restart: {methods:?}"
    );
    rt.call_tool("r/touch", json!({"uri": "mem://text"}), None)
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ev, McpEvent::ResourceUpdated { .. }), "{ev:?}");

    rt.unsubscribe_resource("r", "mem://text").await.unwrap();
    rt.call_tool("r/touch", json!({"uri": "mem://text"}), None)
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), events.recv())
            .await
            .is_err(),
        "an update after unsubscribing is not forwarded"
    );
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_capability_is_refused_without_a_round_trip() {
    let ws = mcp_ws(json!({"r": lying("no_caps")}), "");
    // A native plugin: not an MCP server, refused without being started.
    ws.misbehave("native", "good", None, "");
    let rt = ws.runtime(quick(10_000)).await;
    rt.approve("r", "test").await.unwrap();
    for e in [
        rt.resources("r").await.unwrap_err(),
        rt.resource_templates("r").await.unwrap_err(),
        rt.read_resource("r", "mem://text").await.unwrap_err(),
        rt.prompts("r").await.unwrap_err(),
        rt.get_prompt("r", "greet", &BTreeMap::new())
            .await
            .unwrap_err(),
        rt.complete(
            "r",
            &json!({"type": "ref/prompt", "name": "greet"}),
            &json!({"name": "name", "value": ""}),
            None,
        )
        .await
        .unwrap_err(),
        rt.subscribe_resource("r", "mem://text").await.unwrap_err(),
    ] {
        assert!(
            matches!(e, RuntimeError::Feature(FeatureError::NotDeclared { .. })),
            "{e:?}"
        );
        let text = names_r(&e);
        assert!(text.contains("capability"), "{text}");
    }
    let methods = seen(&rt).await;
    assert!(
        methods.iter().all(
            |m| ["server/discover", "initialize", "tools/list", "tools/call"].contains(&m.as_str())
        ),
        "plugd sent what the server never declared: {methods:?}"
    );
    // Listing every server leaves it out, silently.
    let all = rt.all_prompts().await;
    assert!(all.items.is_empty() && all.errors.is_empty(), "{all:?}");

    let e = rt.resources("native").await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::Feature(FeatureError::NotSupported { .. })),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("\"native\" speaks the native dialect"),
        "{e}"
    );
    assert_eq!(rt.supervised("native").unwrap().status(), Status::Idle);
    let e = rt.resources("nobody").await.unwrap_err();
    assert!(matches!(e, RuntimeError::UnknownPlugin(_)), "{e:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_over_a_bound_are_refused_naming_server_and_cause() {
    for (mode, cause) in [
        (
            "huge_page",
            "more than 10000 resources (page 0 alone has 20000)",
        ),
        ("endless_pages", "still more pages after 100"),
    ] {
        let (_ws, rt) = lying_rt(mode, quick(10_000)).await;
        let e = rt.resources("r").await.unwrap_err();
        assert!(
            matches!(e, RuntimeError::Feature(FeatureError::TooLarge { .. })),
            "{mode}: {e:?}"
        );
        let text = names_r(&e);
        assert!(
            text.contains("resources/list") && text.contains(cause),
            "{mode}: {text}"
        );
        // The connection is fine afterwards.
        rt.read_resource("r", "mem://text").await.unwrap();
        rt.shutdown().await;
    }
    // Pages under the frame limit that add up to more than one frame.
    let config = HostConfig {
        max_frame: 64 * 1024,
        ..quick(10_000)
    };
    let (_ws, rt) = lying_rt("heavy_pages", config).await;
    let e = rt.resources("r").await.unwrap_err();
    let text = names_r(&e);
    assert!(text.contains("add up to more than 65536 bytes"), "{text}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_the_wrong_shape_are_refused_naming_server_and_method() {
    let cases: [(&str, &str, &str); 4] = [
        (
            "bad_read",
            "resources/read",
            "expected {\"contents\": [...]}",
        ),
        (
            "bad_content",
            "resources/read",
            "exactly one of a string \"text\" or a base64 \"blob\"",
        ),
        (
            "bad_prompt",
            "prompts/get",
            "needs a string \"role\" and an object \"content\"",
        ),
        (
            "bad_completion",
            "completion/complete",
            "must be an array of strings",
        ),
    ];
    for (mode, method, cause) in cases {
        let (_ws, rt) = lying_rt(mode, quick(10_000)).await;
        let e = match method {
            "resources/read" => rt.read_resource("r", "mem://text").await.unwrap_err(),
            "prompts/get" => rt
                .get_prompt("r", "greet", &BTreeMap::from([("name".into(), "x".into())]))
                .await
                .unwrap_err(),
            _ => rt
                .complete(
                    "r",
                    &json!({"type": "ref/prompt", "name": "greet"}),
                    &json!({"name": "name", "value": "a"}),
                    None,
                )
                .await
                .unwrap_err(),
        };
        assert!(
            matches!(e, RuntimeError::Feature(FeatureError::Malformed { .. })),
            "{mode}: {e:?}"
        );
        let text = names_r(&e);
        assert!(
            text.contains(method) && text.contains(cause),
            "{mode}: {text}"
        );
        rt.shutdown().await;
    }
    // Too many completion values are cut to MCP's 100, with hasMore.
    let (_ws, rt) = lying_rt("many_values", quick(10_000)).await;
    let c = rt
        .complete(
            "r",
            &json!({"type": "ref/prompt", "name": "greet"}),
            &json!({"name": "name", "value": ""}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(c["values"].as_array().unwrap().len(), 100);
    assert_eq!(c["hasMore"], true);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_is_never_answered_times_out_and_the_server_stays() {
    let (_ws, rt) = lying_rt("silent_read", quick(1_000)).await;
    let started = Instant::now();
    let e = rt.read_resource("r", "mem://text").await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            &e,
            RuntimeError::Feature(FeatureError::Call(CallError::Timeout { method, .. }))
                if method == "resources/read"
        ),
        "{e:?}"
    );
    names_r(&e);
    rt.resources("r").await.unwrap();
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_approved_unchanged_servers_answer_and_plugd_yaml_may_deny_resources() {
    let ws = mcp_ws(
        json!({"open": lying("good"), "closed": lying("good"), "broken": lying("huge_page"), "new": lying("good")}),
        "mcp:\n  servers:\n    closed:\n      resources: false\n",
    );
    let rt = ws.runtime(quick(10_000)).await;
    for id in ["open", "closed", "broken"] {
        rt.approve(id, "test").await.unwrap();
    }
    let e = rt.resources("new").await.unwrap_err();
    assert!(matches!(e, RuntimeError::NotApproved { .. }), "{e:?}");
    assert!(e.to_string().contains("plugd plugin approve new"), "{e}");
    assert_eq!(rt.supervised("new").unwrap().status(), Status::Idle);

    for e in [
        rt.resources("closed").await.unwrap_err(),
        rt.read_resource("closed", "mem://text").await.unwrap_err(),
        rt.subscribe_resource("closed", "mem://text")
            .await
            .unwrap_err(),
        rt.complete(
            "closed",
            &json!({"type": "ref/resource", "uri": "mem://item/{id}"}),
            &json!({"name": "id", "value": ""}),
            None,
        )
        .await
        .unwrap_err(),
    ] {
        assert!(matches!(e, RuntimeError::ResourcesDenied { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("mcp.servers.closed.resources: false"),
            "{e}"
        );
    }
    // Prompts are not resources.
    assert_eq!(rt.prompts("closed").await.unwrap()[0]["name"], "greet");

    // Every server at once: the denied one is left out, the liar named.
    let all = rt.all_resources().await;
    let servers: std::collections::BTreeSet<&str> =
        all.items.iter().map(|i| i.server.as_str()).collect();
    assert_eq!(servers, ["open"].into(), "{all:?}");
    assert_eq!(all.errors.len(), 1, "{:?}", all.errors);
    assert_eq!(all.errors[0].server, "broken");
    assert!(
        all.errors[0].error.contains("more than 10000 resources"),
        "{:?}",
        all.errors
    );
    rt.shutdown().await;

    // An entry edited after approval answers nothing until approved again.
    let mut servers: Value =
        serde_json::from_slice(&std::fs::read(ws.dir().join(".mcp.json")).unwrap()).unwrap();
    servers["mcpServers"]["open"]["env"] = json!({"X": "1"});
    std::fs::write(
        ws.dir().join(".mcp.json"),
        serde_json::to_vec(&servers).unwrap(),
    )
    .unwrap();
    let rt = ws.runtime(quick(10_000)).await;
    let e = rt.resources("open").await.unwrap_err();
    assert!(matches!(e, RuntimeError::PluginChanged { .. }), "{e:?}");
    assert!(e.to_string().contains("plugd plugin approve open"), "{e}");
    rt.shutdown().await;
}

#[test]
fn cli_failures_name_the_server_and_the_cause() {
    let ws = mcp_ws(
        json!({"r": lying("bad_read"), "plain": lying("no_caps"), "huge": lying("huge_page")}),
        "",
    );
    for id in ["r", "plain", "huge"] {
        let o = ws.plugd(&["plugin", "approve", id]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = ws.plugd(&["resource", "read", "r", "mem://text"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("MCP server \"r\" answered resources/read with an unusable reply"),
        "{err}"
    );
    let o = ws.plugd(&["prompt", "list", "--server", "plain"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("MCP server \"plain\" does not offer prompts"),
        "{}",
        stderr(&o)
    );
    // Without --server, the others are listed and a failure is a warning.
    let o = ws.plugd(&["resource", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("warning: huge: MCP server \"huge\" answered resources/list with too much"),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o).contains("r  mem://text  text  text/plain  A text"),
        "{}",
        stdout(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_stays_stopped() {
    let (_ws, rt) = lying_rt("good", quick(10_000)).await;
    rt.stop("r", "test").await.unwrap();
    let e = rt.resources("r").await.unwrap_err();
    assert!(matches!(e, RuntimeError::Stopped { .. }), "{e:?}");
    assert!(rt.all_resources().await.items.is_empty());
    assert!(!matches!(
        rt.supervised("r").unwrap().status(),
        Status::Running { .. }
    ));
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2024_11_05_server_with_prompts_is_asked_for_completions_without_the_later_capability() {
    // The 2024-11-05 revision had completion/complete but no `completions`
    // capability; refusing it would be stricter than that revision.
    let (_ws, rt) = lying_rt("old", quick(10_000)).await;
    let c = rt
        .complete(
            "r",
            &json!({"type": "ref/prompt", "name": "greet"}),
            &json!({"name": "name", "value": "al"}),
            None,
        )
        .await
        .unwrap();
    assert_eq!(c["values"], json!(["alpha", "alpine"]), "{c}");
    assert!(seen(&rt).await.contains(&"completion/complete".to_owned()));
    rt.shutdown().await;
}
