//! `mtswarm submit`: submits a job and, with `--watch`, follows it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Args;
use mtswarm_proto::v1;
use serde_json::json;

use super::output::print_json;
use crate::common::{LeaderArgs, rpc_error};
use crate::watch::{WatchOptions, watch_job};

/// Arguments of `mtswarm submit`: the job's spec, budgets and policy, and
/// whether to follow it.
#[derive(Debug, Args)]
pub struct SubmitCmd {
    /// What to achieve; `@path` names a file of the kernel directory to attach.
    pub goal: String,
    /// Kernel directory, relative to the leader's kernel root.
    #[arg(long = "kernel", short = 'k', env = "MTSWARM_KERNEL")]
    pub kernel: PathBuf,
    /// Slices the job may use, e.g. "backend=emulator,cores>=8" (empty = any).
    #[arg(long, short = 's', env = "MTSWARM_SELECTOR", default_value = "")]
    pub selector: String,
    /// Number of worker agents (0 = the leader decides).
    #[arg(
        long = "agents",
        short = 'n',
        env = "MTSWARM_AGENTS",
        default_value_t = 0
    )]
    pub agents: u32,
    /// Maximum ReAct steps per loop (0 = server default).
    #[arg(long, env = "MTSWARM_MAX_STEPS", default_value_t = 0)]
    pub max_steps: u32,
    /// Maximum model tokens (0 = unlimited).
    #[arg(long, env = "MTSWARM_MAX_TOKENS", default_value_t = 0)]
    pub max_tokens: u64,
    /// Maximum board time in seconds (0 = unlimited).
    #[arg(long, env = "MTSWARM_DEVICE_SECONDS", default_value_t = 0.0)]
    pub device_seconds: f64,
    /// Maximum wall time of the job in seconds (0 = server default).
    #[arg(long, env = "MTSWARM_WALL_TIME", default_value_t = 0)]
    pub wall_time: u64,
    /// Maximum candidate evaluations on hardware over the whole job,
    /// shared by its agents (0 = a tenth of the tuning space, at least 32).
    #[arg(long, env = "MTSWARM_MAX_EVALUATIONS", default_value_t = 0)]
    pub max_evaluations: u32,
    /// OpenAI-compatible model for the agents (absent = the daemons'
    /// model, else builtin policies; `--model` is the same flag).
    #[arg(long, visible_alias = "model", env = "MTSWARM_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// Base URL of that model's endpoint (absent = the daemons' own; the
    /// daemons accept only their allowlist, `--model-endpoint`).
    #[arg(long, alias = "model-url", env = "MTSWARM_LLM_URL")]
    pub llm_url: Option<String>,
    /// Run medium-risk tools (benchmarks, edits) without asking for approval.
    #[arg(long, env = "MTSWARM_AUTO_APPROVE")]
    pub auto_approve: bool,
    /// An approval rule, `TOOL=ACTION` or `risk:LEVEL=ACTION` (ACTION: ask,
    /// allow or deny; LEVEL: low, medium or high), e.g. `benchmark=allow`.
    /// Repeatable; tool rules win over risk rules; high-risk calls always ask.
    #[arg(
        long = "approval-rule",
        env = "MTSWARM_APPROVAL_RULES",
        value_delimiter = ',',
        value_parser = parse_approval_rule
    )]
    pub approval_rules: Vec<v1::ApprovalRule>,
    /// Enable the `shell` tool (every call still needs approval).
    #[arg(long, env = "MTSWARM_ALLOW_SHELL")]
    pub allow_shell: bool,
    /// A retried submit with the same key returns the same job.
    #[arg(long, env = "MTSWARM_IDEMPOTENCY_KEY", default_value = "")]
    pub idempotency_key: String,
    /// Follow the job's progress after submitting (like `mtswarm watch`).
    #[arg(long, short = 'w', env = "MTSWARM_WATCH")]
    pub watch: bool,
    /// Never ask about approvals while watching.
    #[arg(long, env = "MTSWARM_NO_PROMPT")]
    pub no_prompt: bool,
    /// JSON output (with --watch: one JSON object per event).
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// With --watch off a terminal, print every agent event too.
    #[arg(long, env = "MTSWARM_WATCH_EVENTS")]
    pub events: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// `mtswarm submit GOAL`: submits the job and prints its id; with
/// `--watch` follows it and exits as `mtswarm watch` does.
pub(crate) async fn submit(cmd: SubmitCmd) -> anyhow::Result<ExitCode> {
    if !cmd.device_seconds.is_finite() || cmd.device_seconds < 0.0 {
        bail!("--device-seconds must be a non-negative number");
    }
    let kernel_dir = cmd
        .kernel
        .to_str()
        .context("--kernel must be valid UTF-8")?
        .to_string();
    let model = match (&cmd.llm_model, &cmd.llm_url) {
        (None, None) => None,
        (None, Some(_)) => {
            bail!("--llm-url (MTSWARM_LLM_URL) needs --llm-model (MTSWARM_LLM_MODEL)")
        }
        (Some(model), url) => Some(v1::ModelSettings {
            base_url: url.clone().unwrap_or_default(),
            model: model.clone(),
            temperature: None,
            max_output_tokens: 0,
        }),
    };
    let spec = v1::JobSpec {
        goal: cmd.goal.clone(),
        kernel_dir,
        slice_selector: cmd.selector.clone(),
        budgets: Some(v1::Budgets {
            max_steps: cmd.max_steps,
            max_tokens: cmd.max_tokens,
            device_seconds: cmd.device_seconds,
            wall_time_seconds: cmd.wall_time,
            max_evaluations: cmd.max_evaluations,
        }),
        num_agents: cmd.agents,
        model,
        auto_approve: cmd.auto_approve,
        allow_shell: cmd.allow_shell,
        approval_rules: cmd.approval_rules.clone(),
    };
    let span = tracing::info_span!("mtswarm.submit", kernel = %cmd.kernel.display());
    let _entered = span.enter();
    let mut control = cmd.leader.connect().await?;
    let response = control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: cmd.idempotency_key.clone(),
        })
        .await
        .map_err(|status| rpc_error("submitting the job", &cmd.leader.url(), status))?
        .into_inner();
    if cmd.json && !cmd.watch {
        print_json(&json!({ "job_id": response.job_id, "trace_id": response.trace_id }));
    } else if !cmd.json && response.trace_id.is_empty() {
        println!("submitted job {}", response.job_id);
    } else if !cmd.json {
        println!(
            "submitted job {} (trace {})",
            response.job_id, response.trace_id
        );
    }
    if !cmd.watch {
        return Ok(ExitCode::SUCCESS);
    }
    watch_job(
        &mut control,
        &cmd.leader.url(),
        &response.job_id,
        WatchOptions {
            from_sequence: 0,
            json: cmd.json,
            events: cmd.events,
            prompt: !cmd.no_prompt,
        },
    )
    .await
}

/// Parses `TOOL=ACTION` or `risk:LEVEL=ACTION` (`--approval-rule`).
fn parse_approval_rule(text: &str) -> Result<v1::ApprovalRule, String> {
    let (subject, action) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected TOOL=ACTION or risk:LEVEL=ACTION"))?;
    let action = match action.trim().to_ascii_lowercase().as_str() {
        "ask" => v1::ApprovalAction::Ask,
        "allow" | "approve" => v1::ApprovalAction::Allow,
        "deny" => v1::ApprovalAction::Deny,
        other => return Err(format!("{other:?}: the action is ask, allow or deny")),
    };
    let subject = subject.trim();
    let (tool, risk) = match subject.strip_prefix("risk:") {
        Some(level) => {
            let risk = match level.trim().to_ascii_lowercase().as_str() {
                "low" => v1::RiskLevel::Low,
                "medium" => v1::RiskLevel::Medium,
                "high" => v1::RiskLevel::High,
                other => return Err(format!("{other:?}: the risk is low, medium or high")),
            };
            (String::new(), risk)
        }
        None if subject.is_empty() => return Err(format!("{text:?}: no tool named")),
        None => (subject.to_string(), v1::RiskLevel::Unspecified),
    };
    Ok(v1::ApprovalRule {
        tool,
        risk: risk as i32,
        action: action as i32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_rules_parse_by_tool_and_by_risk() {
        let rule = parse_approval_rule("benchmark=allow").expect("tool rule");
        assert_eq!(rule.tool, "benchmark");
        assert_eq!(rule.action(), v1::ApprovalAction::Allow);
        let rule = parse_approval_rule("risk:Medium=ask").expect("risk rule");
        assert!(rule.tool.is_empty());
        assert_eq!(rule.risk(), v1::RiskLevel::Medium);
        assert_eq!(rule.action(), v1::ApprovalAction::Ask);
        for bad in ["benchmark", "benchmark=maybe", "risk:huge=deny", "=allow"] {
            assert!(parse_approval_rule(bad).is_err(), "{bad}");
        }
    }
}
