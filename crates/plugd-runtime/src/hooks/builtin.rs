//! The built-in hook handlers (seed 002 §Built-In Plugins): `content_policy`
//! on `before_llm_request` and `response_sanitizer` on `before_response`,
//! in-process Rust behind the same [`HookHandler`] trait as remote handlers.
//!
//! Redaction replaces each match with [`REDACTED_EMAIL`] or
//! [`REDACTED_API_KEY`] and adds one `info` notice per kind with the count
//! (`EMAIL_REDACTED`, `API_KEY_REDACTED`, `details: {"count": n}`).
//!
//! Emails match Dexto's pattern `[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`.
//! API keys match these known token shapes (see [`API_KEY_PATTERNS`]):
//!
//! | shape | pattern |
//! |---|---|
//! | OpenAI / Anthropic style secret keys | `sk-` + 20 or more of `[A-Za-z0-9_-]` (covers `sk-proj-…`, `sk-ant-…`) |
//! | AWS access key ids | `AKIA` or `ASIA` + 16 of `[0-9A-Z]` |
//! | GitHub tokens | `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_` + 36 or more alphanumerics; `github_pat_` + 22 or more of `[A-Za-z0-9_]` |
//! | Slack tokens | `xoxb-`, `xoxp-`, `xoxa-`, `xoxr-`, `xoxs-` + 10 or more of `[A-Za-z0-9-]` |
//! | Google API keys | `AIza` + 35 of `[0-9A-Za-z_-]` |
//! | bearer tokens | `Bearer` (any case), whitespace, then 20 or more of `[A-Za-z0-9._~+/-]` (and `=` padding); the word `Bearer` is kept |
//!
//! Dexto's catch-all `\b[A-Za-z0-9_-]{32,}\b` is deliberately not used: it
//! redacts content hashes, ids and base64 data that are not secrets.

use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde_json::{Map, Value, json};

use super::{HandlerResult, HookContext, HookFuture, HookHandler, HookPoint, Notice, NoticeKind};

/// What replaces a redacted email address.
pub const REDACTED_EMAIL: &str = "[REDACTED_EMAIL]";
/// What replaces a redacted API key or token.
pub const REDACTED_API_KEY: &str = "[REDACTED_API_KEY]";
/// Appended to a truncated response so the reader sees it was cut.
pub const TRUNCATION_MARKER: &str = "\n[Response truncated]";

/// The email pattern (Dexto's).
pub const EMAIL_PATTERN: &str = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}";

/// The API-key patterns, as `(shape, regex)`. The bearer pattern's first
/// group (`Bearer` and the whitespace) is kept in the output.
pub const API_KEY_PATTERNS: &[(&str, &str)] = &[
    ("secret key (sk-)", r"\bsk-[A-Za-z0-9_-]{20,}"),
    ("AWS access key id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
    (
        "GitHub fine-grained token",
        r"\bgithub_pat_[A-Za-z0-9_]{22,}",
    ),
    ("Slack token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    ("Google API key", r"\bAIza[0-9A-Za-z_-]{35}"),
    (
        "bearer token",
        r"(?i:(\bbearer\s+))[A-Za-z0-9._~+/-]{20,}=*",
    ),
];

static EMAIL: LazyLock<Regex> = LazyLock::new(|| Regex::new(EMAIL_PATTERN).expect("valid regex"));

static API_KEY: LazyLock<Regex> = LazyLock::new(|| {
    let alternation: Vec<&str> = API_KEY_PATTERNS.iter().map(|(_, re)| *re).collect();
    Regex::new(&alternation.join("|")).expect("valid regex")
});

/// Replaces every email address in `text`; returns the new text and the count.
pub fn redact_emails(text: &str) -> (String, usize) {
    let count = EMAIL.find_iter(text).count();
    if count == 0 {
        return (text.to_owned(), 0);
    }
    (EMAIL.replace_all(text, REDACTED_EMAIL).into_owned(), count)
}

/// Replaces every API key or token in `text` (see [`API_KEY_PATTERNS`]);
/// returns the new text and the count.
pub fn redact_api_keys(text: &str) -> (String, usize) {
    let mut count = 0;
    let out = API_KEY.replace_all(text, |caps: &Captures<'_>| {
        count += 1;
        match caps.get(1) {
            Some(prefix) => format!("{}{REDACTED_API_KEY}", prefix.as_str()),
            None => REDACTED_API_KEY.to_owned(),
        }
    });
    (out.into_owned(), count)
}

fn redaction_notice(code: &str, what: &str, count: usize, field: &str) -> Notice {
    let mut n = Notice::new(
        NoticeKind::Info,
        Some(code),
        format!(
            "{count} {what}{} redacted from {field}",
            if count == 1 { "" } else { "s" }
        ),
    );
    n.details = Some(json!({"count": count}));
    n
}

/// Redacts `text` as asked, collecting notices; `field` names it in messages.
fn redact(
    text: &str,
    emails: bool,
    api_keys: bool,
    field: &str,
    notices: &mut Vec<Notice>,
) -> String {
    let mut text = text.to_owned();
    if emails {
        let (t, n) = redact_emails(&text);
        if n > 0 {
            notices.push(redaction_notice(
                "EMAIL_REDACTED",
                "email address",
                n,
                field,
            ));
            text = t;
        }
    }
    if api_keys {
        let (t, n) = redact_api_keys(&text);
        if n > 0 {
            notices.push(redaction_notice("API_KEY_REDACTED", "API key", n, field));
            text = t;
        }
    }
    text
}

fn modified(field: &str, before: &str, after: String, notices: Vec<Notice>) -> HandlerResult {
    let mut result = HandlerResult {
        notices,
        ..HandlerResult::default()
    };
    if after != before {
        let mut m = Map::new();
        m.insert(field.to_owned(), Value::String(after));
        result.modify = Some(m);
    }
    result
}

/// `contentPolicy`: input checks on `before_llm_request` (payload field `text`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContentPolicy {
    /// Block inputs longer than this many characters (notice `INPUT_TOO_LONG`).
    pub max_input_chars: Option<usize>,
    /// Replace email addresses with [`REDACTED_EMAIL`].
    pub redact_emails: bool,
    /// Replace API keys and tokens with [`REDACTED_API_KEY`].
    pub redact_api_keys: bool,
}

impl ContentPolicy {
    /// The points it handles.
    pub const POINTS: [HookPoint; 1] = [HookPoint::BeforeLlmRequest];

    /// Applies the policy to one payload (no I/O).
    pub fn check(&self, payload: &Value) -> HandlerResult {
        // A payload without text (e.g. an image-only request) has nothing to check.
        let Some(text) = payload.get("text").and_then(Value::as_str) else {
            return HandlerResult::pass();
        };
        if let Some(limit) = self.max_input_chars {
            let len = text.chars().count();
            if len > limit {
                let mut r = HandlerResult::block(
                    "INPUT_TOO_LONG",
                    format!("input exceeds the {limit} character limit ({len} characters)"),
                );
                for n in &mut r.notices {
                    n.details = Some(json!({"length": len, "limit": limit}));
                }
                return r;
            }
        }
        let mut notices = Vec::new();
        let out = redact(
            text,
            self.redact_emails,
            self.redact_api_keys,
            "the input",
            &mut notices,
        );
        modified("text", text, out, notices)
    }
}

impl HookHandler for ContentPolicy {
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        _ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        let r = if point == HookPoint::BeforeLlmRequest {
            self.check(payload)
        } else {
            HandlerResult::pass()
        };
        Box::pin(async move { Ok(r) })
    }
}

/// `responseSanitizer`: output cleaning on `before_response` (payload field `content`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponseSanitizer {
    /// Replace email addresses with [`REDACTED_EMAIL`].
    pub redact_emails: bool,
    /// Replace API keys and tokens with [`REDACTED_API_KEY`].
    pub redact_api_keys: bool,
    /// Truncate longer responses to this many characters, then append
    /// [`TRUNCATION_MARKER`] (notice `RESPONSE_TRUNCATED`).
    pub max_response_length: Option<usize>,
}

impl ResponseSanitizer {
    /// The points it handles.
    pub const POINTS: [HookPoint; 1] = [HookPoint::BeforeResponse];

    /// Sanitizes one payload (no I/O). Redaction happens before truncation,
    /// so a secret cut in half is still redacted.
    pub fn sanitize(&self, payload: &Value) -> HandlerResult {
        let Some(content) = payload.get("content").and_then(Value::as_str) else {
            return HandlerResult::pass();
        };
        let mut notices = Vec::new();
        let mut out = redact(
            content,
            self.redact_emails,
            self.redact_api_keys,
            "the response",
            &mut notices,
        );
        if let Some(limit) = self.max_response_length {
            let len = out.chars().count();
            if len > limit {
                out = out.chars().take(limit).collect::<String>() + TRUNCATION_MARKER;
                let mut n = Notice::new(
                    NoticeKind::Warn,
                    Some("RESPONSE_TRUNCATED"),
                    format!("response truncated to {limit} characters (it had {len})"),
                );
                n.details = Some(json!({"length": len, "limit": limit}));
                notices.push(n);
            }
        }
        modified("content", content, out, notices)
    }
}

impl HookHandler for ResponseSanitizer {
    fn handle<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
        _ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        let r = if point == HookPoint::BeforeResponse {
            self.sanitize(payload)
        } else {
            HandlerResult::pass()
        };
        Box::pin(async move { Ok(r) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> (String, usize) {
        redact_api_keys(text)
    }

    #[test]
    fn every_api_key_shape_is_redacted() {
        let cases = [
            "sk-abcdefghijklmnopqrstuvwxyz0123",
            "sk-proj-AbCdEfGhIjKlMnOpQrStUv_-12",
            "sk-ant-api03-abcdefghijklmnopqrstu",
            "AKIAIOSFODNN7EXAMPLE",
            "ASIAIOSFODNN7EXAMPLE",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "ghs_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
            "xoxb-1234567890-abcdefghij",
            "xoxp-1234-5678-abcdefABCDEF",
            "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234",
        ];
        for key in cases {
            let (out, n) = keys(&format!("use {key} now"));
            assert_eq!(out, "use [REDACTED_API_KEY] now", "{key}");
            assert_eq!(n, 1, "{key}");
        }
        let (out, n) = keys("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc==");
        assert_eq!(out, "Authorization: Bearer [REDACTED_API_KEY]");
        assert_eq!(n, 1);
        let (out, _) = keys("bearer   abcdefghijklmnopqrstuvwxyz");
        assert_eq!(out, "bearer   [REDACTED_API_KEY]");
    }

    #[test]
    fn ordinary_text_hashes_and_short_tokens_are_kept() {
        for text in [
            "ask-me anything",
            "the mask-abcdefghijklmnopqrstuvwxyz is not a key",
            "sk-short",
            "sha256:3b9c358f36f0a31b6b2b3a7e3f6ff3c1b0a1e4d0c5f2b9a8e7d6c5b4a3f2e1d0",
            "Bearer short",
            "AKIA-not-a-key",
            "xoxb-",
        ] {
            assert_eq!(keys(text), (text.to_owned(), 0), "{text}");
        }
    }

    #[test]
    fn emails_are_counted_and_replaced() {
        let (out, n) = redact_emails("mail ana@example.com or bo.b+x@mail.co.uk, not @home");
        assert_eq!(out, "mail [REDACTED_EMAIL] or [REDACTED_EMAIL], not @home");
        assert_eq!(n, 2);
    }

    #[test]
    fn content_policy_blocks_long_input_before_redacting() {
        let p = ContentPolicy {
            max_input_chars: Some(5),
            redact_emails: true,
            redact_api_keys: true,
        };
        let r = p.check(&json!({"text": "ñññññ"}));
        assert!(
            !r.cancel,
            "5 characters (10 bytes) are within a 5-character limit"
        );
        let r = p.check(&json!({"text": "a@b.io!"}));
        assert!(r.cancel);
        assert_eq!(r.notices[0].code.as_deref(), Some("INPUT_TOO_LONG"));
        assert_eq!(r.notices[0].details, Some(json!({"length": 7, "limit": 5})));
    }

    #[test]
    fn content_policy_redacts_with_counts() {
        let p = ContentPolicy {
            max_input_chars: None,
            redact_emails: true,
            redact_api_keys: true,
        };
        let r = p.check(&json!({"text": "a@b.io c@d.io AKIAIOSFODNN7EXAMPLE", "sessionId": "s"}));
        assert_eq!(
            r.modify.unwrap()["text"],
            "[REDACTED_EMAIL] [REDACTED_EMAIL] [REDACTED_API_KEY]"
        );
        let codes: Vec<_> = r
            .notices
            .iter()
            .map(|n| (n.code.clone().unwrap(), n.details.clone().unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                ("EMAIL_REDACTED".to_owned(), json!({"count": 2})),
                ("API_KEY_REDACTED".to_owned(), json!({"count": 1}))
            ]
        );
        // Nothing to change: no modify, no notices.
        let r = p.check(&json!({"text": "hello"}));
        assert!(r.modify.is_none() && r.notices.is_empty());
        // Disabled redaction leaves the text alone.
        let r = ContentPolicy::default().check(&json!({"text": "a@b.io"}));
        assert!(r.modify.is_none());
    }

    #[test]
    fn sanitizer_redacts_then_truncates_with_a_marker() {
        let s = ResponseSanitizer {
            redact_emails: true,
            redact_api_keys: false,
            max_response_length: Some(20),
        };
        let r = s.sanitize(
            &json!({"content": "write to ana@example.com about it all", "provider": "x"}),
        );
        let content = r.modify.unwrap()["content"].as_str().unwrap().to_owned();
        assert_eq!(content, format!("write to [REDACTED_E{TRUNCATION_MARKER}"));
        let codes: Vec<_> = r.notices.iter().map(|n| n.code.clone().unwrap()).collect();
        assert_eq!(codes, ["EMAIL_REDACTED", "RESPONSE_TRUNCATED"]);
        assert_eq!(r.notices[1].kind, NoticeKind::Warn);
        let r = s.sanitize(&json!({"content": "short"}));
        assert!(r.modify.is_none() && r.notices.is_empty());
    }
}
