//! The risk gate's questions put to the MCP client's user: an
//! `elicitation/create` asking to approve one call.

use std::time::Duration;

use plugd_runtime::risk::{ApprovalRequest, Approver, Decision, DecisionFuture};
use serde_json::{Value, json};

use crate::{Session, Sink};

/// Approves a `high` (or, for an admin caller, `critical`) call by asking
/// the client's user through elicitation.
pub(crate) struct ElicitApprover {
    pub(crate) session: Session,
    pub(crate) sink: Sink,
    pub(crate) timeout: Duration,
    pub(crate) version: &'static str,
}

impl Approver for ElicitApprover {
    fn decide<'a>(&'a self, request: &'a ApprovalRequest) -> DecisionFuture<'a> {
        Box::pin(async move {
            let by = format!("{} (MCP client user)", self.session.caller().name);
            let message = format!(
                "plugd: approve this {} call?\ntool: {}\nplugin: {}\narguments: {}",
                request.risk,
                request.tool,
                request.plugin,
                request.args_preview()
            );
            let mut params = json!({
                "message": message,
                "requestedSchema": {
                    "type": "object",
                    "properties": {
                        "approve": {
                            "type": "boolean",
                            "title": "Approve",
                            "description": format!("Run {} with these arguments", request.tool),
                            "default": false,
                        }
                    },
                    "required": ["approve"],
                },
            });
            if plugd_mcp::version::at_least(self.version, "2025-11-25") {
                params["mode"] = json!("form");
            }
            match self
                .session
                .ask_client(&self.sink, "elicitation/create", params, self.timeout)
                .await
            {
                Ok(answer) => decision(&answer, by),
                Err(reason) => Decision::Denied {
                    by: "plugd".into(),
                    reason: format!("approval through the MCP client failed: {reason}"),
                },
            }
        })
    }
}

fn decision(answer: &Value, by: String) -> Decision {
    let action = answer.get("action").and_then(Value::as_str).unwrap_or("");
    let approved = answer
        .get("content")
        .and_then(|c| c.get("approve"))
        .and_then(Value::as_bool)
        == Some(true);
    match action {
        "accept" if approved => Decision::Approved { by },
        "accept" => Decision::Denied {
            by,
            reason: "the user did not tick approve".into(),
        },
        "decline" => Decision::Denied {
            by,
            reason: "the user declined".into(),
        },
        "cancel" => Decision::Denied {
            by,
            reason: "the user dismissed the question".into(),
        },
        other => Decision::Denied {
            by: "plugd".into(),
            reason: format!("the client answered with unknown action {other:?}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_accept_with_approve_true_approves() {
        let d = |v: Value| decision(&v, "u".into());
        assert!(matches!(
            d(json!({"action": "accept", "content": {"approve": true}})),
            Decision::Approved { .. }
        ));
        for v in [
            json!({"action": "accept", "content": {"approve": false}}),
            json!({"action": "accept", "content": {"approve": "true"}}),
            json!({"action": "accept"}),
            json!({"action": "decline"}),
            json!({"action": "cancel"}),
            json!({"action": "ACCEPT", "content": {"approve": true}}),
            json!(null),
        ] {
            assert!(matches!(d(v.clone()), Decision::Denied { .. }), "{v}");
        }
    }
}
