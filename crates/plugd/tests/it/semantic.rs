//! Semantic recall (`memory.embedder` in plugd.yaml): `plugd memory
//! add|search` and a plugin's `memory.recall` through an OpenAI-compatible
//! embeddings server (a local HTTP double, the only stand-in: no embedding
//! model is reachable here) and through a real Python plugin serving the
//! plugd extension `embed.texts` and a vector backend.
//!
//! Both embed by counting words of four concepts (pets, money, travel,
//! food), so "feline" finds "the kitten naps on the sofa" although they
//! share no word, which keyword (FTS5) recall cannot do.

use std::net::SocketAddr;
use std::process::Output;

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use plugd_agent::recall::MemoryExt;
use plugd_agent::vector::VectorExt;
use plugd_runtime::Runtime;
use serde_json::{Value, json};

use crate::support::{Ws, plugd_cmd, quick, repo, stderr, stdout};

const CONCEPTS: [&[&str]; 4] = [
    &[
        "cat", "cats", "kitten", "kittens", "feline", "dog", "dogs", "puppy",
    ],
    &[
        "invoice", "invoices", "payment", "billing", "tax", "bill", "overdue",
    ],
    &["flight", "trip", "airport", "plane", "travel"],
    &["pizza", "dinner", "lunch", "food"],
];

fn bag_of_concepts(text: &str) -> Vec<f64> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_lowercase())
        .filter(|w| !w.is_empty())
        .collect();
    CONCEPTS
        .iter()
        .map(|c| words.iter().filter(|w| c.contains(w)).count() as f64)
        .collect()
}

/// `/v1/embeddings`, behaving by model: `bow` answers bag-of-concepts
/// vectors; `locked` wants `Bearer sekrit`; `broken` is HTTP 500;
/// `garbage` is not JSON; `nan` sends a NaN token; `overflow` a number too
/// large for f32; `huge` a 9 MiB body; `short` answers one vector too few;
/// `wide` answers five dimensions.
async fn embeddings(headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    let inputs: Vec<String> = body["input"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mut vectors: Vec<Vec<f64>> = inputs.iter().map(|t| bag_of_concepts(t)).collect();
    match model.as_str() {
        "locked" if auth != "Bearer sekrit" => {
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})),
            )
                .into_response();
        }
        "broken" => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": {"message": "the GPU caught fire"}})),
            )
                .into_response();
        }
        "garbage" => return (StatusCode::OK, "<html>oops</html>").into_response(),
        "nan" => {
            return (
                StatusCode::OK,
                r#"{"data": [{"index": 0, "embedding": [NaN, 0, 0, 0]}]}"#,
            )
                .into_response();
        }
        "overflow" => vectors.iter_mut().for_each(|v| v[1] = 1e39),
        "huge" => return (StatusCode::OK, " ".repeat(9 << 20)).into_response(),
        "short" => {
            vectors.pop();
        }
        "wide" => vectors.iter_mut().for_each(|v| v.push(1.0)),
        _ => {}
    }
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .rev() // out of order on purpose: `index` orders them
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    Json(json!({"object": "list", "data": data, "model": model})).into_response()
}

/// Starts the embeddings double on 127.0.0.1 in its own thread (so plain
/// `#[test]`s running the CLI can use it); returns its base URL.
fn double() -> String {
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/v1/embeddings", axum::routing::post(embeddings))
                .fallback(|| async { StatusCode::NOT_FOUND });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}/v1", rx.recv().unwrap())
}

fn write_config(ws: &Ws, yaml: &str) {
    std::fs::write(ws.dir().join("plugd.yaml"), yaml).unwrap();
}

fn openai_config(ws: &Ws, base: &str, model: &str, extra: &str) {
    write_config(
        ws,
        &format!(
            "memory:\n  embedder:\n    provider: openai\n    base_url: \"{base}\"\n    model: {model}\n{extra}"
        ),
    );
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

fn failed(out: Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", stdout(&out));
    stderr(&out)
}

fn search(ws: &Ws, agent: &str, query: &str) -> Value {
    serde_json::from_str(&ok(
        ws.plugd(&["memory", "search", "--agent", agent, query, "--json"])
    ))
    .unwrap()
}

fn contents(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|e| e["content"].as_str().unwrap().to_owned())
        .collect()
}

const KITTEN: &str = "the kitten naps on the sofa";
const INVOICE: &str = "the invoice is overdue";

#[test]
fn semantic_recall_finds_a_memory_that_shares_no_word_with_the_query() {
    let ws = Ws::new();
    let base = double();
    openai_config(&ws, &base, "bow", "");
    let kitten = ok(ws.plugd(&["memory", "add", "--agent", "a", KITTEN, "--tag", "pets"]));
    ok(ws.plugd(&["memory", "add", "--agent", "a", INVOICE]));
    ok(ws.plugd(&["memory", "add", "--agent", "b", "my cat is grey"]));

    // "feline" is in no entry; the kitten is the only one near it, agent b's
    // cat is another agent's, the invoice scores 0 and is dropped.
    let hits = search(&ws, "a", "feline");
    assert_eq!(contents(&hits), [KITTEN]);
    let entry = hits[0].as_object().unwrap();
    let keys: Vec<&str> = entry.keys().map(String::as_str).collect();
    assert_eq!(keys, ["agent_id", "content", "created_at", "id", "tags"]);
    assert_eq!(entry["id"], kitten.trim());
    assert_eq!(entry["agent_id"], "a");
    assert_eq!(entry["tags"], json!(["pets"]));
    assert_eq!(contents(&search(&ws, "a", "billing")), [INVOICE]);
    assert_eq!(contents(&search(&ws, "b", "puppy")), ["my cat is grey"]);
    assert_eq!(contents(&search(&ws, "a", "airport")), Vec::<String>::new());

    // The embedding went to the built-in backend: id = memory id, metadata
    // {agent_id, tags}.
    let records: Value = serde_json::from_str(&ok(ws.plugd(&[
        "memory",
        "vector",
        "search",
        "--collection",
        "memories",
        "--embedding",
        "[1, 0, 0, 0]",
        "--filter",
        r#"{"agent_id": "a"}"#,
        "--limit",
        "1",
    ])))
    .unwrap();
    assert_eq!(records[0]["id"], kitten.trim());
    assert_eq!(
        records[0]["metadata"],
        json!({"agent_id": "a", "tags": ["pets"]})
    );

    // Keyword recall (no embedder) cannot find it.
    write_config(&ws, "");
    assert_eq!(contents(&search(&ws, "a", "feline")), Vec::<String>::new());
    assert_eq!(contents(&search(&ws, "a", "kitten")), [KITTEN]);
}

#[test]
fn embedder_failures_are_reported_never_hidden() {
    let ws = Ws::new();
    let base = double();
    let add = |ws: &Ws| ws.plugd(&["memory", "add", "--agent", "a", KITTEN]);
    let listed = |ws: &Ws| ok(ws.plugd(&["memory", "list", "--agent", "a", "--json"]));

    openai_config(&ws, &base, "locked", "");
    let e = failed(add(&ws));
    assert!(
        e.contains(r#"semantic memory: embedder "openai:locked": authentication failed: HTTP 401: Incorrect API key provided; check the API key variable (memory.embedder.api_key_env)"#),
        "{e}"
    );
    // The failed add stored nothing.
    assert_eq!(listed(&ws).trim(), "[]");
    openai_config(&ws, &base, "locked", "    api_key_env: SEM_KEY\n");
    let e = failed(add(&ws));
    assert!(
        e.contains(r#"memory.embedder.api_key_env names "SEM_KEY", which is not set or empty"#),
        "{e}"
    );
    let out = plugd_cmd(ws.dir())
        .env("SEM_KEY", "sekrit")
        .args(["memory", "add", "--agent", "a", KITTEN])
        .output()
        .unwrap();
    ok(out);

    let cases = [
        (
            "broken",
            "",
            r#"embedder "openai:broken": HTTP 500: the GPU caught fire"#,
        ),
        (
            "garbage",
            "",
            r#"embedder "openai:garbage": malformed reply: not JSON"#,
        ),
        (
            "nan",
            "",
            r#"embedder "openai:nan": malformed reply: not JSON"#,
        ),
        (
            "overflow",
            "",
            r#"embedder "openai:overflow": malformed reply: embedding 0[1] is not a finite 32-bit number"#,
        ),
        (
            "huge",
            "",
            r#"embedder "openai:huge": the response is larger than 8388608 bytes; it was refused"#,
        ),
        (
            "short",
            "",
            r#"embedder "openai:short": malformed reply: 0 embeddings for 1 text; an embedder answers one vector per text"#,
        ),
        (
            "wide",
            "    dimensions: 4\n",
            r#"embedder "openai:wide": dimension mismatch: expected 4, got 5; fix memory.embedder.dimensions or the model"#,
        ),
        // The collection holds 4-dimensional records: the backend refuses.
        (
            "wide",
            "",
            r#"semantic memory: vector backend "builtin", collection "memories": dimension mismatch: expected 4, got 5"#,
        ),
    ];
    for (model, extra, want) in cases {
        openai_config(&ws, &base, model, extra);
        let e = failed(ws.plugd(&["memory", "search", "--agent", "a", "kitten"]));
        assert!(e.contains(want), "{model}: {e}");
        let e = failed(add(&ws));
        assert!(e.contains(want), "{model}: {e}");
    }
    // Nothing was added by the failures.
    assert_eq!(
        contents(&serde_json::from_str(&listed(&ws)).unwrap()),
        [KITTEN]
    );

    // Nobody listening.
    openai_config(&ws, "http://127.0.0.1:1/v1", "bow", "");
    let e = failed(ws.plugd(&["memory", "search", "--agent", "a", "kitten"]));
    assert!(
        e.contains(r#"embedder "openai:bow": connection failed"#)
            && e.contains("is the server at http://127.0.0.1:1/v1/embeddings running?"),
        "{e}"
    );

    // Disabled memory refuses add and search alike.
    write_config(&ws, "memory: {enabled: false}\n");
    for out in [
        add(&ws),
        ws.plugd(&["memory", "search", "--agent", "a", "kitten"]),
    ] {
        let e = failed(out);
        assert!(
            e.contains("memory disabled:") && e.contains("sets memory.enabled: false"),
            "{e}"
        );
    }
}

fn text(v: &Value) -> String {
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {v}"))
        .to_owned()
}

async fn recall(rt: &Runtime, agent: &str, query: &str) -> Result<String, String> {
    rt.call_tool("mem_recall", json!({"agent": agent, "query": query}), None)
        .await
        .map(|v| text(&v))
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_recall_from_a_plugin_is_semantic_and_refused_when_disabled() {
    let ws = Ws::new();
    let base = double();
    crate::broker::services_plugin(&ws, "mem", &["memory"], None);
    openai_config(&ws, &base, "bow", "");
    let rt = ws.runtime(quick(30_000)).await;
    rt.memory_add("a", KITTEN, &[]).await.unwrap();
    rt.memory_add("a", INVOICE, &[]).await.unwrap();
    rt.approve("mem", "test").await.unwrap();
    assert_eq!(
        recall(&rt, "a", "feline").await.unwrap(),
        format!(r#"["{KITTEN}"]"#)
    );

    // plugd.yaml is read per call: a broken embedder is a -32603 naming it.
    openai_config(&ws, &base, "broken", "");
    let e = recall(&rt, "a", "feline").await.unwrap_err();
    assert!(
        e.contains(r#"rpc error -32603: memory backend error: semantic memory: embedder "openai:broken": HTTP 500: the GPU caught fire"#),
        "{e}"
    );
    write_config(&ws, "memory:\n  enabled: false\n");
    let e = recall(&rt, "a", "feline").await.unwrap_err();
    assert!(e.contains("rpc error -32603: memory disabled"), "{e}");
    rt.shutdown().await;
}

/// Installs tests/plugins/semantic/pysem.py as plugin `id` (embedder and
/// vector backend `id`).
fn pysem(ws: &Ws, id: &str) {
    let dir = ws.plugin_dir(id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/semantic/pysem.py"),
        dir.join("main.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        format!(
            "[plugin]\nid = \"{id}\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"main.py\"]\n\n[plugin.extends]\nmemory_backends = [\"{id}\"]\n"
        ),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_embedder_and_a_plugin_backend_serve_semantic_recall() {
    let ws = Ws::new();
    pysem(&ws, "pysem");
    // pyvec is a backend without embed.texts.
    let dir = ws.plugin_dir("pyvec");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/broker/pyvec.py"),
        dir.join("main.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"pyvec\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"main.py\"]\n\n[plugin.extends]\nmemory_backends = [\"pyvec\"]\n",
    )
    .unwrap();
    write_config(
        &ws,
        "memory:\n  vector: {backend: pysem, collection: kb}\n  embedder: {provider: plugin, plugin: pysem, dimensions: 4}\n",
    );
    let rt = ws.runtime(quick(30_000)).await;
    rt.approve("pysem", "test").await.unwrap();
    rt.approve("pyvec", "test").await.unwrap();

    let kitten = rt.memory_add("a", KITTEN, &["pets".into()]).await.unwrap();
    rt.memory_add("a", INVOICE, &[]).await.unwrap();
    rt.memory_add("b", "my cat is grey", &[]).await.unwrap();
    let hits = rt.memory_recall("a", "feline", None).await.unwrap();
    assert_eq!(hits, vec![kitten.clone()]);
    let hits = rt.memory_recall("b", "kittens", Some(5)).await.unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].content, "my cat is grey");
    let e = rt
        .memory_recall("bad agent", "feline", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains(r#"agent id "bad agent""#), "{e}");
    // The records live in the plugin's collection, with the entry's metadata.
    let m = rt
        .vector_backend("pysem")
        .unwrap()
        .search(
            "kb",
            vec![1.0, 0.0, 0.0, 0.0],
            10,
            Some(json!({"agent_id": "a"})),
        )
        .await
        .unwrap();
    assert_eq!(m[0].id, kitten.id);
    assert_eq!(m[0].metadata, json!({"agent_id": "a", "tags": ["pets"]}));

    // Hostile embedder replies are refused, naming the plugin.
    let e = rt.memory_recall("a", "[short]", None).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"semantic memory: embedder "plugin:pysem": malformed reply: 0 embeddings for 1 text; an embedder answers one vector per text"#
    );
    let e = rt.memory_add("a", "[words]", &[]).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"semantic memory: embedder "plugin:pysem": malformed reply: embedding 0[0] is not a number: "a""#
    );
    assert_eq!(rt.state().memory_list("a", 100).await.unwrap().len(), 2);

    // A plugin without embed.texts, and one that does not exist.
    write_config(
        &ws,
        "memory:\n  embedder: {provider: plugin, plugin: pyvec}\n",
    );
    let e = rt.memory_recall("a", "feline", None).await.unwrap_err();
    assert!(
        e.to_string().contains(
            r#"embedder "plugin:pyvec": the plugin does not implement embed.texts (a plugd extension"#
        ),
        "{e}"
    );
    write_config(
        &ws,
        "memory:\n  embedder: {provider: plugin, plugin: ghost}\n",
    );
    let e = rt.memory_recall("a", "feline", None).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("embedder not configured: memory.embedder.plugin:")
            && e.to_string().contains("ghost"),
        "{e}"
    );
    // An unknown backend is named.
    write_config(
        &ws,
        "memory:\n  vector: {backend: qdrant}\n  embedder: {provider: plugin, plugin: pysem}\n",
    );
    let e = rt.memory_recall("a", "feline", None).await.unwrap_err();
    assert!(
        e.to_string()
            .contains(r#"semantic memory: memory.vector.backend: no vector backend "qdrant""#),
        "{e}"
    );
    rt.shutdown().await;
}
