//! `plugd.yaml`'s `risk:` section: the risk levels, where a tool's level
//! comes from, the operator's per-tool levels and the approval timeout,
//! parsed and checked when plugd.yaml loads. The gate that applies them to
//! every tool call is [`crate::risk`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use plugd_governance::plugd_yaml::ConfigError;

/// How long a call waits for an operator without `risk.approval_timeout_secs`.
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 120;

/// Longest `risk.approval_timeout_secs` (one day).
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 86_400;

/// A tool's risk level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RiskLevel {
    /// Runs.
    Low,
    /// Runs, with a notice.
    Medium,
    /// Needs an approval per call; `--yes` pre-approves.
    High,
    /// Needs an approval per call; never pre-approved.
    Critical,
}

impl RiskLevel {
    /// Every level, lowest first.
    pub const ALL: [RiskLevel; 4] = [
        RiskLevel::Low,
        RiskLevel::Medium,
        RiskLevel::High,
        RiskLevel::Critical,
    ];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            RiskLevel::Low => "low",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
            RiskLevel::Critical => "critical",
        }
    }

    /// The level called `s`.
    pub fn parse(s: &str) -> Option<RiskLevel> {
        RiskLevel::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// Whether each call needs an approval.
    pub fn needs_approval(self) -> bool {
        self >= RiskLevel::High
    }
}

impl fmt::Display for RiskLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a tool's effective risk comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RiskSource {
    /// `risk.tools` in plugd.yaml.
    Config,
    /// The plugin's manifest (Salmex `risk_level`).
    Declared,
    /// The tool's MCP annotations (`readOnlyHint`, `destructiveHint`), see
    /// [`annotation_risk`].
    Annotations,
    /// Nothing says: `medium`.
    Default,
}

/// `risk:` of plugd.yaml.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RiskConfig {
    /// `tools`: a risk level per tool name (registry name), overriding what
    /// the plugin declares.
    pub tools: BTreeMap<String, RiskLevel>,
    /// `approval_timeout_secs`: how long a call waits for an operator
    /// through the HTTP API before it is denied (default 120).
    pub approval_timeout: Duration,
    /// plugd.yaml's `policy:` (a top-level section, not `risk:`'s): the
    /// per-tool rules, carried here so that whatever installs the risk
    /// policy installs them too ([`crate::tool_policy`]).
    pub rules: crate::tool_policy::ToolPolicy,
}

impl Default for RiskConfig {
    fn default() -> Self {
        RiskConfig {
            tools: BTreeMap::new(),
            approval_timeout: Duration::from_secs(DEFAULT_APPROVAL_TIMEOUT_SECS),
            rules: crate::tool_policy::ToolPolicy::default(),
        }
    }
}

/// `risk:` as read from the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRisk {
    #[serde(default)]
    tools: Option<BTreeMap<String, Spanned<String>>>,
    #[serde(default)]
    approval_timeout_secs: Option<Spanned<u64>>,
}

/// Validates plugd.yaml's `risk:` section (`path` names the file in errors).
pub fn parse_config(raw: Spanned<RawRisk>, path: &Path) -> Result<RiskConfig, ConfigError> {
    let invalid = |field: String, line: u64, message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        line,
        message,
    };
    let mut config = RiskConfig::default();
    for (tool, level) in raw.value.tools.unwrap_or_default() {
        let line = level.referenced.line();
        if tool.trim().is_empty() {
            return Err(invalid(
                "risk.tools".into(),
                line,
                "an empty tool name; use the names `plugd tool list` shows".into(),
            ));
        }
        let parsed = RiskLevel::parse(&level.value).ok_or_else(|| {
            invalid(
                format!("risk.tools.{tool}"),
                line,
                format!(
                    "{:?} is not a risk level; use low, medium, high or critical",
                    level.value
                ),
            )
        })?;
        config.tools.insert(tool, parsed);
    }
    if let Some(secs) = raw.value.approval_timeout_secs {
        if secs.value == 0 || secs.value > MAX_APPROVAL_TIMEOUT_SECS {
            return Err(invalid(
                "risk.approval_timeout_secs".into(),
                secs.referenced.line(),
                format!(
                    "{} is out of range; use 1 to {MAX_APPROVAL_TIMEOUT_SECS} seconds (default {DEFAULT_APPROVAL_TIMEOUT_SECS})",
                    secs.value
                ),
            ));
        }
        config.approval_timeout = Duration::from_secs(secs.value);
    }
    Ok(config)
}
