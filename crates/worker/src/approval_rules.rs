//! The job's approval rules (`SpawnSessionRequest.approval_rules`, from
//! `JobSpec.approval_rules`) in the engine's terms. A rule the engine
//! cannot use (no action, or neither tool nor risk) is dropped and logged:
//! it then asks as if it were absent, which never runs more than the job
//! allowed.

use mtswarm_bus::v1;
use mtswarm_core::{ApprovalRule, Risk, RuleAction};

/// The usable rules of `rules`, in order.
pub(crate) fn engine_rules(rules: &[v1::ApprovalRule]) -> Vec<ApprovalRule> {
    rules
        .iter()
        .filter_map(|rule| {
            let action = match rule.action() {
                v1::ApprovalAction::Ask => RuleAction::Ask,
                v1::ApprovalAction::Allow => RuleAction::Allow,
                v1::ApprovalAction::Deny => RuleAction::Deny,
                v1::ApprovalAction::Unspecified => {
                    tracing::warn!(tool = %rule.tool, "approval rule without an action dropped");
                    return None;
                }
            };
            let tool = Some(rule.tool.trim().to_owned()).filter(|t| !t.is_empty());
            let risk = match rule.risk() {
                v1::RiskLevel::Low => Some(Risk::Low),
                v1::RiskLevel::Medium => Some(Risk::Medium),
                v1::RiskLevel::High => Some(Risk::High),
                v1::RiskLevel::Unspecified => None,
            };
            if tool.is_none() && risk.is_none() {
                tracing::warn!("approval rule with neither a tool nor a risk dropped");
                return None;
            }
            Some(ApprovalRule { tool, risk, action })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_rules_keep_their_order_and_unusable_ones_are_dropped() {
        let rule = |tool: &str, risk: v1::RiskLevel, action: v1::ApprovalAction| v1::ApprovalRule {
            tool: tool.into(),
            risk: risk as i32,
            action: action as i32,
        };
        let rules = engine_rules(&[
            rule(
                "benchmark",
                v1::RiskLevel::Unspecified,
                v1::ApprovalAction::Allow,
            ),
            rule("", v1::RiskLevel::Unspecified, v1::ApprovalAction::Deny),
            rule(
                "shell",
                v1::RiskLevel::Unspecified,
                v1::ApprovalAction::Unspecified,
            ),
            rule("", v1::RiskLevel::High, v1::ApprovalAction::Deny),
        ]);
        assert_eq!(
            rules,
            vec![
                ApprovalRule {
                    tool: Some("benchmark".into()),
                    risk: None,
                    action: RuleAction::Allow
                },
                ApprovalRule {
                    tool: None,
                    risk: Some(Risk::High),
                    action: RuleAction::Deny
                },
            ]
        );
    }
}
