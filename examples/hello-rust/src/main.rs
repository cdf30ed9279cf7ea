//! hello-rust: the example native plugin (`hello_rust`) built on plugd-sdk — greet and echo.

use plugd_sdk::{Plugin, SdkError, ToolDef, text_result};
use serde_json::json;

/// The manifest plugd loads is the one this binary echoes back: one source of truth.
const MANIFEST: &str = include_str!("../../workspace/.plugins/hello-rust/nexo-plugin.toml");

fn plugin() -> Result<Plugin, SdkError> {
    Ok(Plugin::from_manifest(MANIFEST)?
        .tool(
            ToolDef::new(
                "hello_rust_greet",
                "Greet someone by name",
                json!({
                    "type": "object",
                    "properties": { "name": { "type": "string" } },
                    "required": ["name"]
                }),
            ),
            |inv| Ok(text_result(&format!("Hello, {}!", inv.str_arg("name")?))),
        )
        .tool(
            ToolDef::new(
                "hello_rust_echo",
                "Return the arguments unchanged",
                json!({ "type": "object" }),
            ),
            |inv| Ok(inv.args.clone()),
        ))
}

fn main() -> std::io::Result<()> {
    plugin()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?
        .run_stdio()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greets_echoes_and_shuts_down() {
        let input = concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"nexo_version":"0.1.0"}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tool.invoke","params":{"plugin_id":"hello_rust","tool_name":"hello_rust_greet","args":{"name":"Ada"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tool.invoke","params":{"plugin_id":"hello_rust","tool_name":"hello_rust_echo","args":{"k":[1,"two"]}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"shutdown","params":{}}"#,
            "\n",
        );
        let mut out = Vec::new();
        plugin().unwrap().serve(input.as_bytes(), &mut out).unwrap();
        let frames: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            frames[0]["result"]["manifest"]["plugin"]["id"],
            "hello_rust"
        );
        assert_eq!(frames[0]["result"]["tools"].as_array().unwrap().len(), 2);
        assert_eq!(frames[1]["result"]["content"][0]["text"], "Hello, Ada!");
        assert_eq!(frames[2]["result"], json!({"k": [1, "two"]}));
        assert_eq!(frames[3]["result"], json!({"ok": true}));
    }
}
