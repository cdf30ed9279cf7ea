//! The handler specs of `plugd.yaml`'s `plugins:` section, in the order the
//! pipeline runs them (built-ins first, then custom entries in file order).
//! Building the handlers themselves (starting plugins, loading Dexto
//! modules) is plugd-agent's (`plugd_agent::hooks::build`), reached from
//! here through [`crate::agent_seam::AgentParts::build_pipeline`].

use crate::config::{BuiltinConfig, CONTENT_POLICY, CustomEntry, PlugdConfig, RESPONSE_SANITIZER};
use crate::hooks::{HandlerSpec, HookPoint};

/// The points the built-in `contentPolicy` handler runs at.
pub const CONTENT_POLICY_POINTS: [HookPoint; 1] = [HookPoint::BeforeLlmRequest];
/// The points the built-in `responseSanitizer` handler runs at.
pub const RESPONSE_SANITIZER_POINTS: [HookPoint; 1] = [HookPoint::BeforeResponse];

/// The spec of a built-in handler `name` at `points` with its plugd.yaml settings.
pub fn builtin_spec<T>(name: &str, points: &[HookPoint], b: &BuiltinConfig<T>) -> HandlerSpec {
    HandlerSpec {
        name: name.to_owned(),
        points: points.to_vec(),
        priority: b.priority,
        blocking: b.blocking,
        on_error: None,
        timeout: HandlerSpec::DEFAULT_TIMEOUT,
    }
}

/// The enabled handlers' specs, built-ins first, then custom entries in file order.
pub fn specs(config: &PlugdConfig) -> Vec<HandlerSpec> {
    let mut out = Vec::new();
    if let Some(cp) = config.plugins.content_policy.as_ref().filter(|b| b.enabled) {
        out.push(builtin_spec(CONTENT_POLICY, &CONTENT_POLICY_POINTS, cp));
    }
    if let Some(rs) = config
        .plugins
        .response_sanitizer
        .as_ref()
        .filter(|b| b.enabled)
    {
        out.push(builtin_spec(
            RESPONSE_SANITIZER,
            &RESPONSE_SANITIZER_POINTS,
            rs,
        ));
    }
    out.extend(
        config
            .plugins
            .custom
            .iter()
            .filter(|c| c.enabled)
            .map(CustomEntry::spec),
    );
    out
}
