//! `search_tools`, the one tool a `discovery: search` profile lists: its
//! definition, the checks of its arguments, and a simple deterministic
//! relevance over tool names and descriptions.
//!
//! The query is cut into terms (runs of letters and digits, lower-cased;
//! at most [`MAX_TERMS`]). Each term scores, per tool, [`NAME_WORD`] when it
//! is a word of the name (split at `_`, `-`, `.`, `/`), else [`NAME_PART`]
//! when the name contains it, plus [`DESCRIPTION_WORD`] when it is a word of
//! the description, else [`DESCRIPTION_PART`] when the description contains
//! it. A tool with score 0 is no match; matches are ranked by score, then
//! by name, so the same catalog always answers the same query the same way.

use plugd_wire::jsonrpc::kind;
use serde_json::{Value, json};

/// The tool's name. Under a `discovery: search` profile a tool of this
/// name in the view is withheld (the search tool takes its place).
pub(crate) const SEARCH_TOOL: &str = "search_tools";

/// Longest `query`, in bytes.
pub(crate) const MAX_QUERY_BYTES: usize = 512;

/// Most terms of a query that count (the rest are ignored).
pub(crate) const MAX_TERMS: usize = 16;

/// Results without a `limit`.
pub(crate) const DEFAULT_LIMIT: usize = 10;

/// Most results whatever `limit` asks for.
pub(crate) const MAX_LIMIT: usize = 50;

/// Score of a term that is a word of the name.
const NAME_WORD: u32 = 8;
/// Score of a term the name contains (not as a word).
const NAME_PART: u32 = 4;
/// Score of a term that is a word of the description.
const DESCRIPTION_WORD: u32 = 2;
/// Score of a term the description contains (not as a word).
const DESCRIPTION_PART: u32 = 1;

/// The `search_tools` tool as `tools/list` shows it.
pub(crate) fn tool_json() -> Value {
    json!({
        "name": SEARCH_TOOL,
        "description": "Search the tools this server offers by words of their names and descriptions. \
             Answers the matching tools' names, descriptions and input schemas, best first; \
             they are then added to tools/list. Every tool found can be called by its name.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_QUERY_BYTES,
                    "description": "Words to look for in tool names and descriptions.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": format!("Most results (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})."),
                },
            },
            "required": ["query"],
            "additionalProperties": false,
        },
        "annotations": {"readOnlyHint": true, "idempotentHint": true, "openWorldHint": false},
    })
}

/// One search, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// The query as given.
    pub(crate) query: String,
    /// Its terms, lower-cased, deduplicated, in order.
    pub(crate) terms: Vec<String>,
    /// Most results, within 1 to [`MAX_LIMIT`].
    pub(crate) limit: usize,
}

impl Request {
    /// The search `args` ask for, or a message saying what is wrong (the
    /// model reads it as a tool error).
    pub(crate) fn parse(args: &Value) -> Result<Request, String> {
        let Some(obj) = args.as_object() else {
            return Err("search_tools takes an object {\"query\": \"words\"}".into());
        };
        if let Some(k) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "query" | "limit"))
        {
            return Err(format!(
                "search_tools has no argument {:?}; use \"query\" and \"limit\"",
                clip(k)
            ));
        }
        let query = match obj.get("query") {
            Some(Value::String(q)) => q,
            Some(other) => {
                return Err(format!(
                    "\"query\" must be a string of words, got {}",
                    kind(other)
                ));
            }
            None => return Err("search_tools needs a \"query\": words to look for".into()),
        };
        if query.len() > MAX_QUERY_BYTES {
            return Err(format!(
                "\"query\" is {} bytes; at most {MAX_QUERY_BYTES}: search with a few words",
                query.len()
            ));
        }
        let mut terms: Vec<String> = Vec::new();
        for t in query
            .split(|c: char| !c.is_alphanumeric())
            .filter(|t| !t.is_empty())
        {
            let t = t.to_lowercase();
            if !terms.contains(&t) {
                terms.push(t);
            }
            if terms.len() == MAX_TERMS {
                break;
            }
        }
        if terms.is_empty() {
            return Err(format!(
                "\"query\" {:?} holds no word to look for; use letters or digits",
                clip(query)
            ));
        }
        let limit = match obj.get("limit") {
            None | Some(Value::Null) => DEFAULT_LIMIT,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(0) | None => {
                    return Err(format!("\"limit\" must be a whole number from 1, got {n}"));
                }
                Some(n) => usize::try_from(n).unwrap_or(MAX_LIMIT).min(MAX_LIMIT),
            },
            Some(other) => {
                return Err(format!(
                    "\"limit\" must be a whole number from 1, got {}",
                    kind(other)
                ));
            }
        };
        Ok(Request {
            query: query.clone(),
            terms,
            limit,
        })
    }
}

/// At most 64 characters of `s`, for messages.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Whether `word` is one of the words of `text` (lower-cased), split at
/// everything that is not a letter or digit.
fn has_word(text: &str, word: &str) -> bool {
    text.split(|c: char| !c.is_alphanumeric())
        .any(|w| w == word)
}

/// The score of `(name, description)` for `terms` (0: no match).
fn score(terms: &[String], name: &str, description: &str) -> u32 {
    let name = name.to_lowercase();
    let description = description.to_lowercase();
    terms
        .iter()
        .map(|t| {
            let in_name = if has_word(&name, t) {
                NAME_WORD
            } else if name.contains(t.as_str()) {
                NAME_PART
            } else {
                0
            };
            let in_description = if has_word(&description, t) {
                DESCRIPTION_WORD
            } else if description.contains(t.as_str()) {
                DESCRIPTION_PART
            } else {
                0
            };
            in_name + in_description
        })
        .sum()
}

/// The indices into `tools` (`(name, description)`) that match `request`,
/// best first, ties by name, at most `request.limit`.
pub(crate) fn rank(request: &Request, tools: &[(&str, &str)]) -> Vec<usize> {
    let mut hits: Vec<(u32, &str, usize)> = tools
        .iter()
        .enumerate()
        .filter_map(|(i, (name, description))| {
            let s = score(&request.terms, name, description);
            (s > 0).then_some((s, *name, i))
        })
        .collect();
    hits.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
    hits.into_iter()
        .take(request.limit)
        .map(|(_, _, i)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: Value) -> Request {
        Request::parse(&args).unwrap()
    }

    const TOOLS: [(&str, &str); 4] = [
        ("hello_python_greet", "Greets someone by name"),
        ("everything__echo", "Echoes back the input"),
        ("jira_search", "Search Jira issues with JQL"),
        ("weather", "Forecast for a city; no greeting"),
    ];

    #[test]
    fn names_weigh_more_than_descriptions_and_ties_go_by_name() {
        let r = req(json!({"query": "greet"}));
        // A word of the name beats a part of a description.
        assert_eq!(rank(&r, &TOOLS), vec![0, 3]);
        let r = req(json!({"query": "SEARCH jira"}));
        assert_eq!(rank(&r, &TOOLS), vec![2]);
        let r = req(json!({"query": "back"}));
        assert_eq!(rank(&r, &TOOLS), vec![1]);
        // A part of a name ("the" in "weather") beats a word of a
        // description.
        let r = req(json!({"query": "the"}));
        assert_eq!(rank(&r, &TOOLS), vec![3, 1]);
        let r = req(json!({"query": "nothing-matches-this"}));
        assert!(rank(&r, &TOOLS).is_empty());
        // Deterministic: the same answer every time, ties by name.
        let tie = [("b_tool", "x"), ("a_tool", "x")];
        assert_eq!(rank(&req(json!({"query": "tool"})), &tie), vec![1, 0]);
    }

    #[test]
    fn limits_are_bounded_and_bad_arguments_say_why() {
        assert_eq!(req(json!({"query": "a"})).limit, DEFAULT_LIMIT);
        assert_eq!(req(json!({"query": "a", "limit": 3})).limit, 3);
        assert_eq!(
            req(json!({"query": "a", "limit": u64::MAX})).limit,
            MAX_LIMIT
        );
        for bad in [
            json!({"query": "a", "limit": 0}),
            json!({"query": "a", "limit": -1}),
            json!({"query": "a", "limit": 2.5}),
            json!({"query": "a", "limit": 1e300}),
            json!({"query": "a", "limit": "9"}),
            json!({"query": 7}),
            json!({"query": ["a"]}),
            json!({"query": ""}),
            json!({"query": " ,;- "}),
            json!({"query": "x".repeat(MAX_QUERY_BYTES + 1)}),
            json!({}),
            json!({"query": "a", "other": 1}),
            json!("a"),
        ] {
            let e = Request::parse(&bad).unwrap_err();
            assert!(e.len() < 300, "{e}");
        }
        let many = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(req(json!({"query": many})).terms.len(), MAX_TERMS);
    }
}
