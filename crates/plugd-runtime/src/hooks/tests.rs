//! Pipeline rules: order, uniqueness, blocking, modification, error policy.

use super::*;
use serde_json::json;

/// A handler defined by a closure over (payload) -> result.
struct FnHandler<F>(F);

impl<F> HookHandler for FnHandler<F>
where
    F: Fn(&Value) -> Result<HandlerResult, HookError> + Send + Sync + 'static,
{
    fn handle<'a>(
        &'a self,
        _point: HookPoint,
        payload: &'a Value,
        _ctx: &'a HookContext,
    ) -> HookFuture<'a> {
        let r = (self.0)(payload);
        Box::pin(async move { r })
    }
}

/// A handler that never answers.
struct Hang;
impl HookHandler for Hang {
    fn handle<'a>(&'a self, _: HookPoint, _: &'a Value, _: &'a HookContext) -> HookFuture<'a> {
        Box::pin(std::future::pending())
    }
}

fn spec(name: &str, priority: i64, blocking: bool) -> HandlerSpec {
    HandlerSpec {
        name: name.into(),
        points: vec![HookPoint::BeforeToolCall],
        priority,
        blocking,
        on_error: None,
        timeout: Duration::from_millis(200),
    }
}

fn h<F>(f: F) -> Arc<dyn HookHandler>
where
    F: Fn(&Value) -> Result<HandlerResult, HookError> + Send + Sync + 'static,
{
    Arc::new(FnHandler(f))
}

fn append(tag: &'static str) -> Arc<dyn HookHandler> {
    h(move |p| {
        let seen = p["trail"].as_str().unwrap_or("").to_owned();
        let mut m = Map::new();
        m.insert("trail".into(), json!(format!("{seen}{tag}")));
        Ok(HandlerResult::modify(m))
    })
}

#[tokio::test]
async fn modifications_pass_through_in_priority_order() {
    // Registered out of order on purpose.
    let p = Pipeline::new(vec![
        (spec("c", 300, true), append("c")),
        (spec("a", 10, true), append("a")),
        (spec("b", 100, false), append("b")),
    ])
    .unwrap();
    assert_eq!(p.chain(HookPoint::BeforeToolCall), ["a", "b", "c"]);
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({"toolName": "x"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(out.payload, json!({"toolName": "x", "trail": "abc"}));
}

#[test]
fn a_priority_clash_names_both_handlers() {
    let err = Pipeline::new(vec![
        (spec("auth", 10, true), append("a")),
        (spec("audit", 10, false), append("b")),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("\"auth\"") && err.contains("\"audit\"") && err.contains("priority 10"),
        "{err}"
    );
}

#[tokio::test]
async fn a_blocking_cancel_stops_the_chain_and_a_non_blocking_one_does_not() {
    let deny = || h(|_| Ok(HandlerResult::block("DENIED", "tool not allowed")));
    let p = Pipeline::new(vec![
        (spec("gate", 10, true), deny()),
        (spec("after", 20, true), append("z")),
    ])
    .unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert!(out.is_blocked());
    assert_eq!(out.message.as_deref(), Some("tool not allowed"));
    assert_eq!(
        out.payload.get("trail"),
        None,
        "nothing after the blocking handler ran"
    );
    assert_eq!(out.notices[0].code.as_deref(), Some("DENIED"));
    assert_eq!(out.notices[0].handler.as_deref(), Some("gate"));

    let p = Pipeline::new(vec![
        (spec("advisor", 10, false), deny()),
        (spec("after", 20, true), append("z")),
    ])
    .unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(out.payload["trail"], "z");
    assert!(
        out.notices
            .iter()
            .any(|n| n.code.as_deref() == Some("NON_BLOCKING_CANCEL"))
    );
}

#[tokio::test]
async fn a_timing_out_blocking_handler_blocks_and_a_non_blocking_one_is_skipped() {
    let p = Pipeline::new(vec![
        (spec("slow-guard", 10, true), Arc::new(Hang)),
        (spec("after", 20, true), append("z")),
    ])
    .unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert!(out.is_blocked());
    assert_eq!(out.notices[0].code.as_deref(), Some("HOOK_TIMEOUT"));
    assert!(out.message.unwrap().contains("\"slow-guard\""));

    let p = Pipeline::new(vec![
        (spec("slow-audit", 10, false), Arc::new(Hang)),
        (spec("after", 20, true), append("z")),
    ])
    .unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(out.payload["trail"], "z");
    assert_eq!(out.notices[0].kind, NoticeKind::Warn);
}

#[tokio::test]
async fn on_error_overrides_the_default_policy() {
    let failing = || h(|_| Err(HookError::Failed("backend down".into())));
    let mut lenient = spec("lenient-guard", 10, true);
    lenient.on_error = Some(OnError::Continue);
    let mut strict = spec("strict-audit", 20, false);
    strict.on_error = Some(OnError::Block);
    let p = Pipeline::new(vec![(lenient, failing()), (strict, failing())]).unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert!(
        out.is_blocked(),
        "the strict non-blocking handler fails closed"
    );
    assert!(out.message.unwrap().contains("strict-audit"));
    assert_eq!(out.notices.len(), 2);
}

#[tokio::test]
async fn ok_false_is_a_failure_under_the_policy() {
    let p = Pipeline::new(vec![(
        spec("broken", 10, true),
        h(|_| {
            Ok(HandlerResult {
                ok: false,
                message: Some("quota store unreachable".into()),
                ..HandlerResult::default()
            })
        }),
    )])
    .unwrap();
    let out = p
        .run(
            HookPoint::BeforeToolCall,
            json!({}),
            &HookContext::default(),
        )
        .await;
    assert!(out.is_blocked());
    assert!(out.message.unwrap().contains("quota store unreachable"));
}

#[tokio::test]
async fn points_without_handlers_continue_unchanged() {
    let p = Pipeline::new(vec![(spec("a", 1, true), append("a"))]).unwrap();
    let out = p
        .run(
            HookPoint::BeforeResponse,
            json!({"content": "hi"}),
            &HookContext::default(),
        )
        .await;
    assert_eq!(out.outcome, OutcomeKind::Continue);
    assert_eq!(out.payload, json!({"content": "hi"}));
}

#[test]
fn point_names_round_trip() {
    for p in HookPoint::ALL {
        assert_eq!(HookPoint::parse(p.name()), Some(p));
        assert_eq!(serde_json::to_value(p).unwrap(), json!(p.name()));
    }
    assert_eq!(HookPoint::parse("beforeToolCall"), None);
}
