//! Unit tests of the stdio loop over in-memory readers and writers.

use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::*;

const MANIFEST: &str = r#"
[plugin]
id = "demo"
version = "0.2.0"
name = "Demo"

[plugin.entrypoint]
command = "demo"

[plugin.extends]
tools = ["demo_greet", "demo_fail", "demo_panic", "ext_demo_echo"]
"#;

fn plugin() -> Plugin {
    Plugin::from_manifest(MANIFEST)
        .unwrap()
        .tool(
            ToolDef::new(
                "demo_greet",
                "Greets",
                json!({"type": "object", "properties": {"name": {"type": "string"}}}),
            ),
            |inv| Ok(text_result(&format!("Hello, {}!", inv.str_arg("name")?))),
        )
        .tool(
            ToolDef::new("demo_fail", "Fails", json!({"type": "object"})),
            |inv| {
                Err(match inv.args["kind"].as_str() {
                    Some("unavailable") => ToolError::Unavailable {
                        message: "busy".into(),
                        retry_after_ms: Some(250),
                    },
                    Some("denied") => ToolError::Denied("no".into()),
                    Some("not_found") => ToolError::NotFound("x".into()),
                    _ => ToolError::ExecutionFailed("boom".into()),
                })
            },
        )
        .tool(
            ToolDef::new("demo_panic", "Panics", json!({"type": "object"})),
            |_| panic!("handler bug"),
        )
        .tool(
            ToolDef::new("ext_demo_echo", "Echoes", json!({"type": "object"})),
            |inv| Ok(inv.args.clone()),
        )
}

/// Runs the loop over `input` and returns the reply frames, parsed.
fn run(p: &Plugin, input: &str) -> Vec<Value> {
    let mut out = Vec::new();
    p.serve(input.as_bytes(), &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn req(id: u64, method: &str, params: Value) -> String {
    format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    )
}

fn invoke(id: u64, tool: &str, args: Value) -> String {
    req(
        id,
        "tool.invoke",
        json!({"plugin_id": "demo", "tool_name": tool, "args": args, "agent_id": "a1"}),
    )
}

#[test]
fn initialize_echoes_manifest_and_catalog() {
    let out = run(
        &plugin(),
        &req(1, "initialize", json!({"nexo_version": "0.1.0"})),
    );
    assert_eq!(out.len(), 1);
    let r = &out[0];
    assert_eq!(r["jsonrpc"], "2.0");
    assert_eq!(r["id"], 1);
    assert_eq!(r["result"]["manifest"]["plugin"]["id"], "demo");
    assert_eq!(r["result"]["manifest"]["plugin"]["version"], "0.2.0");
    assert_eq!(
        r["result"]["manifest"]["plugin"]["entrypoint"]["command"],
        "demo"
    );
    assert_eq!(r["result"]["server_version"], "demo-0.2.0");
    let names: Vec<&str> = r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["demo_greet", "demo_fail", "demo_panic", "ext_demo_echo"]
    );
    assert_eq!(
        r["result"]["tools"][0]["input_schema"]["properties"]["name"]["type"],
        "string"
    );
}

#[test]
fn tool_invoke_success_and_string_ids() {
    let input = invoke(2, "demo_greet", json!({"name": "Ada"}))
        + r#"{"jsonrpc":"2.0","id":"s-1","method":"tool.invoke","params":{"tool_name":"ext_demo_echo","args":{"x":[1,2]}}}"#
        + "\n";
    let out = run(&plugin(), &input);
    assert_eq!(
        out[0],
        json!({"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "Hello, Ada!"}], "is_error": false}})
    );
    assert_eq!(
        out[1],
        json!({"jsonrpc": "2.0", "id": "s-1", "result": {"x": [1, 2]}})
    );
}

#[test]
fn tool_errors_carry_codes_and_data() {
    let input = invoke(1, "demo_nope", json!({}))
        + &invoke(2, "demo_greet", json!({}))
        + &invoke(3, "demo_fail", json!({}))
        + &invoke(4, "demo_fail", json!({"kind": "unavailable"}))
        + &invoke(5, "demo_fail", json!({"kind": "denied"}))
        + &invoke(6, "demo_panic", json!({}))
        + &req(7, "tool.invoke", json!({"args": {}}));
    let out = run(&plugin(), &input);
    let codes: Vec<i64> = out
        .iter()
        .map(|r| r["error"]["code"].as_i64().unwrap())
        .collect();
    assert_eq!(
        codes,
        [-33401, -33402, -33403, -33404, -33405, -33403, -32602]
    );
    assert_eq!(out[0]["error"]["message"], "tool not found: demo_nope");
    assert_eq!(out[1]["error"]["data"]["details"]["field"], "name");
    assert!(out[2]["error"].get("data").is_none());
    assert_eq!(out[3]["error"]["data"]["retry_after_ms"], 250);
    assert_eq!(
        out[5]["error"]["message"],
        "execution failed: handler for \"demo_panic\" panicked"
    );
}

#[test]
fn unknown_methods_notifications_and_junk() {
    let input = String::from("not json at all\n")
        + "[1,2]\n"
        + "\n"
        + r#"{"jsonrpc":"2.0","id":5,"result":{}}"#
        + "\n"
        + r#"{"jsonrpc":"2.0","method":"broker.event","params":{}}"#
        + "\n"
        + &req(8, "llm.chat", json!({}))
        + &invoke(9, "ext_demo_echo", json!(1));
    let out = run(&plugin(), &input);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["id"], 8);
    assert_eq!(out[0]["error"]["code"], -32601);
    assert_eq!(out[1]["result"], 1);
}

#[test]
fn shutdown_replies_then_stops_reading() {
    let input =
        req(1, "shutdown", json!({"reason": "test"})) + &invoke(2, "ext_demo_echo", json!({}));
    let out = run(&plugin(), &input);
    assert_eq!(
        out,
        [json!({"jsonrpc": "2.0", "id": 1, "result": {"ok": true}})]
    );
}

#[test]
fn eof_without_shutdown_and_without_final_newline() {
    let input = invoke(1, "ext_demo_echo", json!("a")) + r#"{"jsonrpc":"2.0","id":2,"method":"x"}"#;
    let out = run(&plugin(), &input);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1]["error"]["code"], -32601);
}

#[test]
fn overlong_lines_are_skipped_not_buffered() {
    let p = plugin().max_frame_bytes(200);
    let big = format!(
        "{}\n",
        json!({"jsonrpc":"2.0","id":1,"method":"tool.invoke","params":{"tool_name":"ext_demo_echo","args":"x".repeat(500)}})
    );
    let input = big + &invoke(2, "ext_demo_echo", json!(2));
    let out = run(&p, &input);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["id"], 2);
}

#[test]
fn overlong_line_across_many_reads() {
    // Longer than the read buffer so the skip spans several fills.
    let p = plugin().max_frame_bytes(1000);
    let input = "y".repeat(3 * READ_BUFFER) + "\n" + &invoke(2, "ext_demo_echo", json!(2));
    let out = run(&p, &input);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["result"], 2);
}

/// A writer that records each `write` it receives from the `BufWriter`.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

impl Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().push(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A reader that hands out its input in fixed pieces, like a pipe would.
struct Chunked(Vec<Vec<u8>>);

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Ok(0);
        }
        let chunk = self.0.remove(0);
        assert!(chunk.len() <= buf.len());
        buf[..chunk.len()].copy_from_slice(&chunk);
        Ok(chunk.len())
    }
}

#[test]
fn pipelined_burst_is_answered_with_one_write() {
    let burst: String = (0..64)
        .map(|i| invoke(i, "ext_demo_echo", json!({"i": i})))
        .collect();
    let rec = Recorder::default();
    plugin().serve(burst.as_bytes(), rec.clone()).unwrap();
    let writes = rec.0.lock().unwrap();
    assert_eq!(writes.len(), 1, "one write for the whole burst");
    assert_eq!(writes[0].iter().filter(|&&b| b == b'\n').count(), 64);
}

#[test]
fn flushes_when_input_drains_between_reads() {
    // Two separate arrivals: the first reply must be written before the
    // second read, or a host waiting for it would deadlock.
    let a = invoke(1, "ext_demo_echo", json!(1)).into_bytes();
    let b =
        (invoke(2, "ext_demo_echo", json!(2)) + &invoke(3, "ext_demo_echo", json!(3))).into_bytes();
    let rec = Recorder::default();
    plugin().serve(Chunked(vec![a, b]), rec.clone()).unwrap();
    let writes = rec.0.lock().unwrap();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].iter().filter(|&&b| b == b'\n').count(), 1);
    assert_eq!(writes[1].iter().filter(|&&b| b == b'\n').count(), 2);
}

#[test]
fn catalog_drift_is_refused_before_serving() {
    let undeclared = Plugin::from_manifest(MANIFEST)
        .unwrap()
        .tool(ToolDef::new("demo_other", "", json!({})), |_| {
            Ok(Value::Null)
        });
    assert_eq!(
        undeclared.check(),
        Err(SdkError::UndeclaredTool("demo_other".into()))
    );
    let err = undeclared.serve(&b""[..], Vec::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);

    let foreign = Plugin::from_manifest(MANIFEST)
        .unwrap()
        .tool(ToolDef::new("other_greet", "", json!({})), |_| {
            Ok(Value::Null)
        });
    assert!(matches!(
        foreign.check(),
        Err(SdkError::UnnamespacedTool { .. })
    ));

    let twice = plugin().tool(ToolDef::new("demo_greet", "", json!({})), |_| {
        Ok(Value::Null)
    });
    assert_eq!(
        twice.check(),
        Err(SdkError::DuplicateTool("demo_greet".into()))
    );
}

#[test]
fn tool_error_display_and_text_result() {
    assert_eq!(
        ToolError::argument_invalid("missing `city`").to_string(),
        "invalid argument: missing `city`"
    );
    assert_eq!(ToolError::unavailable("x").data(), None);
    assert_eq!(
        text_result("hi"),
        json!({"content": [{"type": "text", "text": "hi"}], "is_error": false})
    );
}
