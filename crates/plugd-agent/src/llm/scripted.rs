//! The `scripted` provider: replays a YAML file of answers and tool calls.
//!
//! **For demos and tests only**: it never calls a model. It makes agent
//! turns deterministic, so a demo or a test can drive real plugins through
//! the whole loop (hooks, tool calls, results) without a network.
//!
//! The file is a mapping with one key, `steps`, a list; each step is either
//! `{text: "..."}` or `{tool_calls: [{name, arguments, id?}]}`, optionally with
//! `expect_user_contains: "..."`, a check on the latest user message. In a
//! `text`, `{{tools}}` becomes the names of the tools the request offers,
//! sorted and joined by `, ` (so a test can see what a turn was offered):
//!
//! ```yaml
//! steps:
//!   - expect_user_contains: weather
//!     tool_calls:
//!       - name: weather_lookup
//!         arguments: {city: Paris}
//!   - text: It is sunny in Paris.
//! ```
//!
//! **Which step answers**: a request carries no session id, so the position
//! comes from the conversation itself: the answer to a request is step *n*
//! where *n* is the number of assistant messages already in
//! `request.messages`. A session's transcript therefore walks the script from
//! the start, each session independently, and a restarted host resumes where
//! the stored transcript left off. (A caller that trims old messages from the
//! request shifts the position.) When *n* reaches the end of the script, or a
//! check fails, the call fails with a message saying so.
//!
//! Streaming sends a text answer as a few [`Delta::TextDelta`]s (split at
//! spaces) and each tool call as start, arguments and end. Usage is zero.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{
    ChatRequest, ChatResponse, Delta, FinishReason, LlmError, LlmFuture, LlmProvider, Role,
    ToolCall, Usage,
};

/// Largest script file read.
pub const MAX_SCRIPT_BYTES: u64 = 4 << 20;

/// What a `text` step's answer replaces with the offered tools' names.
pub const TOOLS_PLACEHOLDER: &str = "{{tools}}";

/// How many text deltas a streamed answer is split into, at most.
const TEXT_PIECES: usize = 4;

/// A script file, parsed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    steps: Vec<StepFile>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepFile {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallFile>>,
    #[serde(default)]
    expect_user_contains: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallFile {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    id: Option<String>,
}

/// What one step answers.
#[derive(Debug, Clone, PartialEq)]
pub enum StepReply {
    /// A text answer.
    Text(String),
    /// Tool calls (ids given in the file, else `call_<step>_<i>`).
    ToolCalls(Vec<ToolCall>),
}

/// One step of a script.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The answer.
    pub reply: StepReply,
    /// Text the latest user message must contain.
    pub expect_user_contains: Option<String>,
}

/// Why a script file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("scripted llm: cannot read script {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is over [`MAX_SCRIPT_BYTES`].
    #[error("scripted llm: script {path} is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not a valid script.
    #[error(
        "scripted llm: script {path}{}: {message}; a script is `steps:` followed by a list of {{text}} or {{tool_calls: [{{name, arguments}}]}} steps, each optionally with expect_user_contains",
        line.map(|l| format!(" line {l}")).unwrap_or_default()
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The line, when known.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
}

impl From<ScriptError> for LlmError {
    fn from(e: ScriptError) -> Self {
        LlmError::NotConfigured(e.to_string())
    }
}

/// A deterministic provider replaying a script (see the module docs).
#[derive(Debug, Clone)]
pub struct ScriptedProvider {
    path: PathBuf,
    steps: Vec<Step>,
}

impl ScriptedProvider {
    /// Loads and validates the script at `path`.
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let size = std::fs::metadata(path)
            .map_err(|error| ScriptError::Read {
                path: path.to_path_buf(),
                error,
            })?
            .len();
        if size > MAX_SCRIPT_BYTES {
            return Err(ScriptError::TooLarge {
                path: path.to_path_buf(),
                size,
                limit: MAX_SCRIPT_BYTES,
            });
        }
        let text = std::fs::read_to_string(path).map_err(|error| ScriptError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse(path, &text)
    }

    /// Parses script `text` (`path` names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ScriptError> {
        let invalid = |line: Option<usize>, message: String| ScriptError::Invalid {
            path: path.to_path_buf(),
            line,
            message,
        };
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        options.strict_booleans = true;
        let file: Option<ScriptFile> =
            serde_saphyr::from_str_with_options(text, options).map_err(|e| {
                let message = e.to_string();
                let mut message = message.lines().next().unwrap_or("").trim().to_owned();
                if let Some(at) = message.rfind(" at line ") {
                    message.truncate(at);
                }
                invalid(e.location().map(|l| l.line() as usize), message)
            })?;
        let file = file.ok_or_else(|| invalid(None, "the file is empty".into()))?;
        if file.steps.is_empty() {
            return Err(invalid(None, "`steps` is empty".into()));
        }
        let mut steps = Vec::with_capacity(file.steps.len());
        for (n, step) in file.steps.into_iter().enumerate() {
            let reply = match (step.text, step.tool_calls) {
                (Some(text), None) => StepReply::Text(text),
                (None, Some(calls)) if !calls.is_empty() => {
                    let mut out = Vec::with_capacity(calls.len());
                    for (i, c) in calls.into_iter().enumerate() {
                        let arguments = c
                            .arguments
                            .unwrap_or_else(|| Value::Object(Default::default()));
                        if !arguments.is_object() {
                            return Err(invalid(
                                None,
                                format!(
                                    "steps[{n}].tool_calls[{i}] ({:?}): arguments must be a mapping",
                                    c.name
                                ),
                            ));
                        }
                        out.push(ToolCall {
                            id: c.id.unwrap_or_else(|| format!("call_{n}_{i}")),
                            name: c.name,
                            arguments,
                        });
                    }
                    StepReply::ToolCalls(out)
                }
                (None, Some(_)) => {
                    return Err(invalid(None, format!("steps[{n}].tool_calls is empty")));
                }
                _ => {
                    return Err(invalid(
                        None,
                        format!("steps[{n}] must have exactly one of `text` and `tool_calls`"),
                    ));
                }
            };
            steps.push(Step {
                reply,
                expect_user_contains: step.expect_user_contains,
            });
        }
        Ok(ScriptedProvider {
            path: path.to_path_buf(),
            steps,
        })
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    fn fail(&self, message: String) -> LlmError {
        LlmError::Other {
            provider: "scripted".into(),
            message: format!("script {}: {message}", self.path.display()),
        }
    }

    /// The answer to `request` (see the module docs for which step answers).
    pub fn answer(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let n = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let step = self.steps.get(n).ok_or_else(|| {
            self.fail(format!(
                "the script is exhausted: it has {} steps and the conversation already has {n} assistant replies; add steps or start a new session",
                self.steps.len()
            ))
        })?;
        if let Some(want) = &step.expect_user_contains {
            let last = request
                .messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(|m| m.content.as_str());
            if !last.is_some_and(|t| t.contains(want.as_str())) {
                let got = match last {
                    Some(t) => format!("{:?}", t.chars().take(200).collect::<String>()),
                    None => "no user message".to_owned(),
                };
                return Err(self.fail(format!(
                    "step {n} expects the latest user message to contain {want:?}, got {got}"
                )));
            }
        }
        Ok(match &step.reply {
            StepReply::Text(text) => ChatResponse {
                content: with_tools(text, request),
                tool_calls: Vec::new(),
                finish_reason: FinishReason::Stop,
                usage: Usage::default(),
            },
            StepReply::ToolCalls(calls) => ChatResponse {
                content: String::new(),
                tool_calls: calls.clone(),
                finish_reason: FinishReason::ToolUse,
                usage: Usage::default(),
            },
        })
    }
}

/// `text` with `{{tools}}` replaced by the names of the tools `request`
/// offers, sorted, joined by `, `.
fn with_tools(text: &str, request: &ChatRequest) -> String {
    if !text.contains(TOOLS_PLACEHOLDER) {
        return text.to_owned();
    }
    let mut names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    text.replace(TOOLS_PLACEHOLDER, &names.join(", "))
}

/// `text` in up to [`TEXT_PIECES`] pieces, split after spaces; the pieces
/// concatenate to `text`.
fn pieces(text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let cuts: Vec<usize> = text.match_indices(' ').map(|(i, _)| i + 1).collect();
    if cuts.is_empty() {
        return vec![text];
    }
    let per = cuts.len().div_ceil(TEXT_PIECES).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    for cut in cuts.iter().skip(per - 1).step_by(per) {
        if *cut < text.len() {
            out.push(&text[start..*cut]);
            start = *cut;
        }
    }
    out.push(&text[start..]);
    out.retain(|p| !p.is_empty());
    out
}

impl LlmProvider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    fn chat<'a>(
        &'a self,
        request: &'a ChatRequest,
        deltas: Option<mpsc::UnboundedSender<Delta>>,
    ) -> LlmFuture<'a> {
        Box::pin(async move {
            let reply = self.answer(request)?;
            if let Some(tx) = deltas {
                for piece in pieces(&reply.content) {
                    let _ = tx.send(Delta::TextDelta {
                        delta: piece.to_owned(),
                    });
                }
                for call in &reply.tool_calls {
                    let _ = tx.send(Delta::ToolCallStart {
                        id: call.id.clone(),
                        name: call.name.clone(),
                    });
                    let _ = tx.send(Delta::ToolCallArgsDelta {
                        id: call.id.clone(),
                        delta: call.arguments.to_string(),
                    });
                    let _ = tx.send(Delta::ToolCallEnd {
                        id: call.id.clone(),
                    });
                }
            }
            Ok(reply)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ChatMessage;

    #[test]
    fn pieces_concatenate_to_the_text() {
        for text in [
            "",
            "one",
            "a b",
            "It is sunny in Paris today, says the tool.",
        ] {
            let p = pieces(text);
            assert_eq!(p.concat(), text);
            assert!(p.len() <= TEXT_PIECES + 1, "{p:?}");
        }
        assert!(pieces("It is sunny in Paris today, says the tool.").len() > 1);
    }

    #[test]
    fn bad_scripts_are_refused_with_the_reason() {
        let p = Path::new("/s.yaml");
        let e = ScriptedProvider::parse(p, "steps:\n  - text: hi\n    tool_calls: []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/s.yaml") && e.contains("steps[0]"), "{e}");
        let e = ScriptedProvider::parse(p, "steps:\n  - txt: hi\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("txt") && e.contains("line 2"), "{e}");
        let e = ScriptedProvider::parse(
            p,
            "steps:\n  - tool_calls:\n      - {name: t, arguments: [1]}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("arguments must be a mapping"), "{e}");
        assert!(ScriptedProvider::parse(p, "").is_err());
        assert!(ScriptedProvider::parse(p, "steps: []\n").is_err());
    }

    #[test]
    fn the_position_comes_from_the_conversation() {
        let s = ScriptedProvider::parse(
            Path::new("/s.yaml"),
            "steps:\n  - {expect_user_contains: weather, tool_calls: [{name: w, arguments: {city: Paris}}]}\n  - text: sunny\n",
        )
        .unwrap();
        let mut req = ChatRequest {
            model: None,
            messages: vec![ChatMessage::text(Role::User, "weather in Paris?")],
            tools: Vec::new(),
            max_tokens: None,
            temperature: None,
            system_prompt: None,
            ..ChatRequest::default()
        };
        let first = s.answer(&req).unwrap();
        assert_eq!(first.tool_calls[0].id, "call_0_0");
        req.messages.push(ChatMessage {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: first.tool_calls,
            tool_call_id: None,
        });
        assert_eq!(s.answer(&req).unwrap().content, "sunny");
        req.messages
            .push(ChatMessage::text(Role::Assistant, "sunny"));
        let e = s.answer(&req).unwrap_err().to_string();
        assert!(e.contains("exhausted") && e.contains("2 steps"), "{e}");
        let other = ChatRequest {
            messages: vec![ChatMessage::text(Role::User, "hello")],
            ..req
        };
        let e = s.answer(&other).unwrap_err().to_string();
        assert!(
            e.contains("step 0") && e.contains("\"weather\"") && e.contains("\"hello\""),
            "{e}"
        );
    }

    #[test]
    fn a_text_names_the_offered_tools_where_it_says_so() {
        use crate::llm::ToolSpec;
        let s = ScriptedProvider::parse(
            Path::new("/s.yaml"),
            "steps:\n  - {text: \"offered: {{tools}}\"}\n",
        )
        .unwrap();
        let spec = |n: &str| ToolSpec {
            name: n.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        };
        let mut req = ChatRequest {
            messages: vec![ChatMessage::text(Role::User, "hi")],
            tools: vec![spec("b"), spec("a")],
            ..ChatRequest::default()
        };
        assert_eq!(s.answer(&req).unwrap().content, "offered: a, b");
        req.tools.clear();
        assert_eq!(s.answer(&req).unwrap().content, "offered: ");
    }
}
