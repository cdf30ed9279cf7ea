//! The built-in hook handlers (seed 002 §Built-In Plugins): `content_policy`
//! on `before_llm_request` and `response_sanitizer` on `before_response`,
//! in-process Rust behind the same [`HookHandler`] trait as remote handlers.
//!
//! They do what the seed's `ContentPolicyPlugin` and
//! `ResponseSanitizerPlugin` do, with the seed's texts:
//!
//! | built-in | what | result |
//! |---|---|---|
//! | content policy | input longer than `maxInputChars` | cancel, message `Input exceeds N character limit`, notice `block` `INPUT_TOO_LONG` `Input length: L, limit: N` |
//! | content policy | `redactEmails` and an email in the input | each replaced by `[EMAIL]`, notice `warn` `EMAIL_REDACTED` `Email addresses redacted from input` |
//! | content policy | `redactApiKeys` and a key in the input | each replaced by `[REDACTED]`, notice `warn` `API_KEY_REDACTED` `Potential API keys redacted from input` |
//! | response sanitizer | `redactEmails` / `redactApiKeys` | `[EMAIL]` / `[REDACTED]`, no notice (as in the seed; logged at debug) |
//! | response sanitizer | response longer than `maxResponseLength` | cut to N, `\n[Response truncated]` appended, notice `warn` `RESPONSE_TRUNCATED` `Response truncated to N characters` |
//!
//! Lengths are counted as JavaScript's `String.length` counts them (UTF-16
//! code units), and a limit of 0 is no limit (the seed tests
//! `if (this.config.maxInputChars && …)`).
//!
//! Emails match the seed's `[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}`;
//! API keys match the seed's `\b[A-Za-z0-9_-]{32,}\b` (JavaScript's ASCII word
//! boundary) and, beyond the seed, these known token shapes shorter than 32
//! characters or split by other characters (see [`API_KEY_PATTERNS`]):
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
//! The extra shapes only ever redact more than Dexto would (a secret is
//! never kept because plugd is stricter), never less.

use std::sync::LazyLock;

use regex::{Captures, Regex};
use serde_json::{Map, Value};

use plugd_runtime::config::{ContentPolicySettings, ResponseSanitizerSettings};
use plugd_runtime::hook_specs::{CONTENT_POLICY_POINTS, RESPONSE_SANITIZER_POINTS};
use plugd_runtime::hooks::{
    HandlerResult, HookContext, HookFuture, HookHandler, HookPoint, Notice, NoticeKind,
};

/// What replaces a redacted email address (the seed's token).
pub const REDACTED_EMAIL: &str = "[EMAIL]";
/// What replaces a redacted API key or token (the seed's token).
pub const REDACTED_API_KEY: &str = "[REDACTED]";
/// Appended to a truncated response so the reader sees it was cut.
pub const TRUNCATION_MARKER: &str = "\n[Response truncated]";

/// Notice code: input over `maxInputChars` (kind `block`).
pub const INPUT_TOO_LONG: &str = "INPUT_TOO_LONG";
/// Notice code: emails redacted from the input (kind `warn`).
pub const EMAIL_REDACTED: &str = "EMAIL_REDACTED";
/// Notice code: API keys redacted from the input (kind `warn`).
pub const API_KEY_REDACTED: &str = "API_KEY_REDACTED";
/// Notice code: the response was cut to `maxResponseLength` (kind `warn`).
pub const RESPONSE_TRUNCATED: &str = "RESPONSE_TRUNCATED";

/// The email pattern (the seed's).
pub const EMAIL_PATTERN: &str = r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}";

/// The seed's API-key pattern, `\b[A-Za-z0-9_-]{32,}\b` with JavaScript's
/// ASCII word boundaries.
pub const SEED_API_KEY_PATTERN: &str = r"(?-u:\b)[A-Za-z0-9_-]{32,}(?-u:\b)";

/// The known token shapes plugd redacts beyond the seed's pattern, as
/// `(shape, regex)`. The bearer pattern's first group (`Bearer` and the
/// whitespace) is kept in the output.
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
    let mut alternation: Vec<&str> = API_KEY_PATTERNS.iter().map(|(_, re)| *re).collect();
    alternation.push(SEED_API_KEY_PATTERN);
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

/// Replaces every API key or token in `text` (the seed's pattern and
/// [`API_KEY_PATTERNS`]); returns the new text and the count.
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

/// JavaScript's `String.length`: UTF-16 code units.
pub fn js_length(text: &str) -> usize {
    text.encode_utf16().count()
}

/// JavaScript's `text.slice(0, limit)`, except that a character is never
/// split in half (a surrogate pair at the cut is left out whole).
fn js_slice(text: &str, limit: usize) -> &str {
    let mut units = 0;
    for (i, c) in text.char_indices() {
        units += c.len_utf16();
        if units > limit {
            return &text[..i];
        }
    }
    text
}

/// The seed's `if (limit && …)`: unset or 0 is no limit.
fn limit(n: Option<usize>) -> Option<usize> {
    n.filter(|&n| n > 0)
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
    pub const POINTS: [HookPoint; 1] = CONTENT_POLICY_POINTS;

    /// Applies the policy to one payload (no I/O).
    pub fn check(&self, payload: &Value) -> HandlerResult {
        // A payload without text (e.g. an image-only request) has nothing to check.
        let Some(text) = payload.get("text").and_then(Value::as_str) else {
            return HandlerResult::pass();
        };
        if let Some(max) = limit(self.max_input_chars) {
            let len = js_length(text);
            if len > max {
                return HandlerResult {
                    cancel: true,
                    message: Some(format!("Input exceeds {max} character limit")),
                    notices: vec![Notice::new(
                        NoticeKind::Block,
                        Some(INPUT_TOO_LONG),
                        format!("Input length: {len}, limit: {max}"),
                    )],
                    ..HandlerResult::default()
                };
            }
        }
        let mut notices = Vec::new();
        let mut out = text.to_owned();
        if self.redact_emails {
            let (t, n) = redact_emails(&out);
            if n > 0 {
                out = t;
                notices.push(Notice::new(
                    NoticeKind::Warn,
                    Some(EMAIL_REDACTED),
                    "Email addresses redacted from input",
                ));
            }
        }
        if self.redact_api_keys {
            let (t, n) = redact_api_keys(&out);
            if n > 0 {
                out = t;
                notices.push(Notice::new(
                    NoticeKind::Warn,
                    Some(API_KEY_REDACTED),
                    "Potential API keys redacted from input",
                ));
            }
        }
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
    pub const POINTS: [HookPoint; 1] = RESPONSE_SANITIZER_POINTS;

    /// Sanitizes one payload (no I/O). Redaction happens before truncation,
    /// so a secret cut in half is still redacted.
    pub fn sanitize(&self, payload: &Value) -> HandlerResult {
        let Some(content) = payload.get("content").and_then(Value::as_str) else {
            return HandlerResult::pass();
        };
        let mut notices = Vec::new();
        let mut out = content.to_owned();
        let (mut emails, mut keys) = (0, 0);
        if self.redact_emails {
            (out, emails) = redact_emails(&out);
        }
        if self.redact_api_keys {
            (out, keys) = redact_api_keys(&out);
        }
        if emails + keys > 0 {
            // The seed adds no notice for these; the log keeps a trace.
            tracing::debug!(
                emails,
                api_keys = keys,
                "response sanitizer redacted the response"
            );
        }
        if let Some(max) = limit(self.max_response_length)
            && js_length(&out) > max
        {
            out = js_slice(&out, max).to_owned() + TRUNCATION_MARKER;
            notices.push(Notice::new(
                NoticeKind::Warn,
                Some(RESPONSE_TRUNCATED),
                format!("Response truncated to {max} characters"),
            ));
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

impl From<&ContentPolicySettings> for ContentPolicy {
    fn from(s: &ContentPolicySettings) -> ContentPolicy {
        ContentPolicy {
            max_input_chars: s.max_input_chars,
            redact_emails: s.redact_emails,
            redact_api_keys: s.redact_api_keys,
        }
    }
}

impl From<&ResponseSanitizerSettings> for ResponseSanitizer {
    fn from(s: &ResponseSanitizerSettings) -> ResponseSanitizer {
        ResponseSanitizer {
            redact_emails: s.redact_emails,
            redact_api_keys: s.redact_api_keys,
            max_response_length: s.max_response_length,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn keys(text: &str) -> (String, usize) {
        redact_api_keys(text)
    }

    fn notice(n: &Notice) -> (NoticeKind, &str, &str) {
        (n.kind, n.code.as_deref().unwrap_or(""), n.message.as_str())
    }

    fn policy(max: Option<usize>) -> ContentPolicy {
        ContentPolicy {
            max_input_chars: max,
            redact_emails: true,
            redact_api_keys: true,
        }
    }

    #[test]
    fn input_too_long_cancels_with_the_seeds_message_and_notice() {
        let r = policy(Some(5)).check(&json!({"text": "a@b.io!"}));
        assert!(r.ok && r.cancel && r.modify.is_none());
        assert_eq!(
            r.message.as_deref(),
            Some("Input exceeds 5 character limit")
        );
        assert_eq!(r.notices.len(), 1);
        assert_eq!(
            notice(&r.notices[0]),
            (
                NoticeKind::Block,
                INPUT_TOO_LONG,
                "Input length: 7, limit: 5"
            )
        );
        assert_eq!(r.notices[0].details, None);
        // Exactly at the limit passes (and is then redacted).
        let r = policy(Some(6)).check(&json!({"text": "a@b.io"}));
        assert!(!r.cancel);
    }

    #[test]
    fn lengths_are_javascript_lengths_and_zero_is_no_limit() {
        // "ñ" is one UTF-16 unit, "😀" two: JavaScript's String.length.
        assert_eq!(js_length("ñññññ"), 5);
        assert_eq!(js_length("😀😀"), 4);
        assert!(!policy(Some(5)).check(&json!({"text": "ñññññ"})).cancel);
        let r = policy(Some(3)).check(&json!({"text": "😀😀"}));
        assert_eq!(r.notices[0].message, "Input length: 4, limit: 3");
        assert!(!policy(Some(0)).check(&json!({"text": "any length"})).cancel);
        let s = ResponseSanitizer {
            max_response_length: Some(0),
            ..ResponseSanitizer::default()
        };
        assert!(
            s.sanitize(&json!({"content": "any length"}))
                .modify
                .is_none()
        );
    }

    #[test]
    fn email_redacted_uses_the_seeds_token_and_notice() {
        let r = policy(None)
            .check(&json!({"text": "mail ana@example.com or bo.b+x@mail.co.uk, not @home"}));
        assert_eq!(
            r.modify.unwrap()["text"],
            "mail [EMAIL] or [EMAIL], not @home"
        );
        assert_eq!(r.notices.len(), 1);
        assert_eq!(
            notice(&r.notices[0]),
            (
                NoticeKind::Warn,
                EMAIL_REDACTED,
                "Email addresses redacted from input"
            )
        );
        assert_eq!(r.notices[0].details, None);
    }

    #[test]
    fn api_key_redacted_uses_the_seeds_token_and_notice() {
        let r = policy(None).check(
            &json!({"text": "key abcdefghijklmnopqrstuvwxyz_0123-456 ok", "sessionId": "s"}),
        );
        assert_eq!(r.modify.unwrap()["text"], "key [REDACTED] ok");
        assert_eq!(r.notices.len(), 1);
        assert_eq!(
            notice(&r.notices[0]),
            (
                NoticeKind::Warn,
                API_KEY_REDACTED,
                "Potential API keys redacted from input"
            )
        );
        // Both kinds: one notice each, emails first, as in the seed.
        let r = policy(None).check(&json!({"text": "a@b.io AKIAIOSFODNN7EXAMPLE"}));
        assert_eq!(r.modify.unwrap()["text"], "[EMAIL] [REDACTED]");
        let codes: Vec<_> = r.notices.iter().map(|n| n.code.clone().unwrap()).collect();
        assert_eq!(codes, [EMAIL_REDACTED, API_KEY_REDACTED]);
        // Nothing to change: no modify, no notices; disabled redaction keeps it.
        let r = policy(None).check(&json!({"text": "hello"}));
        assert!(r.modify.is_none() && r.notices.is_empty());
        let r = ContentPolicy::default().check(&json!({"text": "a@b.io"}));
        assert!(r.modify.is_none() && r.notices.is_empty());
    }

    #[test]
    fn the_seeds_catch_all_redacts_32_or_more_with_ascii_word_boundaries() {
        let run = "A".repeat(32);
        assert_eq!(keys(&run), ("[REDACTED]".to_owned(), 1));
        assert_eq!(keys(&"A".repeat(31)), ("A".repeat(31), 0));
        // As in JavaScript: a hash after "sha256:" is redacted too.
        let (out, n) =
            keys("sha256:3b9c358f36f0a31b6b2b3a7e3f6ff3c1b0a1e4d0c5f2b9a8e7d6c5b4a3f2e1d0");
        assert_eq!((out.as_str(), n), ("sha256:[REDACTED]", 1));
        // A trailing '-' is outside the word boundary, as JavaScript matches.
        assert_eq!(keys(&format!("{run}- x")).0, "[REDACTED]- x");
        // Non-ASCII letters are not word characters for JavaScript's \b.
        assert_eq!(keys(&format!("é{run}é")).0, "é[REDACTED]é");
    }

    #[test]
    fn known_token_shapes_are_redacted_beyond_the_seed() {
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
            assert_eq!(out, "use [REDACTED] now", "{key}");
            assert_eq!(n, 1, "{key}");
        }
        let (out, n) = keys("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc==");
        assert_eq!(out, "Authorization: Bearer [REDACTED]");
        assert_eq!(n, 1);
        let (out, _) = keys("bearer   abcdefghijklmnopqrstuvwxyz");
        assert_eq!(out, "bearer   [REDACTED]");
    }

    #[test]
    fn ordinary_text_and_short_tokens_are_kept() {
        for text in [
            "ask-me anything",
            "the mask-abcdefghijklmnopqrst is not a key",
            "sk-short",
            "Bearer short",
            "AKIA-not-a-key",
            "xoxb-",
            "a-hyphenated-phrase-under-32 is fine",
        ] {
            assert_eq!(keys(text), (text.to_owned(), 0), "{text}");
        }
    }

    #[test]
    fn response_truncated_appends_the_seeds_marker_and_notice() {
        let s = ResponseSanitizer {
            redact_emails: true,
            redact_api_keys: false,
            max_response_length: Some(20),
        };
        let r = s.sanitize(
            &json!({"content": "write to ana@example.com about it all", "provider": "x"}),
        );
        let content = r.modify.unwrap()["content"].as_str().unwrap().to_owned();
        assert_eq!(content, "write to [EMAIL] abo\n[Response truncated]");
        assert_eq!(r.notices.len(), 1);
        assert_eq!(
            notice(&r.notices[0]),
            (
                NoticeKind::Warn,
                RESPONSE_TRUNCATED,
                "Response truncated to 20 characters"
            )
        );
        let r = s.sanitize(&json!({"content": "short"}));
        assert!(r.modify.is_none() && r.notices.is_empty());
        // A character is never split: the cut stays on a boundary.
        let s = ResponseSanitizer {
            max_response_length: Some(3),
            ..ResponseSanitizer::default()
        };
        let r = s.sanitize(&json!({"content": "a😀b😀"}));
        assert_eq!(r.modify.unwrap()["content"], "a😀\n[Response truncated]");
    }

    #[test]
    fn the_sanitizer_redacts_with_the_seeds_tokens_and_no_notices() {
        let s = ResponseSanitizer {
            redact_emails: true,
            redact_api_keys: true,
            max_response_length: None,
        };
        let r = s.sanitize(&json!({"content": "mail bo@example.org, key AKIAIOSFODNN7EXAMPLE"}));
        assert_eq!(r.modify.unwrap()["content"], "mail [EMAIL], key [REDACTED]");
        assert!(r.notices.is_empty(), "{:?}", r.notices);
    }
}
