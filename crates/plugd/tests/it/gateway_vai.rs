//! A VAI package's tool metadata through the MCP gateway, seen by the
//! official Python and TypeScript SDK clients over `plugd mcp`: its
//! `output_schema` as `outputSchema`, its `structured_output` as
//! `structuredContent` (checked against that schema), `display_name` as
//! `title`, and `effect_class` / `permissions.network` as annotations. The
//! package runs `tests/plugins/vai/vai_plugin.py`.

use serde_json::{Value, json};

use crate::gateway::{client, stdio_plan, step, ts_client};
use crate::support::{Ws, repo, stderr};

const OUTPUT_SCHEMA: &str = r#"{"type": "object", "required": ["input"],
  "properties": {"input": {"type": "object", "properties": {"n": {"type": "integer"}}}}}"#;

/// A workspace with package `test/meta`: `echo` (read-only, network
/// egress, an output schema), `pid` (a non-idempotent write), `sleep` (an
/// idempotent write) and `fail` (no effect class), all approved.
fn workspace() -> Ws {
    let ws = Ws::new();
    let dir = ws.plugin_dir("meta");
    std::fs::create_dir_all(dir.join("schemas")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/vai/vai_plugin.py"),
        dir.join("plugin.py"),
    )
    .unwrap();
    std::fs::write(dir.join("schemas/any.json"), r#"{"type":"object"}"#).unwrap();
    std::fs::write(dir.join("schemas/echo_out.json"), OUTPUT_SCHEMA).unwrap();
    let mut m = String::from(
        "api_version = \"vai.plugin.v1\"\npackage_id = \"test/meta\"\nversion = \"0.1.0\"\n\n[runtime]\nprotocol = \"vai.rpc.v1\"\ntransport = \"stdio\"\nentrypoint = [\"python3\", \"plugin.py\", \"good\", \"test/meta\", \"0.1.0\"]\n",
    );
    for (id, effect, extra) in [
        (
            "echo",
            "effect_class = \"read_only\"\noutput_schema = \"schemas/echo_out.json\"\n",
            "display_name = \"Echo Back\"\n[exports.permissions]\nnetwork = \"egress\"\n",
        ),
        ("pid", "effect_class = \"non_idempotent_write\"\n", ""),
        ("sleep", "effect_class = \"idempotent_write\"\n", ""),
        ("fail", "", ""),
    ] {
        m.push_str(&format!(
            "\n[[exports]]\nid = \"{id}\"\nkind = \"tool\"\ndescription = \"test {id}\"\n{extra}\n[exports.tool]\ninput_schema = \"schemas/any.json\"\n{effect}"
        ));
    }
    std::fs::write(dir.join("vai-plugin.toml"), m).unwrap();
    let o = ws.plugd(&["plugin", "approve", "test/meta"]);
    assert!(o.status.success(), "{}", stderr(&o));
    ws
}

fn tool<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed: {list}"))
}

fn steps() -> Value {
    json!([
        {"op": "list"},
        {"op": "call", "name": "test__meta__echo", "args": {"n": 1}},
        {"op": "call", "name": "test__meta__echo", "args": {"n": "one"}},
        {"op": "call", "name": "test__meta__pid", "args": {}},
    ])
}

/// What both clients must see.
fn check(report: &Value) {
    let list = step(report, 0);
    let echo = tool(list, "test__meta__echo");
    assert_eq!(echo["title"], "Echo Back", "{echo}");
    assert_eq!(
        echo["outputSchema"],
        serde_json::from_str::<Value>(OUTPUT_SCHEMA).unwrap(),
        "{echo}"
    );
    assert_eq!(
        echo["annotations"],
        json!({"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true}),
        "{echo}"
    );
    let pid = tool(list, "test__meta__pid");
    assert_eq!(
        pid["annotations"],
        json!({"readOnlyHint": false, "idempotentHint": false, "openWorldHint": false}),
        "{pid}"
    );
    assert!(pid.get("outputSchema").is_none(), "{pid}");
    let sleep = tool(list, "test__meta__sleep");
    assert_eq!(
        sleep["annotations"],
        json!({"readOnlyHint": false, "idempotentHint": true, "openWorldHint": false}),
        "{sleep}"
    );
    assert_eq!(
        tool(list, "test__meta__fail")["annotations"],
        json!({"openWorldHint": false})
    );

    // structured_output that matches the schema is structuredContent.
    let ok = step(report, 1);
    assert_eq!(ok["is_error"], false, "{report}");
    assert_eq!(ok["structured"]["input"], json!({"n": 1}), "{report}");
    // One that does not is a tool error naming the place (the client's
    // own check never sees a non-conforming structuredContent).
    let bad = step(report, 2);
    assert_eq!(bad["is_error"], true, "{report}");
    let text = bad["text"].as_str().unwrap();
    assert!(
        text.contains("structured_output/input/n") && text.contains("test/meta"),
        "{text}"
    );
    assert_eq!(step(report, 3)["is_error"], false, "{report}");
}

#[test]
fn the_python_sdk_sees_a_vai_tools_schema_result_and_annotations() {
    let ws = workspace();
    let (report, _) = client(stdio_plan(&ws, &[], None, steps()));
    check(&report);
}

#[test]
fn the_typescript_sdk_sees_a_vai_tools_schema_result_and_annotations() {
    let ws = workspace();
    let report = ts_client(stdio_plan(&ws, &[], None, steps()));
    check(&report);
}
