//! Builds the provider the `llm:` section of `plugd.yaml` names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::openai::{OpenAiOptions, OpenAiProvider};
use super::plugin::PluginProvider;
use super::scripted::ScriptedProvider;
use super::{LlmConfig, LlmError, LlmProvider};
use plugd_runtime::Runtime;

/// The provider for `config`: an OpenAI-compatible client (its API key read
/// now from the variable `api_key_env` names or the operator secret
/// `api_key_secret` names), a plugin provider of
/// `runtime` (the plugin must declare the provider; it starts on first use),
/// or a scripted provider (its file loaded and checked now). `workspace`
/// expands `${{workspace_dir}}` / `${{dexto.agent_dir}}` in a script path
/// that still carries them; the path must then be absolute. The section's
/// `stop_sequences`, `tool_choice` and `cache_tools` are applied to every
/// request ([`super::WithRequestOptions`]).
pub async fn build_provider(
    config: &LlmConfig,
    runtime: &Runtime,
    workspace: &Path,
) -> Result<Arc<dyn LlmProvider>, LlmError> {
    let options = config.request_options();
    options.check().map_err(LlmError::NotConfigured)?;
    let provider = build_bare(config, runtime, workspace).await?;
    if options.is_empty() {
        return Ok(provider);
    }
    Ok(Arc::new(super::WithRequestOptions::new(provider, options)))
}

/// The provider of `config`, without its request options.
async fn build_bare(
    config: &LlmConfig,
    runtime: &Runtime,
    workspace: &Path,
) -> Result<Arc<dyn LlmProvider>, LlmError> {
    match config {
        LlmConfig::Openai {
            base_url,
            model,
            api_key_env,
            api_key_secret,
            max_tokens,
            timeout_ms,
            ..
        } => {
            let api_key = match (api_key_env, api_key_secret) {
                (Some(_), Some(_)) => {
                    return Err(LlmError::NotConfigured(
                        "api_key_env and api_key_secret are both set; keep one".into(),
                    ));
                }
                (_, Some(name)) => Some(secret_key(runtime, name).await?),
                (env, None) => {
                    api_key("llm.api_key_env", env.as_deref()).map_err(LlmError::NotConfigured)?
                }
            };
            let mut options = OpenAiOptions::new(base_url.clone(), model.clone());
            options.api_key = api_key;
            options.max_tokens = *max_tokens;
            options.timeout = timeout_ms.map(Duration::from_millis);
            Ok(Arc::new(OpenAiProvider::new(options)?))
        }
        LlmConfig::Plugin {
            plugin,
            name,
            model,
            ..
        } => Ok(Arc::new(PluginProvider::new(runtime, plugin, name, model)?)),
        LlmConfig::Scripted { script } => {
            let path = expand(script, workspace);
            if !path.is_absolute() {
                return Err(LlmError::NotConfigured(format!(
                    "llm.script {:?} is relative; write \"${{{{workspace_dir}}}}/{}\"",
                    script.display(),
                    script.display()
                )));
            }
            Ok(Arc::new(ScriptedProvider::load(&path)?))
        }
    }
}

/// The API key stored as operator secret `name`.
async fn secret_key(runtime: &Runtime, name: &str) -> Result<String, LlmError> {
    match runtime.secret(name).await {
        Ok(Some(key)) if !key.trim().is_empty() => Ok(key.trim().to_owned()),
        Ok(_) => Err(LlmError::NotConfigured(format!(
            "api_key_secret names secret {name:?}, which is not set; run `plugd secrets set {name}` (the value is read from standard input)"
        ))),
        Err(e) => Err(LlmError::NotConfigured(e)),
    }
}

/// The API key in the variable `var` (the setting `field` names it); an
/// unset or empty variable is an error saying what to do.
pub(crate) fn api_key(field: &str, var: Option<&str>) -> Result<Option<String>, String> {
    match var {
        None => Ok(None),
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(v.trim().to_owned())),
            _ => Err(format!(
                "{field} names {var:?}, which is not set or empty; export it, or remove api_key_env for a server without keys"
            )),
        },
    }
}

/// Expands the workspace templates in `path`.
fn expand(path: &Path, workspace: &Path) -> PathBuf {
    let text = path.to_string_lossy();
    if !text.contains("${{") {
        return path.to_path_buf();
    }
    let ws = workspace.to_string_lossy();
    PathBuf::from(
        text.replace("${{workspace_dir}}", &ws)
            .replace("${{dexto.agent_dir}}", &ws),
    )
}
