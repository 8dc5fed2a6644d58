//! `mtswarm approvals` (pending approval requests) and `mtswarm approve` /
//! `mtswarm deny`.

use std::process::ExitCode;

use clap::Args;
use mtswarm_proto::v1;

use super::output::{Listing, print_json};
use crate::common::{LeaderArgs, OperatorAction, rpc_error};
use crate::decision::{Scope, decide_approval};
use crate::render;

/// Arguments of `mtswarm approvals`: which approval requests to list.
#[derive(Debug, Args)]
pub struct ApprovalsCmd {
    /// Only approvals of this job.
    #[arg(long, env = "MTSWARM_JOB")]
    pub job: Option<String>,
    /// Decided approvals too (default: pending only).
    #[arg(long, env = "MTSWARM_ALL_APPROVALS")]
    pub all: bool,
    /// JSON output.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// Arguments of `mtswarm approve` and `mtswarm deny`: one approval and why.
/// With `--json` it prints the decided approval record.
#[derive(Debug, Args)]
pub struct DecideCmd {
    /// The approval id (see `mtswarm approvals`).
    pub approval_id: String,
    /// How far the decision reaches: this call, every later call of the
    /// same tool in the job, or by the same agent (not for high-risk tools).
    #[arg(long, value_enum, env = "MTSWARM_APPROVAL_SCOPE", default_value_t = Scope::Call)]
    pub scope: Scope,
    #[command(flatten)]
    pub action: OperatorAction,
}

/// `mtswarm approvals`: prints the pending (or, with `--all`, every)
/// approval request as a table or JSON. Exit 0 on any answer of the leader.
pub(crate) async fn approvals(cmd: ApprovalsCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let states = if cmd.all {
        Vec::new()
    } else {
        vec![v1::ApprovalState::Pending as i32]
    };
    let list = control
        .list_approvals(v1::ListApprovalsRequest {
            job_id: cmd.job.clone().unwrap_or_default(),
            states,
        })
        .await
        .map_err(|status| rpc_error("listing approvals", &cmd.leader.url(), status))?
        .into_inner();
    let listing = Listing {
        items: &list.approvals,
        json_key: "approvals",
        entry: &render::approval,
        empty: if cmd.all {
            "no approvals"
        } else {
            "no pending approvals"
        },
        header: format!(
            "{:<38} {:<10} {:<7} {:<14} WHAT",
            "APPROVAL", "STATE", "RISK", "AGENT"
        ),
        row: &|record| {
            let value = render::approval(record);
            let what = if record.verification_error.is_empty() {
                record
                    .request
                    .as_ref()
                    .map(|r| render::truncate(&render::what_it_does(r), 100))
                    .unwrap_or_default()
            } else {
                // What the record claims is not believed: say why instead.
                render::truncate(
                    &format!("failed verification: {}", record.verification_error),
                    100,
                )
            };
            format!(
                "{:<38} {:<10} {:<7} {:<14} {what}",
                render::compact(&value["approval_id"], 38),
                render::compact(&value["state"], 10),
                render::compact(&value["risk"], 7),
                render::compact(&value["agent_id"], 14),
            )
        },
        footer: Some(
            "decide with: mtswarm approve ID [--scope job|agent] | mtswarm deny ID --reason \"...\"",
        ),
    };
    Ok(listing.print(cmd.json))
}

/// `mtswarm approve` / `mtswarm deny`: records `verdict` on one approval and
/// prints the decided record. Exit 0 once the leader accepted the decision.
pub(crate) async fn decide(
    cmd: DecideCmd,
    verdict: v1::ApprovalVerdict,
) -> anyhow::Result<ExitCode> {
    let mut control = cmd.action.leader.connect().await?;
    let record = decide_approval(
        &mut control,
        &cmd.action.leader.url(),
        &cmd.approval_id,
        verdict,
        &cmd.action.reason.text,
        cmd.scope,
    )
    .await?;
    if cmd.action.json {
        print_json(&render::approval(&record));
    } else {
        let request = record.request.clone().unwrap_or_default();
        println!(
            "{} {} ({} of agent {}){}",
            match verdict {
                v1::ApprovalVerdict::Approve => "approved",
                _ => "denied",
            },
            cmd.approval_id,
            request.tool_name,
            request.agent_id,
            match cmd.scope {
                Scope::Call => String::new(),
                Scope::Job => format!(
                    "; so is every later `{}` call of the job",
                    request.tool_name
                ),
                Scope::Agent => format!(
                    "; so is every later `{}` call of agent {}",
                    request.tool_name, request.agent_id
                ),
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
