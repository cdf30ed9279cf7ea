//! LLM providers behind the [`LlmProvider`] trait ([`model`]): what the
//! agent turn and MCP sampling talk to.
//!
//! Providers (each in its own module): an OpenAI-compatible chat-completions
//! client over HTTP, plugin providers through the native `llm.chat` method,
//! and a deterministic `scripted` provider that replays a file (for demos and
//! tests; it says so). The model they share is [`model`]; plugd.yaml's
//! `llm:` is the runtime's `plugd_runtime::llm`, re-exported here.

mod build;
pub mod model;
pub mod openai;
pub mod plugin;
pub mod scripted;

pub(crate) use build::api_key;
pub use build::build_provider;

pub use model::*;
pub use plugd_runtime::llm::*;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn request_options_fill_what_the_request_leaves_unset() {
        let options = RequestOptions {
            stop_sequences: vec!["END".into()],
            tool_choice: Some(ToolChoiceSetting::Specific("guard/chatty".into())),
            cache_tools: true,
        };
        let mut req = ChatRequest {
            tools: vec![tool("tk_echo"), tool("guard_chatty")],
            ..ChatRequest::default()
        };
        apply_options(&options, &mut req);
        assert_eq!(req.stop_sequences, ["END"]);
        assert!(req.cache_tools);
        // The registry name finds its provider-safe form.
        assert_eq!(
            req.tool_choice,
            Some(ToolChoice::Specific {
                name: "guard_chatty".into()
            })
        );
        // On the wire: nexo's shape.
        let mut wire = serde_json::to_value(&req).unwrap();
        plugin::complete_wire_request(&mut wire);
        assert_eq!(
            wire["tool_choice"],
            json!({"kind": "specific", "name": "guard_chatty"})
        );
        assert_eq!(wire["stop_sequences"], json!(["END"]));
        assert_eq!(wire["cache_tools"], json!(true));
        assert_eq!(wire["system_blocks"], json!([]));

        // A request's own values win; a tool not offered is not chosen.
        let mut own = ChatRequest {
            stop_sequences: vec!["mine".into()],
            tool_choice: Some(ToolChoice::None),
            ..ChatRequest::default()
        };
        apply_options(&options, &mut own);
        assert_eq!(own.stop_sequences, ["mine"]);
        assert_eq!(own.tool_choice, Some(ToolChoice::None));
        let mut bare = ChatRequest::default();
        apply_options(&options, &mut bare);
        assert_eq!(bare.tool_choice, None);
        let mut wire = serde_json::to_value(&bare).unwrap();
        plugin::complete_wire_request(&mut wire);
        assert_eq!(wire["tool_choice"], json!({"kind": "auto"}));
    }

    #[test]
    fn choices_serialize_as_nexo_writes_them() {
        for (c, want) in [
            (ToolChoice::Auto, json!({"kind": "auto"})),
            (ToolChoice::Any, json!({"kind": "any"})),
            (ToolChoice::None, json!({"kind": "none"})),
            (
                ToolChoice::Specific { name: "t".into() },
                json!({"kind": "specific", "name": "t"}),
            ),
        ] {
            assert_eq!(serde_json::to_value(&c).unwrap(), want);
        }
    }
}
