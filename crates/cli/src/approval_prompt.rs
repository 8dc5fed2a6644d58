//! The interactive approval question of `mtswarm watch`: what the call
//! will do (tool, candidate parameters, slice, estimated device time,
//! files), why it asks, and the answers a person needs: approve this call,
//! approve this tool for the whole job or for this agent, deny, or skip
//! (leave it to `mtswarm approve` / `deny`).

use std::io::Write as _;

use indicatif::MultiProgress;
use mtswarm_proto::v1;

use crate::common::{Control, rpc_error};
use crate::decision::{Scope, decide_approval};
use crate::render;

/// What the person answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Decide with this verdict and scope.
    Decide(v1::ApprovalVerdict, Scope),
    /// Leave it pending.
    Skip,
}

/// The answers offered, as shown after the question.
const CHOICES: &str = "Approve? [y]es / [j] yes, this tool for the whole job / [a] yes, this tool for this agent / [n]o / [s]kip: ";

/// The answer a line means; `None` when it means nothing (ask again).
/// High-risk calls are approved one at a time, so `j` and `a` mean
/// nothing for them.
fn parse_answer(line: &str, risk: v1::RiskLevel) -> Option<Answer> {
    let widen = risk != v1::RiskLevel::High;
    match line.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Some(Answer::Decide(v1::ApprovalVerdict::Approve, Scope::Call)),
        "j" | "job" if widen => Some(Answer::Decide(v1::ApprovalVerdict::Approve, Scope::Job)),
        "a" | "agent" if widen => Some(Answer::Decide(v1::ApprovalVerdict::Approve, Scope::Agent)),
        "n" | "no" => Some(Answer::Decide(v1::ApprovalVerdict::Deny, Scope::Call)),
        "s" | "skip" | "" => Some(Answer::Skip),
        _ => None,
    }
}

/// The question for `request`: what the call will do and why it asks.
fn question(request: &v1::ApprovalRequest) -> String {
    let mut text = format!(
        "\nApproval {}: agent {} wants to run `{}` (risk {})\n  {}\n",
        request.approval_id,
        request.agent_id,
        request.tool_name,
        render::risk(request.risk()),
        render::what_it_does(request),
    );
    if !request.candidate_json.is_empty() {
        text.push_str(&format!(
            "  candidate: {}\n",
            render::compact(&render::embedded_json(&request.candidate_json), 200)
        ));
    }
    text.push_str(&format!(
        "  arguments: {}\n",
        render::compact(&render::embedded_json(&request.arguments_json), 200)
    ));
    if !request.reason.is_empty() {
        text.push_str(&format!("  why: {}\n", request.reason));
    }
    if request.risk() == v1::RiskLevel::High {
        text.push_str("Approve? [y]es / [n]o / [s]kip (high risk: one call at a time): ");
    } else {
        text.push_str(CHOICES);
    }
    text
}

/// Reads one line from stdin after printing `prompt`.
async fn read_line(prompt: String) -> anyhow::Result<String> {
    let line = tokio::task::spawn_blocking(move || {
        print!("{prompt}");
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    Ok(line)
}

/// Asks the user about one approval request, unless it is no longer pending.
pub(crate) async fn ask_about(
    control: &mut Control,
    leader: &str,
    request: &v1::ApprovalRequest,
    multi: &MultiProgress,
) -> anyhow::Result<()> {
    let pending = control
        .list_approvals(v1::ListApprovalsRequest {
            job_id: request.job_id.clone(),
            states: vec![v1::ApprovalState::Pending as i32],
        })
        .await
        .map_err(|status| rpc_error("listing approvals", leader, status))?
        .into_inner();
    if !pending.approvals.iter().any(|r| {
        r.request
            .as_ref()
            .is_some_and(|q| q.approval_id == request.approval_id)
    }) {
        // Decided meanwhile (by someone else, or a standing decision).
        return Ok(());
    }
    let text = question(request);
    let answer = loop {
        if let Some(answer) = parse_answer(&read_line(text.clone()).await?, request.risk()) {
            break answer;
        }
    };
    let Answer::Decide(verdict, scope) = answer else {
        multi.suspend(|| {
            println!(
                "skipped; decide later with `mtswarm approve {}` or `mtswarm deny {}`",
                request.approval_id, request.approval_id
            )
        });
        return Ok(());
    };
    let reason = if verdict == v1::ApprovalVerdict::Deny {
        read_line("Reason (shown to the agent, optional): ".to_string())
            .await?
            .trim()
            .to_string()
    } else {
        String::new()
    };
    match decide_approval(
        control,
        leader,
        &request.approval_id,
        verdict,
        &reason,
        scope,
    )
    .await
    {
        Ok(_) => {}
        // Someone else decided first (or it timed out): say so and go on.
        Err(error) => multi.suspend(|| println!("{error:#}")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_offer_wider_scopes_except_for_high_risk_calls() {
        let medium = v1::RiskLevel::Medium;
        assert_eq!(
            parse_answer(" J\n", medium),
            Some(Answer::Decide(v1::ApprovalVerdict::Approve, Scope::Job))
        );
        assert_eq!(
            parse_answer("a", medium),
            Some(Answer::Decide(v1::ApprovalVerdict::Approve, Scope::Agent))
        );
        assert_eq!(
            parse_answer("no", medium),
            Some(Answer::Decide(v1::ApprovalVerdict::Deny, Scope::Call))
        );
        assert_eq!(parse_answer("", medium), Some(Answer::Skip));
        assert_eq!(parse_answer("maybe", medium), None);
        assert_eq!(parse_answer("j", v1::RiskLevel::High), None);
    }

    #[test]
    fn the_question_shows_what_the_call_will_do() {
        let request = v1::ApprovalRequest {
            approval_id: "ap-1".into(),
            agent_id: "tuner-1".into(),
            tool_name: "benchmark".into(),
            arguments_json: r#"{"artifact":"b3"}"#.into(),
            risk: v1::RiskLevel::Medium as i32,
            summary: "benchmark N=4096 on board0-c0, about 2.0 ms of device time".into(),
            candidate_json: r#"{"N":"4096"}"#.into(),
            ..Default::default()
        };
        let text = question(&request);
        assert!(text.contains("benchmark N=4096 on board0-c0"), "{text}");
        assert!(text.contains("candidate: {\"N\":\"4096\"}"), "{text}");
        assert!(
            text.contains("[j] yes, this tool for the whole job"),
            "{text}"
        );
    }
}
