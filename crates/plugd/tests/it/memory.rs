//! `plugd memory add|search|list`: the agents' long-term memory through the CLI.

use serde_json::Value;

use crate::support::{Ws, stderr, stdout};

fn add(ws: &Ws, agent: &str, text: &str, tags: &[&str]) -> String {
    let mut args = vec!["memory", "add", "--agent", agent, text];
    for t in tags {
        args.extend(["--tag", t]);
    }
    let out = ws.plugd(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_owned()
}

fn search(ws: &Ws, agent: &str, query: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["memory", "search", "--agent", agent, query, "--json"];
    args.extend(extra);
    let out = ws.plugd(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn add_then_search_returns_the_entry_scoped_by_agent() {
    let ws = Ws::new();
    let id = add(
        &ws,
        "ventas_v1",
        "user prefers concise answers",
        &["preference"],
    );
    assert!(id.starts_with("mem_"), "{id}");
    add(&ws, "ventas_v1", "the invoice run is on Fridays", &[]);
    add(&ws, "soporte", "user prefers concise answers too", &[]);

    let hits = search(&ws, "ventas_v1", "concise answers", &[]);
    assert_eq!(hits.len(), 1, "{hits:?}");
    let e = &hits[0];
    assert_eq!(e["id"], id.as_str());
    assert_eq!(e["agent_id"], "ventas_v1");
    assert_eq!(e["content"], "user prefers concise answers");
    assert_eq!(e["tags"], serde_json::json!(["preference"]));
    assert!(e["created_at"].as_str().unwrap().ends_with('Z'));

    // Punctuation and FTS operators in a query are just words.
    assert_eq!(search(&ws, "ventas_v1", "\"Fridays\" OR (", &[]).len(), 1);
    assert!(search(&ws, "ventas_v1", "nothing-matches-this", &[]).is_empty());

    let list = ws.plugd(&["memory", "list", "--agent", "ventas_v1"]);
    let text = stdout(&list);
    assert!(text.lines().next().unwrap().contains("Fridays"), "{text}");
    assert_eq!(text.lines().count(), 2);
}

#[test]
fn limits_and_bad_input_are_refused_clearly() {
    let ws = Ws::new();
    for i in 0..12 {
        add(&ws, "a1", &format!("fact {i} about cats"), &[]);
    }
    assert_eq!(search(&ws, "a1", "cats", &[]).len(), 10);
    assert_eq!(search(&ws, "a1", "cats", &["--limit", "3"]).len(), 3);
    let out = ws.plugd(&[
        "memory", "search", "--agent", "a1", "cats", "--limit", "1001",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--limit must be between 1 and 1000"),
        "{}",
        stderr(&out)
    );
    let out = ws.plugd(&["memory", "add", "--agent", "../etc", "x"]);
    assert!(
        stderr(&out).contains("agent id \"../etc\""),
        "{}",
        stderr(&out)
    );
    let out = ws.plugd(&["memory", "add", "--agent", "a1", "   "]);
    assert!(stderr(&out).contains("it is empty"), "{}", stderr(&out));
}

#[test]
fn a_reader_that_stops_early_gets_no_panic_report() {
    use std::io::Read;
    use std::process::Stdio;

    let ws = Ws::new();
    let line = "x".repeat(200);
    crate::support::block_on(async {
        let store = ws.state().await;
        for i in 0..1000 {
            store
                .memory_add("a1", &format!("{i} {line}"), &[])
                .await
                .unwrap();
        }
    });
    // ~200 KiB of output, far over a pipe's buffer; read one chunk, close.
    let mut child = crate::support::plugd_cmd(ws.dir())
        .args(["memory", "list", "--agent", "a1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 64];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}
