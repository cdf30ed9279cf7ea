//! Per-tool policy (issue 28): plugd.yaml's `policy:` rules in CEL, compiled
//! when plugd.yaml loads and evaluated when tools are listed and called.
//!
//! ```yaml
//! policy:
//!   - name: no-drop-for-interns
//!     when: '"interns" in caller.groups && tool.name == "db__drop"'
//!     effect: deny            # allow | deny | require_approval
//! ```
//!
//! A rule's `when` sees `caller` (`subject`, `groups`, `role`, `org`,
//! `project`, `token`), `tool` (`name`, `plugin`, `risk`, `annotations`)
//! and `args` (the call's arguments; an empty map when listing).
//!
//! * Rules run in order; the first whose `when` is true decides: `allow`
//!   allows (later rules are not looked at), `deny` hides the tool and
//!   refuses its call exactly like an unknown tool, `require_approval`
//!   makes the call wait for an operator in the risk approval queue
//!   ([`crate::risk`]) like a `high` tool. No rule matching allows: a
//!   workspace without `policy:` is governed as before.
//! * A rule whose evaluation fails (a missing field, a wrong type) does not
//!   match and is logged once per rule, naming it; a **`deny` rule that
//!   fails denies** (fail closed).
//! * When listing, `args` is empty and evaluation errors never hide a tool:
//!   a rule that needs the arguments can only refuse the call, at call time.
//!
//! The rules travel inside [`crate::risk_config::RiskConfig`] (`rules`), so
//! every place that installs the risk policy (serve's start, its config
//! gate on a live change, `plugd mcp`) installs them too.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cel::{Context, Program, Value as Cel};
use plugd_governance::plugd_yaml::ConfigError;
use plugd_host::dialect::CallContext;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value, json};
use serde_saphyr::Spanned;

use crate::record_payload::CallDecision;
use crate::risk::{self, ApprovalRequest, Approver, Decision, effective_risk};
use crate::{Runtime, RuntimeError, ToolEntry};

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Allow; later rules are not evaluated.
    Allow,
    /// Hide the tool and refuse its call like an unknown tool.
    Deny,
    /// The call waits for an operator (the risk approval queue).
    RequireApproval,
}

impl Effect {
    /// Its name in plugd.yaml and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::RequireApproval => "require_approval",
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One rule as plugd.yaml has it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    name: String,
    when: String,
    effect: Effect,
}

/// One compiled rule.
#[derive(Clone)]
pub struct Rule {
    /// Its `name`.
    pub name: String,
    /// Its `when`, as written.
    pub when: String,
    /// Its `effect`.
    pub effect: Effect,
    program: Arc<Program>,
    /// Whether an evaluation error was logged already (once per rule).
    logged: Arc<AtomicBool>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("when", &self.when)
            .field("effect", &self.effect)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Rule {
    fn eq(&self, o: &Rule) -> bool {
        self.name == o.name && self.when == o.when && self.effect == o.effect
    }
}
impl Eq for Rule {}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        json!({"name": self.name, "when": self.when, "effect": self.effect}).serialize(s)
    }
}

/// A rule that does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy rule {name:?}: {message}")]
pub struct CompileError {
    /// The rule.
    pub name: String,
    /// The CEL error (or what else is wrong).
    pub message: String,
}

impl Rule {
    /// Compiles `when` (a CEL expression).
    pub fn compile(name: &str, when: &str, effect: Effect) -> Result<Rule, CompileError> {
        let err = |message: String| CompileError {
            name: name.to_owned(),
            message,
        };
        if name.trim().is_empty() {
            return Err(err("an empty rule name; give every rule a name".into()));
        }
        // A parser panic (some invalid input in older cel-rust releases) is
        // a compile error too, never a crash of plugd.
        let compiled = std::panic::catch_unwind(|| Program::compile(when))
            .map_err(|_| err(format!("`when` does not compile as CEL ({when:?})")))?;
        let program = compiled.map_err(|e| {
            err(format!(
                "`when` does not compile as CEL ({when:?}): {}",
                one_line(&e.to_string())
            ))
        })?;
        Ok(Rule {
            name: name.to_owned(),
            when: when.to_owned(),
            effect,
            program: Arc::new(program),
            logged: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Evaluates `when` in `cx` (the call's variables); an error is
    /// `Err(message)`.
    fn eval(&self, cx: &Context<'_, '_>) -> Result<bool, String> {
        match self.program.execute(cx) {
            Ok(Cel::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("`when` gave {other:?}, not a bool")),
            Err(e) => Err(e.to_string()),
        }
    }
}

thread_local! {
    /// CEL's standard library, built once per thread: building it (and
    /// converting the variables) for every rule of every call cost ~17 µs a
    /// rule (issue 28's benchmark); a call's variables go in a child scope.
    static STDLIB: Context<'static, 'static> = Context::default();
}

/// Runs `f` with a context holding the call's variables (each converted
/// once for all rules), or the conversion's error.
fn with_vars<T>(vars: &Vars, f: impl FnOnce(Result<&Context<'_, '_>, String>) -> T) -> T {
    STDLIB.with(|root| {
        let mut cx = root.new_inner_scope();
        for (name, value) in [
            ("caller", &vars.caller),
            ("tool", &vars.tool),
            ("args", &vars.args),
        ] {
            if let Err(e) = cx.add_variable(name, value) {
                return f(Err(e.to_string()));
            }
        }
        f(Ok(&cx))
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// plugd.yaml's `policy:`, compiled; empty allows everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ToolPolicy {
    /// The rules, in order.
    pub rules: Vec<Rule>,
}

/// Parses and compiles `policy:` (a rule that does not compile refuses the
/// file, naming the rule and the CEL error).
pub fn parse_config(raw: Vec<Spanned<RawRule>>, path: &Path) -> Result<ToolPolicy, ConfigError> {
    let mut rules: Vec<Rule> = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let line = r.referenced.line();
        let RawRule { name, when, effect } = r.value;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: format!("policy[{i}]"),
            line,
            message,
        };
        if rules.iter().any(|x| x.name == name) {
            return Err(invalid(format!(
                "policy rule {name:?} is named twice; give each rule its own name"
            )));
        }
        rules.push(Rule::compile(&name, &when, effect).map_err(|e| invalid(e.to_string()))?);
    }
    Ok(ToolPolicy { rules })
}

/// Who calls, as rules see it (`caller`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PolicyCaller {
    /// Who asks: `token:NAME`, a Unix user, `cli:USER` (empty: unknown).
    pub subject: String,
    /// The caller's groups: an OAuth/OIDC identity's groups claim (HTTP
    /// and `/mcp`); empty for plugd tokens.
    pub groups: Vec<String>,
    /// The caller's role, where the surface knows it (HTTP and `/mcp`
    /// set it from the token; empty otherwise).
    pub role: String,
    /// The org the call is for (empty: none).
    pub org: String,
    /// The project the call is for (empty: none).
    pub project: String,
    /// The plugd token's name when the caller holds one (empty otherwise).
    pub token: String,
}

impl PolicyCaller {
    /// The caller named `subject` (`token:NAME` gives `token`).
    pub fn named(subject: &str) -> PolicyCaller {
        PolicyCaller {
            subject: subject.to_owned(),
            token: subject
                .strip_prefix("token:")
                .unwrap_or_default()
                .to_owned(),
            ..PolicyCaller::default()
        }
    }

    /// The caller of a call, from what its context says.
    pub fn of(ctx: &CallContext) -> PolicyCaller {
        PolicyCaller {
            org: ctx.org_id.clone().unwrap_or_default(),
            project: ctx.project_id.clone().unwrap_or_default(),
            role: ctx.caller_role.clone().unwrap_or_default(),
            groups: ctx.caller_groups.clone(),
            ..PolicyCaller::named(&crate::invocations::caller_of(ctx).unwrap_or_default())
        }
    }
}

/// The variables of one evaluation.
struct Vars {
    caller: Value,
    tool: Value,
    args: Value,
}

/// `tool` as rules see it.
pub fn tool_value(entry: &ToolEntry, policy: &crate::risk_config::RiskConfig) -> Value {
    let (risk, _) = effective_risk(entry, policy);
    let annotations = entry
        .meta
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    json!({
        "name": entry.name,
        "plugin": entry.plugin,
        "risk": risk.as_str(),
        "annotations": annotations,
    })
}

/// How one rule came out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "error")]
pub enum Outcome {
    /// `when` was true.
    Matched,
    /// `when` was false.
    NotMatched,
    /// `when` could not be evaluated.
    Error(String),
    /// An earlier rule decided.
    NotEvaluated,
}

/// The decision over one tool, with every rule's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// The rule that decided (`None`: none matched, allowed).
    pub rule: Option<String>,
    /// What was decided (`allow` when no rule matched).
    pub effect: Effect,
    /// Each rule, in order, with how it came out.
    pub rules: Vec<(String, Effect, Outcome)>,
}

/// When rules are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Listing tools: `args` is empty, errors never hide.
    List,
    /// Calling one: errors of `deny` rules deny.
    Call,
}

impl ToolPolicy {
    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Evaluates the rules in order (module docs).
    pub fn explain(
        &self,
        caller: &PolicyCaller,
        tool: Value,
        args: Option<&Value>,
        stage: Stage,
    ) -> Explanation {
        if self.rules.is_empty() {
            return Explanation {
                rule: None,
                effect: Effect::Allow,
                rules: Vec::new(),
            };
        }
        let vars = Vars {
            caller: serde_json::to_value(caller).unwrap_or(Value::Null),
            tool,
            args: match args {
                Some(a @ Value::Object(_)) => a.clone(),
                _ => Value::Object(Map::new()),
            },
        };
        with_vars(&vars, |cx| self.explain_in(cx, stage))
    }

    fn explain_in(&self, cx: Result<&Context<'_, '_>, String>, stage: Stage) -> Explanation {
        let mut decided: Option<(String, Effect)> = None;
        let mut out = Vec::with_capacity(self.rules.len());
        for rule in &self.rules {
            if decided.is_some() {
                out.push((rule.name.clone(), rule.effect, Outcome::NotEvaluated));
                continue;
            }
            let outcome = match cx
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|cx| rule.eval(cx))
            {
                Ok(true) => Outcome::Matched,
                Ok(false) => Outcome::NotMatched,
                Err(e) => Outcome::Error(e),
            };
            match &outcome {
                Outcome::Matched => decided = Some((rule.name.clone(), rule.effect)),
                // Fail closed: a deny rule that cannot be evaluated denies
                // the call (never hides at list time, where args are empty).
                Outcome::Error(_) if rule.effect == Effect::Deny && stage == Stage::Call => {
                    decided = Some((rule.name.clone(), Effect::Deny));
                }
                _ => {}
            }
            if let Outcome::Error(e) = &outcome
                && stage == Stage::Call
                && !rule.logged.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(rule = %rule.name, effect = %rule.effect, error = %e,
                    "a policy rule could not be evaluated; it counts as not matching ({}); logged once per rule",
                    if rule.effect == Effect::Deny { "a deny rule denies" } else { "it is skipped" });
            }
            out.push((rule.name.clone(), rule.effect, outcome));
        }
        let (rule, effect) = match decided {
            Some((r, e)) => (Some(r), e),
            None => (None, Effect::Allow),
        };
        Explanation {
            rule,
            effect,
            rules: out,
        }
    }

    /// Whether a listing for `caller` hides `entry`.
    pub fn hides(
        &self,
        caller: &PolicyCaller,
        entry: &ToolEntry,
        risk: &crate::risk_config::RiskConfig,
    ) -> bool {
        !self.is_empty()
            && self
                .explain(caller, tool_value(entry, risk), None, Stage::List)
                .effect
                == Effect::Deny
    }
}

impl Runtime {
    /// The tools `caller` may see: [`Runtime::tools`] less those a `deny`
    /// rule of plugd.yaml's `policy:` hides from it (an unreadable policy
    /// shows nothing: fail closed).
    pub fn tools_for(&self, caller: &PolicyCaller) -> Vec<Arc<ToolEntry>> {
        let all = self.tools();
        match self.risk_config() {
            Ok(p) if p.rules.is_empty() => all,
            Ok(p) => all
                .into_iter()
                .filter(|t| !p.rules.hides(caller, t, &p))
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read plugd.yaml's policy; listing no tools");
                Vec::new()
            }
        }
    }

    /// Whether plugd.yaml's `policy:` hides `entry` from `caller`.
    pub fn policy_hides(&self, caller: &PolicyCaller, entry: &ToolEntry) -> bool {
        match self.risk_config() {
            Ok(p) => p.rules.hides(caller, entry, &p),
            Err(_) => true,
        }
    }
}

/// The policy step of the governed path: a `deny` refuses the call as an
/// unknown tool, `require_approval` waits for an operator (after checking
/// the arguments, so nobody approves a call that cannot run). The decision
/// goes to `decisions`.
pub(crate) async fn check_call(
    rt: &Runtime,
    entry: &ToolEntry,
    args: &Value,
    ctx: &CallContext,
    approver: Option<&dyn Approver>,
    surface: crate::governed::Surface,
    decisions: &mut Vec<CallDecision>,
) -> Result<(), RuntimeError> {
    let policy = rt.risk_config()?;
    if policy.rules.is_empty() {
        return Ok(());
    }
    let caller = PolicyCaller::of(ctx);
    let ex = policy
        .rules
        .explain(&caller, tool_value(entry, &policy), Some(args), Stage::Call);
    let Some(rule) = ex.rule else {
        return Ok(());
    };
    match ex.effect {
        Effect::Allow => Ok(()),
        Effect::Deny => {
            tracing::info!(tool = %entry.name, rule = %rule, caller = %caller.subject, "call refused by policy");
            decisions.push(CallDecision::rule(rule, Effect::Deny, "refused"));
            Err(RuntimeError::UnknownTool(entry.name.clone()))
        }
        Effect::RequireApproval => {
            entry.validate(args)?;
            let (level, _) = effective_risk(entry, &policy);
            if level.needs_approval() {
                // The risk gate asks for this call anyway: once is enough.
                decisions.push(CallDecision::rule(
                    rule,
                    Effect::RequireApproval,
                    "risk_approval",
                ));
                return Ok(());
            }
            let own = rt.approver_now();
            let Some(approver) = approver.or(own.as_deref()) else {
                decisions.push(CallDecision::rule(
                    rule.clone(),
                    Effect::RequireApproval,
                    "unavailable",
                ));
                return Err(risk::GateError::NoApprover {
                    tool: entry.name.clone(),
                    plugin: entry.plugin.clone(),
                    risk: level,
                    reason: format!("policy rule {rule:?} needs an approval for this call and this runtime has no approver; call it through `plugd serve` (POST /v1/approvals/ID:approve)"),
                }
                .into());
            };
            let request = ApprovalRequest {
                tool: entry.name.clone(),
                plugin: entry.plugin.clone(),
                risk: level,
                args: args.clone(),
                agent_id: ctx.agent_id.clone(),
                session_id: ctx.session_id.clone(),
                caller: crate::invocations::caller_of(ctx),
                surface: Some(surface.name().to_owned()),
            };
            let asked_at = std::time::Instant::now();
            let decision = approver.decide(&request).await;
            let verdict = match &decision {
                Decision::Approved { .. } => "approved",
                Decision::Denied { .. } => "denied",
                Decision::TimedOut { .. } => "timed_out",
                Decision::Unavailable { .. } => "unavailable",
            };
            decisions.push(CallDecision::rule(
                rule.clone(),
                Effect::RequireApproval,
                verdict,
            ));
            decisions.push(CallDecision::approval(level, &decision, asked_at.elapsed()));
            let (tool, plugin) = (entry.name.clone(), entry.plugin.clone());
            match decision {
                Decision::Approved { .. } => Ok(()),
                Decision::Denied { by, reason } => Err(risk::GateError::Denied {
                    tool,
                    plugin,
                    risk: level,
                    by,
                    reason,
                }
                .into()),
                Decision::TimedOut { after, id } => Err(risk::GateError::TimedOut {
                    tool,
                    plugin,
                    risk: level,
                    after,
                    id,
                }
                .into()),
                Decision::Unavailable { reason } => Err(risk::GateError::NoApprover {
                    tool,
                    plugin,
                    risk: level,
                    reason,
                }
                .into()),
            }
        }
    }
}

/// How a change of `policy:` ranks for serve's config gate
/// ([`crate::config_gate`]): `(narrowing, widening)` lines. Adding `deny`
/// rules narrows, and so does adding `require_approval` rules that no
/// existing `deny` rule follows (else one could take a call a deny refused);
/// removing or changing a rule, reordering, or adding an `allow` widens.
pub fn classify(old: &ToolPolicy, new: &ToolPolicy) -> (Vec<String>, Vec<String>) {
    let (mut narrowing, mut widening) = (Vec::new(), Vec::new());
    if old == new {
        return (narrowing, widening);
    }
    // The old rules must be kept, in order, with new ones between them.
    let mut kept = old.rules.iter().peekable();
    let mut added = Vec::new();
    for rule in &new.rules {
        if kept.peek().is_some_and(|k| *k == rule) {
            kept.next();
        } else {
            let deny_after = old
                .rules
                .iter()
                .skip(old.rules.len() - kept.len())
                .any(|r| r.effect == Effect::Deny);
            added.push((rule, deny_after));
        }
    }
    if kept.len() > 0 {
        widening.push(format!(
            "policy: rules removed, changed or reordered ({}); plugd cannot tell whether that narrows, so an operator approves it",
            kept.map(|r| format!("{:?}", r.name)).collect::<Vec<_>>().join(", ")
        ));
    }
    for (rule, deny_after) in added {
        let line = format!("policy: rule {:?} ({}) added", rule.name, rule.effect);
        match rule.effect {
            Effect::Deny => narrowing.push(line),
            Effect::RequireApproval if !deny_after => narrowing.push(line),
            Effect::RequireApproval => widening.push(format!(
                "{line} before a deny rule, which it may take calls from"
            )),
            Effect::Allow => widening.push(line),
        }
    }
    (narrowing, widening)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rules: &[(&str, &str, Effect)]) -> ToolPolicy {
        ToolPolicy {
            rules: rules
                .iter()
                .map(|(n, w, e)| Rule::compile(n, w, *e).unwrap())
                .collect(),
        }
    }

    fn tool(name: &str) -> Value {
        json!({"name": name, "plugin": "db", "risk": "medium", "annotations": {}})
    }

    fn intern() -> PolicyCaller {
        PolicyCaller {
            groups: vec!["interns".into()],
            ..PolicyCaller::named("token:intern")
        }
    }

    #[test]
    fn groups_decide_and_the_first_match_wins() {
        let p = policy(&[
            ("let-admins", "caller.role == \"admin\"", Effect::Allow),
            (
                "no-drop-for-interns",
                "\"interns\" in caller.groups && tool.name == \"db__drop\"",
                Effect::Deny,
            ),
            (
                "all-drops-approved",
                "tool.name == \"db__drop\"",
                Effect::RequireApproval,
            ),
        ]);
        let ex = p.explain(&intern(), tool("db__drop"), None, Stage::Call);
        assert_eq!(ex.rule.as_deref(), Some("no-drop-for-interns"));
        assert_eq!(ex.effect, Effect::Deny);
        assert_eq!(ex.rules[0].2, Outcome::NotMatched);
        assert_eq!(ex.rules[2].2, Outcome::NotEvaluated);
        // An admin is allowed by the first rule; later rules do not run.
        let admin = PolicyCaller {
            role: "admin".into(),
            ..intern()
        };
        let ex = p.explain(&admin, tool("db__drop"), None, Stage::Call);
        assert_eq!(
            (ex.rule.as_deref(), ex.effect),
            (Some("let-admins"), Effect::Allow)
        );
        // Someone else reaches the third rule.
        let ex = p.explain(
            &PolicyCaller::named("token:ops"),
            tool("db__drop"),
            None,
            Stage::Call,
        );
        assert_eq!(ex.effect, Effect::RequireApproval);
        // Nothing matches: allowed.
        let ex = p.explain(&intern(), tool("db__query"), None, Stage::Call);
        assert_eq!((ex.rule, ex.effect), (None, Effect::Allow));
    }

    #[test]
    fn a_deny_rule_that_errors_denies_at_call_time_and_others_are_skipped() {
        let p = policy(&[
            ("broken-allow", "caller.nope == 1", Effect::Allow),
            (
                "broken-deny",
                "args.path.startsWith(\"/etc\")",
                Effect::Deny,
            ),
        ]);
        // args without `path`: the allow rule errors (skipped), the deny
        // rule errors (denies).
        let ex = p.explain(&intern(), tool("fs__read"), Some(&json!({})), Stage::Call);
        assert!(matches!(ex.rules[0].2, Outcome::Error(_)), "{ex:?}");
        assert!(matches!(ex.rules[1].2, Outcome::Error(_)), "{ex:?}");
        assert_eq!(
            (ex.rule.as_deref(), ex.effect),
            (Some("broken-deny"), Effect::Deny)
        );
        // With the field it is evaluated normally.
        let ex = p.explain(
            &intern(),
            tool("fs__read"),
            Some(&json!({"path": "/tmp"})),
            Stage::Call,
        );
        assert_eq!((ex.rule, ex.effect), (None, Effect::Allow));
    }

    #[test]
    fn a_rule_on_args_hides_nothing_at_list_time_but_refuses_the_call() {
        let p = policy(&[("no-etc", "args.path.startsWith(\"/etc\")", Effect::Deny)]);
        let ex = p.explain(&intern(), tool("fs__read"), None, Stage::List);
        assert_eq!(ex.effect, Effect::Allow);
        let ex = p.explain(
            &intern(),
            tool("fs__read"),
            Some(&json!({"path": "/etc/x"})),
            Stage::Call,
        );
        assert_eq!(ex.effect, Effect::Deny);
        let ex = p.explain(
            &intern(),
            tool("fs__read"),
            Some(&json!({"path": "/tmp/x"})),
            Stage::Call,
        );
        assert_eq!(ex.effect, Effect::Allow);
        // A rule on the caller alone hides at list time too.
        let p = policy(&[("interns-out", "caller.token == \"intern\"", Effect::Deny)]);
        assert_eq!(
            p.explain(&intern(), tool("x"), None, Stage::List).effect,
            Effect::Deny
        );
        assert_eq!(
            p.explain(
                &PolicyCaller::named("token:ops"),
                tool("x"),
                None,
                Stage::List
            )
            .effect,
            Effect::Allow
        );
    }

    #[test]
    fn adding_denials_narrows_and_anything_else_widens() {
        let deny = ("d", "tool.name == \"x\"", Effect::Deny);
        let appr = ("a", "tool.name == \"y\"", Effect::RequireApproval);
        let allow = ("ok", "true", Effect::Allow);
        let (n, w) = classify(&policy(&[]), &policy(&[deny, appr]));
        assert_eq!((n.len(), w.len()), (2, 0), "{n:?} {w:?}");
        let (n, w) = classify(&policy(&[deny]), &policy(&[deny, appr]));
        assert_eq!((n.len(), w.len()), (1, 0), "{n:?} {w:?}");
        // An approval before an existing deny may take its calls.
        let (_, w) = classify(&policy(&[deny]), &policy(&[appr, deny]));
        assert_eq!(w.len(), 1, "{w:?}");
        let (_, w) = classify(&policy(&[deny]), &policy(&[allow, deny]));
        assert_eq!(w.len(), 1, "{w:?}");
        let (_, w) = classify(&policy(&[deny, appr]), &policy(&[appr]));
        assert!(w[0].contains("\"d\""), "{w:?}");
        let changed = ("d", "tool.name == \"z\"", Effect::Deny);
        let (_, w) = classify(&policy(&[deny]), &policy(&[changed]));
        assert!(!w.is_empty());
        assert_eq!(
            classify(&policy(&[deny]), &policy(&[deny])),
            (vec![], vec![])
        );
    }

    #[test]
    fn plugd_yaml_policy_parses_matches_the_schema_and_names_a_bad_rule() {
        use crate::config::{PlugdConfig, schema_violations};
        let parse = |t: &str| PlugdConfig::parse(t, Path::new("/ws/plugd.yaml"), Path::new("/ws"));
        let text = "policy:\n  - name: no-drop-for-interns\n    when: '\"interns\" in caller.groups && tool.name == \"db__drop\"'\n    effect: deny\n  - name: etc\n    when: 'args.path.startsWith(\"/etc\")'\n    effect: require_approval\n";
        let c = parse(text).unwrap();
        let names: Vec<_> = c
            .risk
            .rules
            .rules
            .iter()
            .map(|r| (r.name.as_str(), r.effect))
            .collect();
        assert_eq!(
            names,
            [
                ("no-drop-for-interns", Effect::Deny),
                ("etc", Effect::RequireApproval)
            ]
        );
        assert_eq!(schema_violations(text).unwrap(), Vec::<String>::new());
        let bad = "policy:\n  - name: ok\n    when: 'true'\n    effect: allow\n  - name: broken\n    when: 'tool.name =='\n    effect: deny\n";
        let e = parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("policy[1]") && e.contains("policy rule \"broken\"") && e.contains("line 5"),
            "{e}"
        );
        let e = parse("policy:\n  - {name: a, when: 'true', effect: maybe}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("maybe"), "{e}");
        assert!(
            !schema_violations("policy:\n  - {name: a, when: 'true', effect: maybe}\n")
                .unwrap()
                .is_empty()
        );
        let e = parse("policy:\n  - {name: a, when: 'true', effect: deny}\n  - {name: a, when: 'false', effect: deny}\n").unwrap_err().to_string();
        assert!(e.contains("named twice"), "{e}");
    }

    #[test]
    fn a_rule_that_does_not_compile_is_named() {
        let e = Rule::compile("bad-one", "caller.token ==", Effect::Deny).unwrap_err();
        assert_eq!(e.name, "bad-one");
        assert!(e.to_string().contains("\"bad-one\""), "{e}");
        assert!(e.to_string().contains("does not compile as CEL"), "{e}");
    }

    #[test]
    fn the_caller_comes_from_the_call_context() {
        let ctx = CallContext {
            caller: Some("token:intern".into()),
            org_id: Some("acme".into()),
            caller_role: Some("agent".into()),
            ..CallContext::default()
        };
        let c = PolicyCaller::of(&ctx);
        assert_eq!((c.token.as_str(), c.org.as_str()), ("intern", "acme"));
        assert_eq!(c.role, "agent");
        assert!(c.groups.is_empty());
        assert_eq!(PolicyCaller::named("alice").token, "");
    }
}
