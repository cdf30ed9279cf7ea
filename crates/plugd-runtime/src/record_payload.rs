//! What an invocation record keeps of its call beyond its columns, in its
//! `payload`: the error of a call that did not succeed, the decisions taken
//! on the governed path, and, when plugd.yaml's `records.keep_bodies`
//! is on, the arguments and the result.
//!
//! ```json
//! {"error": {"code": "blocked_by_hook", "message": "…"},
//!  "decisions": [{"kind": "hook", "point": "before_tool_call", "decision": "blocked",
//!                 "hook": "no-rm", "reason": "…"},
//!                {"kind": "approval", "risk": "high", "decision": "approved",
//!                 "decided_by": "token:ops", "waited_ms": 5400},
//!                {"kind": "policy", "rule": "tool_disabled", "decision": "refused"},
//!                {"kind": "limit", "rule": "per-user", "decision": "refused",
//!                 "retry_after_ms": 6000}],
//!  "args": {…}, "result": {…}}
//! ```
//!
//! Every member is left out when there is nothing to say; a successful call
//! with no decision and bodies off has no payload at all. Secret values the
//! runtime knows at that point (the settings of the plugins it launched,
//! the secrets a binding resolved for the call) are masked as `***` in
//! every string of the payload; in the bodies, the value of an object key
//! that looks secret ([`secret_key`]) is `***` whatever it was. The error
//! message is cut at [`MAX_ERROR_MESSAGE`] bytes; a body larger than
//! [`MAX_BODY`] bytes of JSON becomes `{"truncated": true, "bytes": N,
//! "preview": "<its first MAX_BODY bytes of JSON>"}`.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::hooks::HookPoint;
use crate::risk::{Decision, RiskLevel};

/// What a masked secret reads as.
pub const MASK: &str = "***";

/// Longest error message a record keeps, in bytes.
pub const MAX_ERROR_MESSAGE: usize = 2 * 1024;

/// Largest body (arguments, result) a record keeps, in bytes of JSON.
pub const MAX_BODY: usize = 16 * 1024;

/// Parts of object keys whose values are masked in bodies (compared
/// lower-case, `-` read as `_`).
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "authorization",
    "cookie",
    "private_key",
];

/// One decision taken on a call's governed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum CallDecision {
    /// A tool hook blocked the call or changed what passed.
    Hook {
        /// `before_tool_call` or `after_tool_result`.
        point: &'static str,
        /// `blocked`, `modified_args` or `modified_result`.
        decision: &'static str,
        /// The handler that blocked (a change names none: the chain's
        /// handlers merge theirs).
        #[serde(skip_serializing_if = "Option::is_none")]
        hook: Option<String>,
        /// Why it blocked.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A person (or the approver standing in for one) was asked about a
    /// `high` or `critical` call.
    Approval {
        /// The tool's effective risk.
        risk: RiskLevel,
        /// `approved`, `denied`, `timed_out` or `unavailable` (nobody
        /// could be asked).
        decision: &'static str,
        /// Who decided (`timeout` for a timeout).
        #[serde(skip_serializing_if = "Option::is_none")]
        decided_by: Option<String>,
        /// Why (a denial's reason, why nobody could be asked).
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The approval record, when the answer names it.
        #[serde(skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
        /// How long the call waited for the answer.
        waited_ms: u64,
    },
    /// A `limits:` rule of plugd.yaml refused the call (over its rate).
    Limit {
        /// The rule's name.
        rule: String,
        /// `refused`.
        decision: &'static str,
        /// Milliseconds until the rule's bucket has a token again.
        retry_after_ms: u64,
    },
    /// The runtime's policy refused the call before anyone was asked.
    Policy {
        /// `tool_disabled`, `risk_policy_unreadable`, or the name of a
        /// plugd.yaml `policy:` rule.
        rule: std::borrow::Cow<'static, str>,
        /// A `policy:` rule's effect (`deny`, `require_approval`); absent
        /// for the runtime's own rules.
        #[serde(skip_serializing_if = "Option::is_none")]
        effect: Option<&'static str>,
        /// `refused`; for `require_approval`: `approved`, `denied`,
        /// `timed_out`, `unavailable` or `risk_approval` (the tool's risk
        /// asks anyway).
        decision: &'static str,
    },
}

impl CallDecision {
    /// A hook's block at `point`.
    pub(crate) fn hook_blocked(point: HookPoint, hook: Option<String>, reason: &str) -> Self {
        CallDecision::Hook {
            point: point.name(),
            decision: "blocked",
            hook,
            reason: Some(reason.to_owned()),
        }
    }

    /// The hooks of `point` changed the arguments or the result.
    pub(crate) fn hook_modified(point: HookPoint) -> Self {
        CallDecision::Hook {
            point: point.name(),
            decision: match point {
                HookPoint::AfterToolResult => "modified_result",
                _ => "modified_args",
            },
            hook: None,
            reason: None,
        }
    }

    /// The answer of an approver about a `risk` call, after `waited`.
    pub(crate) fn approval(risk: RiskLevel, decision: &Decision, waited: Duration) -> Self {
        let (verdict, by, reason, id) = match decision {
            Decision::Approved { by } => ("approved", Some(by.clone()), None, None),
            Decision::Denied { by, reason } => {
                ("denied", Some(by.clone()), Some(reason.clone()), None)
            }
            Decision::TimedOut { id, .. } => {
                ("timed_out", Some("timeout".to_owned()), None, id.clone())
            }
            Decision::Unavailable { reason } => ("unavailable", None, Some(reason.clone()), None),
        };
        CallDecision::Approval {
            risk,
            decision: verdict,
            decided_by: by,
            reason,
            approval_id: id,
            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// The policy refused the call by `rule`.
    pub(crate) fn policy_refused(rule: &'static str) -> Self {
        CallDecision::Policy {
            rule: rule.into(),
            effect: None,
            decision: "refused",
        }
    }

    /// What a plugd.yaml `policy:` rule decided.
    pub(crate) fn rule(
        name: String,
        effect: crate::tool_policy::Effect,
        decision: &'static str,
    ) -> Self {
        CallDecision::Policy {
            rule: name.into(),
            effect: Some(effect.as_str()),
            decision,
        }
    }
}

/// The bodies a record keeps when `records.keep_bodies` is on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bodies<'a> {
    /// The arguments as the tool got them (or would have).
    pub(crate) args: &'a Value,
    /// The result as the caller got it, when the call succeeded.
    pub(crate) result: Option<&'a Value>,
}

/// The payload of a record: `error` (code and message) when the call did
/// not succeed, its `decisions`, and the `bodies` when kept; `secrets` are
/// masked everywhere. `None` when there is nothing to keep.
pub(crate) fn build(
    error: Option<(&str, &str)>,
    decisions: &[CallDecision],
    bodies: Option<Bodies<'_>>,
    secrets: &[String],
) -> Option<Value> {
    let mut payload = Map::new();
    if let Some((code, message)) = error {
        let message = mask_text(message, secrets);
        payload.insert(
            "error".into(),
            json!({"code": code, "message": cut(&message, MAX_ERROR_MESSAGE)}),
        );
    }
    if !decisions.is_empty() {
        let mut list = serde_json::to_value(decisions).unwrap_or(Value::Null);
        mask_values(&mut list, secrets);
        payload.insert("decisions".into(), list);
    }
    if let Some(b) = bodies {
        payload.insert("args".into(), body(b.args, secrets));
        if let Some(r) = b.result {
            payload.insert("result".into(), body(r, secrets));
        }
    }
    (!payload.is_empty()).then_some(Value::Object(payload))
}

/// `v` as a record keeps it: secret keys and values masked, cut at
/// [`MAX_BODY`].
fn body(v: &Value, secrets: &[String]) -> Value {
    let mut v = v.clone();
    mask_keys(&mut v);
    mask_values(&mut v, secrets);
    let text = v.to_string();
    if text.len() <= MAX_BODY {
        return v;
    }
    json!({"truncated": true, "bytes": text.len(), "preview": cut_at(&text, MAX_BODY)})
}

/// Whether an object key names a secret: it contains one of
/// password, passwd, secret, token, api_key, apikey, authorization,
/// cookie, private_key (case-insensitive, `-` as `_`).
pub fn secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase().replace('-', "_");
    SECRET_KEYS.iter().any(|s| k.contains(s))
}

/// Every value under a secret-looking key, at any depth, becomes `***`.
fn mask_keys(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for (k, x) in o.iter_mut() {
                if secret_key(k) {
                    *x = Value::String(MASK.into());
                } else {
                    mask_keys(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(mask_keys),
        _ => {}
    }
}

/// Every string of `v` (keys too) with the `secrets` (and delegation
/// tokens) in it masked.
fn mask_values(v: &mut Value, secrets: &[String]) {
    match v {
        Value::String(s) if leaks(s, secrets) => *s = mask_text(s, secrets),
        Value::Array(a) => a.iter_mut().for_each(|x| mask_values(x, secrets)),
        Value::Object(o) => {
            if o.keys().any(|k| leaks(k, secrets)) {
                let old = std::mem::take(o);
                for (k, mut x) in old {
                    mask_values(&mut x, secrets);
                    o.insert(mask_text(&k, secrets), x);
                }
            } else {
                o.values_mut().for_each(|x| mask_values(x, secrets));
            }
        }
        _ => {}
    }
}

/// Whether `text` holds one of `secrets` or a delegation token.
fn leaks(text: &str, secrets: &[String]) -> bool {
    text.contains("vai_dlg_")
        || secrets
            .iter()
            .any(|s| !s.is_empty() && text.contains(s.as_str()))
}

/// `text` with every non-empty secret (and delegation token) replaced by `***`, longest first (a
/// secret that contains another is hidden whole).
fn mask_text(text: &str, secrets: &[String]) -> String {
    plugd_host::launch::scrub_as(text, secrets, MASK)
}

/// `text` cut to at most `max` bytes (at a character boundary), with `…`
/// when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    format!("{}…", cut_at(text, max))
}

fn cut_at(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Vec<String> {
        vec!["sk-live-1234".to_owned(), String::new()]
    }

    #[test]
    fn a_successful_call_without_decisions_or_bodies_keeps_nothing() {
        assert_eq!(build(None, &[], None, &secrets()), None);
    }

    #[test]
    fn the_error_is_masked_and_cut() {
        let long = format!("key sk-live-1234 refused {}", "é".repeat(3000));
        let p = build(Some(("tool_failed", &long)), &[], None, &secrets()).unwrap();
        let m = p["error"]["message"].as_str().unwrap();
        assert_eq!(p["error"]["code"], "tool_failed");
        assert!(m.starts_with("key *** refused"), "{m}");
        assert!(m.ends_with('…') && m.len() <= MAX_ERROR_MESSAGE + '…'.len_utf8());
        assert!(p.get("args").is_none() && p.get("decisions").is_none());
    }

    #[test]
    fn bodies_mask_secret_keys_and_values_and_are_cut() {
        let args = json!({
            "user": "ada",
            "Password": "hunter2",
            "nested": [{"X-Api-Key": 42, "note": "use sk-live-1234 here"}],
            "max": 3,
        });
        let result = json!({"content": [{"type": "text", "text": "token=sk-live-1234"}]});
        let p = build(
            None,
            &[],
            Some(Bodies {
                args: &args,
                result: Some(&result),
            }),
            &secrets(),
        )
        .unwrap();
        assert_eq!(
            p["args"],
            json!({
                "user": "ada",
                "Password": "***",
                "nested": [{"X-Api-Key": "***", "note": "use *** here"}],
                "max": 3,
            })
        );
        assert_eq!(p["result"]["content"][0]["text"], "token=***");
        let big = json!({"blob": "x".repeat(MAX_BODY * 2)});
        let p = build(
            None,
            &[],
            Some(Bodies {
                args: &big,
                result: None,
            }),
            &[],
        )
        .unwrap();
        assert_eq!(p["args"]["truncated"], true);
        assert_eq!(p["args"]["preview"].as_str().unwrap().len(), MAX_BODY);
        assert!(p["args"]["bytes"].as_u64().unwrap() > MAX_BODY as u64);
        assert!(p.get("result").is_none());
    }

    #[test]
    fn secret_keys_are_matched_by_part_and_case() {
        for k in [
            "password",
            "DB_PASSWD",
            "client_secret",
            "accessToken",
            "api-key",
            "APIKEY",
            "Authorization",
            "set_cookie",
            "ssh_private_key",
        ] {
            assert!(secret_key(k), "{k}");
        }
        for k in ["user", "name", "path", "key", "pass"] {
            assert!(!secret_key(k), "{k}");
        }
    }

    #[test]
    fn decisions_serialize_with_their_kind() {
        let d = [
            CallDecision::hook_blocked(
                HookPoint::BeforeToolCall,
                Some("guard".into()),
                "no sk-live-1234",
            ),
            CallDecision::approval(
                RiskLevel::High,
                &Decision::Denied {
                    by: "token:ops".into(),
                    reason: "not today".into(),
                },
                Duration::from_millis(1500),
            ),
            CallDecision::policy_refused("tool_disabled"),
        ];
        let p = build(Some(("refused", "x")), &d, None, &secrets()).unwrap();
        assert_eq!(
            p["decisions"],
            json!([
                {"kind": "hook", "point": "before_tool_call", "decision": "blocked",
                 "hook": "guard", "reason": "no ***"},
                {"kind": "approval", "risk": "high", "decision": "denied",
                 "decided_by": "token:ops", "reason": "not today", "waited_ms": 1500},
                {"kind": "policy", "rule": "tool_disabled", "decision": "refused"},
            ])
        );
    }
}
