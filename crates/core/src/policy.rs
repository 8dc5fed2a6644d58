//! Which calls need a human: the risk of each tool (a default table of the
//! project's tools, per-tool overrides, and the tool's own declaration as the
//! fallback), the job's rules by tool and by risk, and how much of the
//! remaining risk the job auto-approves.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::tool::Risk;

/// One call waiting for a human decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The call's id; decisions name it.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The validated arguments.
    pub arguments: serde_json::Value,
    /// The call's risk as the policy judged it.
    pub risk: Risk,
    /// The step the call was made in.
    pub step: u32,
}

/// How much risk is approved without asking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoApprove {
    /// Every call needs a decision.
    Never,
    /// Low-risk calls run; medium and high ask.
    #[default]
    LowOnly,
    /// Only high-risk calls ask.
    UpToMedium,
    /// Nothing asks.
    All,
}

impl AutoApprove {
    /// Whether a call of `risk` runs without asking.
    pub fn approves(self, risk: Risk) -> bool {
        match self {
            Self::Never => false,
            Self::LowOnly => risk == Risk::Low,
            Self::UpToMedium => risk <= Risk::Medium,
            Self::All => true,
        }
    }
}

/// A human's (or the timeout's) decision on one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Let the call run.
    Approve,
    /// Refuse it; the model is told why.
    Deny {
        /// Why, for the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// What the permission check concluded for one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "permission", rename_all = "snake_case")]
pub enum Permission {
    /// Run without asking.
    Allow,
    /// Pause for a human decision.
    Ask,
    /// Refuse; the model is told why.
    Deny {
        /// Why, for the model.
        reason: String,
    },
}

/// What a job's rule does with the calls it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Pause for a human decision.
    Ask,
    /// Run without asking.
    Allow,
    /// Refuse; the model is told the job's policy denies the tool.
    Deny,
}

/// One rule of a job's approval policy: by tool (whatever its risk), or by
/// risk (every tool of that risk). Tool rules win over risk rules; within
/// each kind the first matching rule applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRule {
    /// The tool the rule is about; `None` = a rule by risk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The risk a rule without a tool matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<Risk>,
    /// Ask, allow or deny.
    pub action: RuleAction,
}

/// The job's risk overrides and rules and the auto-approval mode.
///
/// A tool's risk is the one it declares ([`crate::ToolSpec::risk`], next to
/// its name, schema and effects); there is no second table to drift from
/// it. An override judges a tool differently for one job.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RiskPolicy {
    /// Per-job overrides of declared risks.
    #[serde(default)]
    pub overrides: HashMap<String, Risk>,
    /// How much risk runs without asking.
    #[serde(default)]
    pub auto_approve: AutoApprove,
    /// The job's rules, consulted before `auto_approve`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<ApprovalRule>,
}

impl RiskPolicy {
    /// The risk of calling `tool`, given what the tool declares.
    pub fn risk_of(&self, tool: &str, declared: Risk) -> Risk {
        self.overrides.get(tool).copied().unwrap_or(declared)
    }

    /// Judge `tool` as `risk`, whatever it declares.
    pub fn with_override(mut self, tool: impl Into<String>, risk: Risk) -> Self {
        self.overrides.insert(tool.into(), risk);
        self
    }

    /// Set how much risk runs without asking.
    pub fn with_auto_approve(mut self, mode: AutoApprove) -> Self {
        self.auto_approve = mode;
        self
    }

    /// Consult `rules` (the job's approval policy) before the auto-approval mode.
    pub fn with_rules(mut self, rules: Vec<ApprovalRule>) -> Self {
        self.rules = rules;
        self
    }

    /// The auto-approval mode's verdict on a call of `risk`, rules aside.
    pub fn permission(&self, risk: Risk) -> Permission {
        if self.auto_approve.approves(risk) {
            Permission::Allow
        } else {
            Permission::Ask
        }
    }

    /// The policy's own verdict on calling `tool` at `risk` (middlewares may
    /// still change it): the first rule naming the tool, else the first rule
    /// of its risk, else the auto-approval mode. No rule lets a high-risk
    /// call run unasked: `allow` asks there.
    pub fn permission_for(&self, tool: &str, risk: Risk) -> Permission {
        let by_tool = self
            .rules
            .iter()
            .find(|rule| rule.tool.as_deref() == Some(tool));
        let by_risk = || {
            self.rules
                .iter()
                .find(|rule| rule.tool.is_none() && rule.risk == Some(risk))
        };
        match by_tool.or_else(by_risk).map(|rule| rule.action) {
            Some(RuleAction::Allow) if risk == Risk::High => Permission::Ask,
            Some(RuleAction::Allow) => Permission::Allow,
            Some(RuleAction::Ask) => Permission::Ask,
            Some(RuleAction::Deny) => Permission::Deny {
                reason: format!("the job's approval policy denies `{tool}`"),
            },
            None => self.permission(risk),
        }
    }
}

/// How long a paused loop waits for decisions, and what happens then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalConfig {
    /// How long a paused call waits for a decision.
    pub timeout: Duration,
    /// Applied to every undecided call when the timeout passes.
    pub on_timeout: ApprovalDecision,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(600),
            on_timeout: ApprovalDecision::Deny {
                reason: Some("approval timed out".to_owned()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(tool: Option<&str>, risk: Option<Risk>, action: RuleAction) -> ApprovalRule {
        ApprovalRule {
            tool: tool.map(str::to_owned),
            risk,
            action,
        }
    }

    #[test]
    fn tool_rules_win_over_risk_rules_and_both_over_auto_approval() {
        let policy = RiskPolicy::default()
            .with_auto_approve(AutoApprove::LowOnly)
            .with_rules(vec![
                rule(None, Some(Risk::Medium), RuleAction::Deny),
                rule(Some("benchmark"), None, RuleAction::Allow),
                rule(Some("compile"), None, RuleAction::Ask),
            ]);
        assert_eq!(
            policy.permission_for("benchmark", Risk::Medium),
            Permission::Allow
        );
        assert!(matches!(
            policy.permission_for("validate", Risk::Medium),
            Permission::Deny { reason } if reason.contains("`validate`")
        ));
        assert_eq!(policy.permission_for("compile", Risk::Low), Permission::Ask);
        // No rule: the auto-approval mode decides.
        assert_eq!(
            policy.permission_for("read_file", Risk::Low),
            Permission::Allow
        );
        assert_eq!(policy.permission_for("shell", Risk::High), Permission::Ask);
        // A high-risk call asks even when a rule allows it.
        let lenient = RiskPolicy::default().with_rules(vec![
            rule(Some("shell"), None, RuleAction::Allow),
            rule(None, Some(Risk::High), RuleAction::Allow),
        ]);
        assert_eq!(lenient.permission_for("shell", Risk::High), Permission::Ask);
        assert_eq!(
            lenient.permission_for("reset_slice", Risk::High),
            Permission::Ask
        );
    }
}
