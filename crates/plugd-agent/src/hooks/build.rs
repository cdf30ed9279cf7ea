//! Building the [`Pipeline`] from `plugd.yaml` (the specs and their order are
//! the runtime's, [`specs`]): the built-ins, Dexto modules
//! and plugin-served handlers, fail-fast.
//!
//! Order of checks: priorities first (a clash names both handlers, before
//! any plugin starts), then each enabled custom entry in file order. A
//! handler that cannot load — unknown or broken plugin, unapproved plugin,
//! a plugin whose handshake fails, an undeclared native hook, a missing tool,
//! a dialect without a hook method, a missing or failing module — stops
//! start-up with [`PipelineError::Init`] naming it; handlers already loaded
//! are cleaned up first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plugd_host::dialect::HookStyle;
use serde_json::Value;

use plugd_runtime::Runtime;
use plugd_runtime::config::{
    Binding, CONTENT_POLICY, CustomEntry, PlugdConfig, RESPONSE_SANITIZER, Source,
};
use plugd_runtime::hook_specs::{builtin_spec, specs};
use plugd_runtime::hooks::{
    HandlerResult, HandlerSpec, HookContext, HookFuture, HookHandler, HookPoint, Pipeline,
    PipelineError,
};

use super::builtin::{ContentPolicy, ResponseSanitizer};
use super::dexto;
use super::remote::{MicroappHook, NativeHook, ToolHook, find_tool};

/// How long a hook plugin may take to start at build time.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A handler that does nothing (for the priority pre-check only).
struct Noop;
impl HookHandler for Noop {
    fn handle<'a>(&'a self, _: HookPoint, _: &'a Value, _: &'a HookContext) -> HookFuture<'a> {
        Box::pin(async { Ok(HandlerResult::pass()) })
    }
}

/// Builds the pipeline of `config` over `runtime`'s plugins (see the module
/// documentation for the checks). Plugin-served handlers are started here.
/// The pipeline is installed in `runtime` too ([`Runtime::set_hooks`]): every
/// tool call of the runtime passes its tool hooks, whatever the surface.
pub async fn build_pipeline(
    config: &PlugdConfig,
    runtime: &Runtime,
) -> Result<Pipeline, PipelineError> {
    // Priority clashes first: cheap, and nothing has started yet.
    let noop: Arc<dyn HookHandler> = Arc::new(Noop);
    Pipeline::new(
        specs(config)
            .into_iter()
            .map(|s| (s, noop.clone()))
            .collect(),
    )?;

    let mut handlers: Vec<(HandlerSpec, Arc<dyn HookHandler>)> = Vec::new();
    if let Some(cp) = config.plugins.content_policy.as_ref().filter(|b| b.enabled) {
        handlers.push((
            builtin_spec(CONTENT_POLICY, &super::builtin::ContentPolicy::POINTS, cp),
            Arc::new(ContentPolicy::from(&cp.settings)),
        ));
    }
    if let Some(rs) = config
        .plugins
        .response_sanitizer
        .as_ref()
        .filter(|b| b.enabled)
    {
        handlers.push((
            builtin_spec(
                RESPONSE_SANITIZER,
                &super::builtin::ResponseSanitizer::POINTS,
                rs,
            ),
            Arc::new(ResponseSanitizer::from(&rs.settings)),
        ));
    }
    for entry in config.plugins.custom.iter().filter(|c| c.enabled) {
        match load(entry, config, runtime).await {
            Ok(h) => handlers.push((entry_spec(entry, runtime), h)),
            Err(e) => {
                for (_, h) in &handlers {
                    h.cleanup().await;
                }
                return Err(e);
            }
        }
    }
    let registered = registered_microapp_hooks(config, runtime, &handlers).await;
    handlers.extend(registered);
    let pipeline = Pipeline::new(handlers)?;
    runtime.set_hooks(
        Arc::new(pipeline.clone()),
        config.context(&HookContext::default()),
    );
    Ok(pipeline)
}

/// The hooks approved microapps register in their `initialize` reply (seed
/// 001: "a hook the microapp registered during initialize"), as handlers.
///
/// Every approved microapp is started here (the seed launches microapps at
/// boot; a start that fails is logged and skipped). A registered name that
/// is a plugd hook point runs `hooks/<name>` at that point, after the
/// handlers `plugd.yaml` configures there (priorities above theirs, in
/// plugin id order), blocking (a `deny` vote stops the chain) with
/// `on_error: continue` (a broken microapp does not stop every turn; bind
/// the hook in `plugd.yaml` for fail-closed). A hook `plugd.yaml` already
/// binds for that plugin is not added twice; other names are logged and
/// ignored.
async fn registered_microapp_hooks(
    config: &PlugdConfig,
    runtime: &Runtime,
    configured: &[(HandlerSpec, Arc<dyn HookHandler>)],
) -> Vec<(HandlerSpec, Arc<dyn HookHandler>)> {
    let mut apps: Vec<String> = Vec::new();
    for id in runtime.microapp_ids() {
        if runtime.plugin(&id).await.is_ok_and(|i| i.approved) {
            apps.push(id);
        }
    }
    let starts = apps.iter().map(|id| async move {
        let sup = runtime.supervised(id).ok()?;
        match sup.connection(Instant::now() + START_TIMEOUT).await {
            Ok(conn) => Some((id.clone(), plugd_dialects::microapp::registered_hooks(&conn))),
            Err(e) => {
                tracing::warn!(plugin = %id, "microapp did not start, its registered hooks are not dispatched: {e}");
                None
            }
        }
    });
    let started = futures_util::future::join_all(starts).await;
    let bound = |plugin: &str, hook: &str| {
        config.plugins.custom.iter().any(|c| {
            matches!(&c.source, Source::Plugin { plugin: p, binding: Binding::Hook { hook: h, .. } } if p == plugin && h == hook)
        })
    };
    let mut next: std::collections::BTreeMap<HookPoint, i64> = std::collections::BTreeMap::new();
    for (spec, _) in configured {
        for p in &spec.points {
            let n = next.entry(*p).or_insert(spec.priority + 1);
            *n = (*n).max(spec.priority.saturating_add(1));
        }
    }
    let mut out: Vec<(HandlerSpec, Arc<dyn HookHandler>)> = Vec::new();
    for (plugin, hooks) in started.into_iter().flatten() {
        for hook in hooks {
            let Some(point) = HookPoint::ALL.into_iter().find(|p| p.name() == hook) else {
                tracing::warn!(%plugin, %hook, "microapp registered hook {hook:?}, which is not a plugd hook point (before_llm_request, before_tool_call, after_tool_result, before_response, before_message); it is never dispatched");
                continue;
            };
            if bound(&plugin, &hook) {
                continue;
            }
            let priority = next.entry(point).or_insert(0);
            let spec = HandlerSpec {
                name: format!("microapp:{plugin}:{hook}"),
                points: vec![point],
                priority: *priority,
                blocking: true,
                on_error: Some(super::OnError::Continue),
                timeout: HandlerSpec::DEFAULT_TIMEOUT,
            };
            *priority = priority.saturating_add(1);
            tracing::info!(%plugin, %hook, "microapp hook registered in initialize: dispatched at {point}");
            out.push((
                spec,
                Arc::new(MicroappHook::new(
                    runtime.clone(),
                    &plugin,
                    &hook,
                    HandlerSpec::DEFAULT_TIMEOUT,
                )),
            ));
        }
    }
    out
}

/// The environment variable of nexo §5.z that sets a native `hook.on_hook`
/// handler's deadline when plugd.yaml gives no `timeout_ms`.
pub const HOOK_TIMEOUT_ENV: &str = "NEXO_PLUGIN_HOOK_TIMEOUT_MS";

/// How `spec`'s contract serves a hook bound to it, if it can.
fn hook_style(spec: &plugd_manifest::PluginSpec) -> Option<HookStyle> {
    plugd_dialects::of(spec.dialect).capabilities().hooks
}

/// Whether `entry` is a native plugin's `hook.on_hook` handler.
fn is_native_hook(entry: &CustomEntry, runtime: &Runtime) -> bool {
    match &entry.source {
        Source::Plugin {
            plugin,
            binding: Binding::Hook { .. },
        } => runtime
            .supervised(plugin)
            .is_ok_and(|s| hook_style(s.spec()) == Some(HookStyle::OnHook)),
        _ => false,
    }
}

/// The deadline of a native hook handler: plugd.yaml's `timeout_ms` when it
/// is not the default, else `NEXO_PLUGIN_HOOK_TIMEOUT_MS` when set (a bad
/// value is logged and ignored), else 5 s.
fn native_hook_timeout(entry: &CustomEntry) -> Duration {
    if entry.timeout != HandlerSpec::DEFAULT_TIMEOUT {
        return entry.timeout;
    }
    match std::env::var(HOOK_TIMEOUT_ENV) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                tracing::warn!(
                    handler = %entry.name,
                    "{HOOK_TIMEOUT_ENV}={v:?} is not a positive number of milliseconds; using {} ms",
                    entry.timeout.as_millis()
                );
                entry.timeout
            }
        },
        Err(_) => entry.timeout,
    }
}

/// The pipeline's view of `entry`. A native `hook.on_hook` handler follows
/// nexo §5.z: a failure (transport, timeout, JSON-RPC error, malformed
/// reply, -32601) continues, unless plugd.yaml says `on_error: block`
/// (fail closed); its deadline honours `NEXO_PLUGIN_HOOK_TIMEOUT_MS`.
fn entry_spec(entry: &CustomEntry, runtime: &Runtime) -> HandlerSpec {
    let mut spec = entry.spec();
    if is_native_hook(entry, runtime) {
        spec.on_error = Some(entry.on_error.unwrap_or(super::OnError::Continue));
        spec.timeout = native_hook_timeout(entry);
    }
    spec
}

/// Dexto's `context.llmConfig` for the agent plugd.yaml's `llm:` describes:
/// `{provider, model, maxTokens, maxIterations}` (`null` without an LLM).
fn dexto_llm_config(config: &PlugdConfig) -> Value {
    use crate::llm::LlmConfig;
    let rounds = config.agent.max_tool_rounds;
    match &config.llm {
        None => Value::Null,
        Some(LlmConfig::Openai {
            model, max_tokens, ..
        }) => {
            serde_json::json!({"provider": "openai", "model": model, "maxTokens": max_tokens, "maxIterations": rounds})
        }
        Some(LlmConfig::Plugin { name, model, .. }) => {
            serde_json::json!({"provider": name, "model": model, "maxIterations": rounds})
        }
        Some(LlmConfig::Scripted { .. }) => {
            serde_json::json!({"provider": "scripted", "model": "scripted", "maxIterations": rounds})
        }
    }
}

/// What `context.agent.stateManager.getRuntimeConfig()` answers: the
/// agent's effective configuration in Dexto's names, without secrets (no
/// API key sources, provider URLs, plugin commands or environments).
pub async fn dexto_runtime_config(config: &PlugdConfig, runtime: &Runtime) -> Value {
    use serde_json::json;
    let mcp_servers: serde_json::Map<String, Value> = runtime
        .plugin_list()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.dialect == "mcp" && p.approved)
        .map(|p| (p.id, json!({"type": "stdio"})))
        .collect();
    let builtin = |priority: i64, enabled: bool, blocking: bool, settings: Value| {
        let mut v = json!({"priority": priority, "enabled": enabled, "blocking": blocking});
        if let (Some(m), Value::Object(s)) = (v.as_object_mut(), settings) {
            m.extend(s);
        }
        v
    };
    let plugins = &config.plugins;
    let content_policy = plugins.content_policy.as_ref().map(|b| {
        builtin(
            b.priority,
            b.enabled,
            b.blocking,
            json!({"maxInputChars": b.settings.max_input_chars,
                   "redactEmails": b.settings.redact_emails,
                   "redactApiKeys": b.settings.redact_api_keys}),
        )
    });
    let response_sanitizer = plugins.response_sanitizer.as_ref().map(|b| {
        builtin(
            b.priority,
            b.enabled,
            b.blocking,
            json!({"redactEmails": b.settings.redact_emails,
                   "redactApiKeys": b.settings.redact_api_keys,
                   "maxResponseLength": b.settings.max_response_length}),
        )
    });
    let custom: Vec<Value> = plugins
        .custom
        .iter()
        .map(|c| json!({"name": c.name, "priority": c.priority, "blocking": c.blocking, "enabled": c.enabled}))
        .collect();
    let t = &config.tenant;
    json!({
        "agentId": t.agent_id.clone().unwrap_or_else(|| plugd_runtime::microapp::DEFAULT_AGENT_ID.to_owned()),
        "llm": dexto_llm_config(config),
        "systemPrompt": config.agent.system_prompt,
        "skills": config.agent.skills,
        "mcpServers": mcp_servers,
        "plugins": {
            "contentPolicy": content_policy,
            "responseSanitizer": response_sanitizer,
            "custom": custom,
        },
        "tenant": {"tenantId": t.tenant_id, "userId": t.user_id, "channel": t.channel, "accountId": t.account_id},
    })
}

fn init(entry: &CustomEntry, reason: impl Into<String>) -> PipelineError {
    PipelineError::Init {
        name: entry.name.clone(),
        reason: reason.into(),
    }
}

/// Loads one Dexto module file with everything `context` offers.
async fn load_dexto(
    entry: &CustomEntry,
    module: &std::path::Path,
    module_config: &Value,
    config: &PlugdConfig,
    runtime: &Runtime,
) -> Result<Arc<dyn HookHandler>, PipelineError> {
    let options = dexto::DextoOptions {
        storage: Some(runtime.state().clone()),
        llm_config: dexto_llm_config(config),
        runtime: Some(runtime.clone()),
        runtime_config: dexto_runtime_config(config, runtime).await,
        ..dexto::DextoOptions::default()
    };
    let m = dexto::load_module(
        &entry.name,
        module,
        module_config,
        &config.workspace,
        &options,
    )
    .await?;
    Ok(m)
}

async fn load(
    entry: &CustomEntry,
    config: &PlugdConfig,
    runtime: &Runtime,
) -> Result<Arc<dyn HookHandler>, PipelineError> {
    let (plugin, binding) = match &entry.source {
        Source::Module {
            module,
            config: module_config,
        } => {
            if !module.is_file() {
                return Err(init(
                    entry,
                    format!(
                        "module {} does not exist or is not a file; fix the module path in plugd.yaml",
                        module.display()
                    ),
                ));
            }
            return load_dexto(entry, module, module_config, config, runtime).await;
        }
        Source::Package {
            package,
            config: module_config,
        } => {
            let module = super::dexto_package::parse(package)
                .and_then(|spec| super::dexto_package::resolve(&config.workspace, &spec))
                .map_err(|why| {
                    // `plugins/x.js` is a package specifier to Node too; say
                    // how to name the file when that is what was meant.
                    let hint = if config.workspace.join(package).is_file() {
                        format!("; if you meant the file, write module: \"${{{{dexto.agent_dir}}}}/{package}\"")
                    } else {
                        String::new()
                    };
                    init(entry, format!("module {package:?}: {why}{hint}"))
                })?;
            tracing::debug!(handler = %entry.name, package, module = %module.display(), "dexto package resolved");
            return load_dexto(entry, &module, module_config, config, runtime).await;
        }
        Source::Plugin { plugin, binding } => (plugin.as_str(), binding),
    };
    let sup = runtime
        .supervised(plugin)
        .map_err(|e| init(entry, e.to_string()))?;
    let info = runtime
        .plugin(plugin)
        .await
        .map_err(|e| init(entry, e.to_string()))?;
    if !info.approved {
        return Err(init(
            entry,
            format!(
                "plugin {plugin:?} is {}{}; review it and run `plugd plugin approve {plugin}`",
                info.state,
                info.error
                    .as_deref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
        ));
    }
    let spec = sup.spec().clone();
    if let Binding::Hook { hook, .. } = binding {
        match hook_style(&spec) {
            Some(HookStyle::OnHook) => {
                let declared = spec
                    .native
                    .as_ref()
                    .map(|n| n.extends.hooks.clone())
                    .unwrap_or_default();
                if !declared.iter().any(|d| d == hook) {
                    return Err(init(
                        entry,
                        format!(
                            "plugin {plugin:?} does not declare hook {hook:?} in [plugin.extends].hooks of nexo-plugin.toml (it declares: {}); declare it there or fix hook:",
                            if declared.is_empty() {
                                "none".to_owned()
                            } else {
                                declared.join(", ")
                            }
                        ),
                    ));
                }
            }
            Some(HookStyle::Vote) => {}
            None => {
                return Err(init(
                    entry,
                    format!(
                        "plugin {plugin:?} (dialect {}) has no hook method; bind one of its tools with tool: NAME and point: POINT",
                        spec.dialect
                    ),
                ));
            }
        }
    }
    // Fail fast: the plugin must start (handshake included) now.
    sup.connection(Instant::now() + START_TIMEOUT)
        .await
        .map_err(|e| init(entry, e.to_string()))?;
    let handler: Arc<dyn HookHandler> = match binding {
        Binding::Hook { hook, .. } if hook_style(&spec) == Some(HookStyle::OnHook) => Arc::new(
            NativeHook::new(runtime.clone(), plugin, hook, native_hook_timeout(entry)),
        ),
        Binding::Hook { hook, .. } => Arc::new(MicroappHook::new(
            runtime.clone(),
            plugin,
            hook,
            entry.timeout,
        )),
        Binding::Tool { tool, .. } => {
            if find_tool(runtime, plugin, tool).is_none() {
                let mut names: Vec<String> = runtime
                    .tools()
                    .iter()
                    .filter(|t| t.plugin == plugin)
                    .map(|t| t.name.clone())
                    .collect();
                names.sort();
                return Err(init(
                    entry,
                    format!(
                        "plugin {plugin:?} has no tool {tool:?} (its tools: {}); fix tool:",
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    ),
                ));
            }
            Arc::new(ToolHook::new(runtime.clone(), plugin, tool))
        }
    };
    Ok(handler)
}
