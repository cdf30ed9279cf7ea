//! plugd.yaml's `limits:`: rate limits and quotas per identity, per tool,
//! per org, parsed and checked when plugd.yaml loads, and the step of the
//! governed path ([`crate::governed`]) that applies them to every call.
//!
//! ```yaml
//! limits:
//!   - name: per-user
//!     per: caller.subject   # caller.subject|token|org|project|role|surface, tool.name|plugin
//!     tools: ["*"]          # globs over registry tool names
//!     rate: 10/min          # N/sec|min|hour|day (N/day: a daily quota)
//! ```
//!
//! Each rule is a token bucket of capacity N refilling N per unit, keyed by
//! (rule name, the value of `per` for this call), kept in the state store
//! ([`plugd_control::store::LimitStore`]) so every node sharing the store
//! shares the counts. A call whose tool matches no rule costs nothing; one
//! that matches takes a token from each matching rule (one store round
//! trip per rule); over any of them the call is refused
//! ([`RuntimeError::RateLimited`]) before hooks, approvals or the plugin
//! see it, naming the rule with the longest wait (the time after which a
//! retry can pass them all), and the tokens the other rules gave are given
//! back, so a refused call spends nothing.
//!
//! The caller's values: `caller.subject` is the identity's name without its
//! kind (`token:ci` → `ci`, `cli:alice` → `alice`, `agent:a1` → `a1`, a Unix
//! user as is), `caller.token` the token's name when the caller is an API
//! token, `caller.org` and `caller.project` the call's tenant scope,
//! `caller.role` the identity's role where the surface knows it (HTTP
//! invoke and `/mcp`; absent on the CLI, the agent turn and bindings), and
//! `caller.surface` the door (`http`, `mcp`, `agent`, …). A value the call
//! does not have (a workspace token's org, a CLI call's token) is
//! [`ABSENT`]: all such calls share one bucket of the rule, so a rule
//! `per: caller.org` also bounds the calls made without an org.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use plugd_control::store::limits::{Bucket, MAX_CAPACITY, Take};
use plugd_governance::plugd_yaml::ConfigError;
use plugd_host::dialect::CallContext;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use crate::governed::Surface;
use crate::record_payload::CallDecision;
use crate::{Runtime, RuntimeError, ToolEntry};

/// The key of a `per` value the call does not have: one shared bucket.
pub const ABSENT: &str = "(absent)";

/// Most rules in `limits:`.
pub const MAX_RULES: usize = 64;

/// How often at most a node deletes the buckets full again (ms).
const EXPIRE_EVERY_MS: i64 = 60_000;

/// What a rule counts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Per {
    /// `caller.subject`: the identity's name without its kind.
    #[serde(rename = "caller.subject")]
    Subject,
    /// `caller.token`: the API token's name.
    #[serde(rename = "caller.token")]
    Token,
    /// `caller.org`: the call's org.
    #[serde(rename = "caller.org")]
    Org,
    /// `caller.project`: the call's project.
    #[serde(rename = "caller.project")]
    Project,
    /// `caller.role`: the caller's role.
    #[serde(rename = "caller.role")]
    Role,
    /// `caller.surface`: the door (`http`, `mcp`, `agent`, …).
    #[serde(rename = "caller.surface")]
    Surface,
    /// `tool.name`: the tool's registry name.
    #[serde(rename = "tool.name")]
    ToolName,
    /// `tool.plugin`: the plugin serving the tool.
    #[serde(rename = "tool.plugin")]
    ToolPlugin,
}

impl Per {
    /// Every field, as written in plugd.yaml.
    pub const ALL: [(&'static str, Per); 8] = [
        ("caller.subject", Per::Subject),
        ("caller.token", Per::Token),
        ("caller.org", Per::Org),
        ("caller.project", Per::Project),
        ("caller.role", Per::Role),
        ("caller.surface", Per::Surface),
        ("tool.name", Per::ToolName),
        ("tool.plugin", Per::ToolPlugin),
    ];

    fn parse(s: &str) -> Option<Per> {
        Per::ALL.iter().find(|(n, _)| *n == s).map(|(_, p)| *p)
    }

    /// This call's value, `None` when it has none.
    fn value(self, call: &Call<'_>) -> Option<String> {
        let caller = crate::invocations::caller_of(call.ctx);
        match self {
            Per::Subject => caller.map(|c| match c.split_once(':') {
                Some(("token" | "cli" | "agent", rest)) => rest.to_owned(),
                _ => c,
            }),
            Per::Token => caller.and_then(|c| c.strip_prefix("token:").map(str::to_owned)),
            Per::Org => call.ctx.org_id.clone(),
            Per::Project => call.ctx.project_id.clone(),
            Per::Role => call.ctx.caller_role.clone(),
            Per::Surface => Some(call.surface.name().to_owned()),
            Per::ToolName => Some(call.entry.name.clone()),
            Per::ToolPlugin => Some(call.entry.plugin.clone()),
        }
    }
}

/// `rate:`: N per unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rate {
    /// N: the bucket's capacity, refilled over one unit.
    pub count: u32,
    /// The unit in milliseconds (1000, 60000, 3600000 or 86400000).
    pub per_ms: u64,
}

impl Rate {
    /// Parses `N/sec|min|hour|day` (also `s`, `m`, `h`, `d`, `second`,
    /// `minute`).
    pub fn parse(s: &str) -> Result<Rate, String> {
        let how = "write N/sec, N/min, N/hour or N/day (N from 1 to 1000000), e.g. 10/min";
        let (n, unit) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a rate; {how}"))?;
        let count: u32 = n
            .trim()
            .parse()
            .ok()
            .filter(|c| (1..=MAX_CAPACITY).contains(c))
            .ok_or_else(|| format!("{s:?}: {:?} is not a count; {how}", n.trim()))?;
        let per_ms = match unit.trim() {
            "s" | "sec" | "second" => 1_000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            "d" | "day" => 86_400_000,
            u => return Err(format!("{s:?}: {u:?} is not a unit; {how}")),
        };
        Ok(Rate { count, per_ms })
    }

    /// The bucket of this rate.
    pub fn bucket(self) -> Bucket {
        Bucket {
            capacity: self.count,
            period_ms: self.per_ms,
        }
    }
}

/// One rule of `limits:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitRule {
    /// `name`: unique; buckets and refusals name it.
    pub name: String,
    /// `per`: what the rule counts by.
    pub per: Per,
    /// `tools`: globs over registry tool names (at least one).
    pub tools: Vec<String>,
    /// `rate`.
    pub rate: Rate,
    #[serde(skip)]
    globs: GlobMatcher,
}

impl LimitRule {
    /// Whether the rule counts calls of tool `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.globs.0.is_match(name)
    }
}

#[derive(Debug, Clone)]
struct GlobMatcher(globset::GlobSet);

impl Default for GlobMatcher {
    fn default() -> Self {
        GlobMatcher(globset::GlobSet::empty())
    }
}

impl PartialEq for GlobMatcher {
    fn eq(&self, _: &Self) -> bool {
        // Built from `tools`, which the rule's equality compares.
        true
    }
}

impl Eq for GlobMatcher {}

/// `limits:` of plugd.yaml: the rules, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LimitsConfig {
    /// The rules.
    pub rules: Vec<LimitRule>,
}

/// One rule as read from the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    name: Spanned<String>,
    per: Spanned<String>,
    tools: Spanned<Vec<String>>,
    rate: Spanned<String>,
}

/// Validates plugd.yaml's `limits:` (`path` names the file in errors).
pub fn parse_config(raw: Vec<Spanned<RawLimit>>, path: &Path) -> Result<LimitsConfig, ConfigError> {
    let invalid = |field: String, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    if raw.len() > MAX_RULES {
        let line = raw.get(MAX_RULES).map_or(0, |r| r.referenced.line());
        return Err(invalid(
            "limits".into(),
            line,
            format!("more than {MAX_RULES} rules; use globs in `tools`"),
        ));
    }
    let mut rules: Vec<LimitRule> = Vec::new();
    for (i, r) in raw.into_iter().enumerate() {
        let r = r.value;
        let name = r.name.value.trim().to_owned();
        let at = |field: &str| {
            if name.is_empty() {
                format!("limits[{i}].{field}")
            } else {
                format!("limits[{i}] ({name}).{field}")
            }
        };
        if name.is_empty() || name.len() > 128 || name.contains('\0') {
            return Err(invalid(
                at("name"),
                r.name.referenced.line(),
                format!(
                    "{:?} is not a rule name; name it with 1 to 128 characters, e.g. per-user",
                    r.name.value
                ),
            ));
        }
        if rules.iter().any(|o| o.name == name) {
            return Err(invalid(
                at("name"),
                r.name.referenced.line(),
                format!("{name:?} names two rules; give each rule its own name"),
            ));
        }
        let per = Per::parse(r.per.value.trim()).ok_or_else(|| {
            invalid(
                at("per"),
                r.per.referenced.line(),
                format!(
                    "{:?} is not a field to count by; use one of {}",
                    r.per.value,
                    Per::ALL.map(|(n, _)| n).join(", ")
                ),
            )
        })?;
        if r.tools.value.is_empty() {
            return Err(invalid(
                at("tools"),
                r.tools.referenced.line(),
                "no tools; list globs over tool names, e.g. [\"*\"] for every tool".into(),
            ));
        }
        let mut b = globset::GlobSetBuilder::new();
        for (j, g) in r.tools.value.iter().enumerate() {
            let glob = globset::GlobBuilder::new(g)
                .literal_separator(false)
                .build()
                .ok()
                .filter(|_| !g.trim().is_empty())
                .ok_or_else(|| {
                    invalid(
                        at(&format!("tools[{j}]")),
                        r.tools.referenced.line(),
                        format!("{g:?} is not a glob over tool names; e.g. \"acme/*\" or \"*\""),
                    )
                })?;
            b.add(glob);
        }
        let globs = b.build().map_err(|e| {
            invalid(
                at("tools"),
                r.tools.referenced.line(),
                format!("the globs do not build: {e}"),
            )
        })?;
        let rate = Rate::parse(&r.rate.value)
            .map_err(|m| invalid(at("rate"), r.rate.referenced.line(), m))?;
        rules.push(LimitRule {
            name,
            per,
            tools: r.tools.value,
            rate,
            globs: GlobMatcher(globs),
        });
    }
    Ok(LimitsConfig { rules })
}

/// The runtime's `limits:` in force and when it last expired buckets.
#[derive(Debug, Default)]
pub(crate) struct LimitsState {
    config: RwLock<Option<Arc<LimitsConfig>>>,
    last_expire_ms: AtomicI64,
}

/// What a rule's `per` reads of one call.
struct Call<'a> {
    entry: &'a ToolEntry,
    ctx: &'a CallContext,
    surface: Surface,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl CallDecision {
    /// Rule `rule` refused the call; a token comes back in `retry_after_ms`.
    pub(crate) fn limit_refused(rule: &str, retry_after_ms: u64) -> Self {
        CallDecision::Limit {
            rule: rule.to_owned(),
            decision: "refused",
            retry_after_ms,
        }
    }
}

impl Runtime {
    /// Sets plugd.yaml's `limits:` in force (serve's config gate, when the
    /// file changes: a limits change applies at once); without it, the
    /// runtime reads plugd.yaml on first use.
    pub fn set_limits_config(&self, config: LimitsConfig) {
        *self
            .inner
            .limits
            .config
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(config));
    }

    /// The `limits:` in force: the one set, else plugd.yaml's (read once; a
    /// file that does not load is read again next time and limits nothing
    /// meanwhile: the risk gate refuses every call under such a file).
    pub fn limits_config(&self) -> Arc<LimitsConfig> {
        let slot = &self.inner.limits.config;
        if let Some(c) = slot.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            return c.clone();
        }
        match crate::config::PlugdConfig::load(self.dir()) {
            Ok(c) => {
                let c = Arc::new(c.limits);
                *slot.write().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
                c
            }
            Err(_) => Arc::default(),
        }
    }

    /// The governed path's limits step (module docs): `Ok` when no rule
    /// matching `entry` is over its rate; else the refusal, with one
    /// `limit` decision per rule that refused.
    pub(crate) async fn check_limits(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        surface: Surface,
        decisions: &mut Vec<CallDecision>,
    ) -> Result<(), RuntimeError> {
        let config = self.limits_config();
        let matching: Vec<&LimitRule> = config
            .rules
            .iter()
            .filter(|r| r.matches(&entry.name))
            .collect();
        if matching.is_empty() {
            return Ok(());
        }
        let call = Call {
            entry,
            ctx,
            surface,
        };
        let store = self.state();
        let now = now_ms();
        let mut taken = Vec::new();
        let mut refused: Vec<(&str, u64)> = Vec::new();
        for rule in matching {
            let key = rule.per.value(&call).unwrap_or_else(|| ABSENT.to_owned());
            let bucket = rule.rate.bucket();
            match store.limit_take(&rule.name, &key, bucket, now).await? {
                Take::Allowed => taken.push((rule, key, bucket)),
                Take::Wait { ms } => refused.push((&rule.name, ms)),
            }
        }
        self.expire_limits(now);
        let Some(&(rule, retry_after_ms)) = refused.iter().max_by_key(|(_, ms)| *ms) else {
            return Ok(());
        };
        for (r, key, bucket) in taken {
            if let Err(e) = store.limit_refund(&r.name, &key, bucket).await {
                tracing::warn!(rule = %r.name, error = %e, "could not give a refused call's token back to its rate limit bucket");
            }
        }
        for (r, ms) in &refused {
            decisions.push(CallDecision::limit_refused(r, *ms));
        }
        Err(RuntimeError::RateLimited {
            rule: rule.to_owned(),
            retry_after_ms,
        })
    }

    /// Deletes the buckets full again, at most once a minute per node, in
    /// the background (never on the call's path).
    fn expire_limits(&self, now: i64) {
        let last = &self.inner.limits.last_expire_ms;
        let prev = last.load(Ordering::Relaxed);
        if now - prev < EXPIRE_EVERY_MS
            || last
                .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let store = self.state().clone();
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            h.spawn(async move {
                if let Err(e) = store.limit_expire(now).await {
                    tracing::debug!(error = %e, "could not expire idle rate limit buckets");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<LimitsConfig, String> {
        let raw: Vec<Spanned<RawLimit>> =
            serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        parse_config(raw, Path::new("plugd.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn plugd_yaml_and_its_schema_agree_on_limits() {
        let good = "limits:\n  - name: per-user\n    per: caller.subject\n    tools: [\"*\"]\n    rate: 10/min\n  - {name: daily, per: caller.org, tools: [\"acme/*\"], rate: 1000/day}\n";
        let c =
            crate::config::PlugdConfig::parse(good, Path::new("/w/plugd.yaml"), Path::new("/w"))
                .unwrap();
        assert_eq!(c.limits.rules.len(), 2);
        assert_eq!(c.limits.rules[1].rate.per_ms, 86_400_000);
        assert_eq!(
            crate::config::schema_violations(good).unwrap(),
            Vec::<String>::new()
        );
        for bad in [
            "limits:\n  - {name: a, per: caller.email, tools: [x], rate: 1/min}\n",
            "limits:\n  - {name: a, per: tool.name, tools: [], rate: 1/min}\n",
            "limits:\n  - {name: a, per: tool.name, tools: [x], rate: 1/week}\n",
            "limits:\n  - {name: a, per: tool.name, tools: [x], rate: 1/min, burst: 2}\n",
        ] {
            assert!(
                crate::config::PlugdConfig::parse(bad, Path::new("/w/plugd.yaml"), Path::new("/w"))
                    .is_err(),
                "{bad}"
            );
            assert!(
                !crate::config::schema_violations(bad).unwrap().is_empty(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_limits_change_is_neutral_and_applies_at_once() {
        let parse = |t: &str| {
            crate::config::PlugdConfig::parse(t, Path::new("/w/plugd.yaml"), Path::new("/w"))
                .unwrap()
        };
        let before = "limits:\n  - {name: a, per: tool.name, tools: [x], rate: 1/min}\n";
        for after in [
            "limits:\n  - {name: a, per: tool.name, tools: [x], rate: 100/min}\n",
            "",
        ] {
            let v = crate::config_gate::classify(
                &parse(before),
                &parse(after),
                Some(before),
                Some(after),
                &|_| None,
            );
            assert!(!v.held(), "{v:?}");
            assert_eq!(v.neutral, ["limits: changed"], "{v:?}");
        }
    }

    #[test]
    fn rates_parse_and_bad_ones_say_how() {
        assert_eq!(
            Rate::parse("10/min").unwrap(),
            Rate {
                count: 10,
                per_ms: 60_000
            }
        );
        assert_eq!(Rate::parse("3/hour").unwrap().per_ms, 3_600_000);
        assert_eq!(Rate::parse("1000/day").unwrap().per_ms, 86_400_000);
        assert_eq!(Rate::parse("5/sec").unwrap().per_ms, 1_000);
        for bad in ["10", "0/min", "x/min", "10/week", "-1/min", "2000000/sec"] {
            let e = Rate::parse(bad).unwrap_err();
            assert!(e.contains("N/min"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_rule_parses_and_matches_by_glob() {
        let c = parse(
            "- name: per-user\n  per: caller.subject\n  tools: [\"acme/*\"]\n  rate: 10/min\n",
        )
        .unwrap();
        let r = &c.rules[0];
        assert_eq!((r.name.as_str(), r.per), ("per-user", Per::Subject));
        assert!(r.matches("acme/jira_search"));
        assert!(!r.matches("other/jira_search"));
    }

    #[test]
    fn bad_rules_name_the_rule_and_field() {
        let cases = [
            (
                "- name: a\n  per: caller.subject\n  tools: [\"*\"]\n  rate: 10/week\n",
                "limits[0] (a).rate",
            ),
            (
                "- name: a\n  per: caller.email\n  tools: [\"*\"]\n  rate: 1/min\n",
                "limits[0] (a).per",
            ),
            (
                "- name: a\n  per: tool.name\n  tools: []\n  rate: 1/min\n",
                "limits[0] (a).tools",
            ),
            (
                "- name: a\n  per: tool.name\n  tools: [x]\n  rate: 1/min\n- name: a\n  per: tool.name\n  tools: [x]\n  rate: 1/min\n",
                "limits[1] (a).name",
            ),
            (
                "- name: a\n  per: tool.name\n  tools: [\"[\"]\n  rate: 1/min\n",
                "limits[0] (a).tools[0]",
            ),
        ];
        for (yaml, field) in cases {
            let e = parse(yaml).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        let e = parse("- name: a\n  per: tool.name\n  tools: [x]\n  rate: 1/min\n  burst: 3\n")
            .unwrap_err();
        assert!(e.contains("burst"), "{e}");
    }

    #[test]
    fn subjects_drop_the_kind_and_absent_values_are_none() {
        let def: plugd_host::model::ToolDef =
            serde_json::from_value(serde_json::json!({"name": "acme/search"})).unwrap();
        let entry = ToolEntry::new("acme", &def);
        let ctx = CallContext {
            caller: Some("token:ci".into()),
            caller_role: Some("agent".into()),
            ..CallContext::default()
        };
        let call = Call {
            entry: &entry,
            ctx: &ctx,
            surface: Surface::Http,
        };
        assert_eq!(Per::Subject.value(&call).as_deref(), Some("ci"));
        assert_eq!(Per::Token.value(&call).as_deref(), Some("ci"));
        assert_eq!(Per::Org.value(&call), None);
        assert_eq!(Per::Surface.value(&call).as_deref(), Some("http"));
        assert_eq!(Per::Role.value(&call).as_deref(), Some("agent"));
        assert_eq!(Per::ToolPlugin.value(&call).as_deref(), Some("acme"));
        let cli = CallContext {
            caller: Some("cli:alice".into()),
            ..CallContext::default()
        };
        let call = Call { ctx: &cli, ..call };
        assert_eq!(Per::Subject.value(&call).as_deref(), Some("alice"));
        assert_eq!(Per::Token.value(&call), None);
    }
}
