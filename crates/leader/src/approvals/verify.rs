//! What the leader believes of a stored approval record. Any worker
//! identity may write the approvals bucket, so a record is taken at its
//! word only when its request is signed by the worker its task was placed
//! on (the leader's own grant names that worker, job, agent and session;
//! `mtswarm_auth::provenance`) and its decision, if any, is the leader's
//! own over exactly that call (or the session's timeout default). Anything
//! else is shown as failing verification, never as pending or approved,
//! and is never approved.

use mtswarm_auth::DecisionSigner;
use mtswarm_bus::v1;

/// Why `record` fails verification, or `None` when it verifies (or the
/// leader has no key to tell).
pub(crate) fn verification_error(
    signer: Option<&DecisionSigner>,
    record: &v1::ApprovalRecord,
) -> Option<String> {
    let signer = signer?;
    let verifier = signer.verifier();
    let Some(request) = &record.request else {
        return Some("the record holds no request".into());
    };
    if let Err(error) = verifier.verify_approval_request(request) {
        return Some(error.to_string());
    }
    if record.state() == v1::ApprovalState::Pending {
        return None;
    }
    let Some(decision) = &record.decision else {
        return Some("the record is decided but holds no decision".into());
    };
    if decision.timed_out && decision.signature.is_empty() {
        // The session's own timeout verdict: the default its signed
        // request named, nothing else.
        return (decision.verdict != request.default_verdict).then(|| {
            format!(
                "a timeout decision with verdict {} where the request's default is {}",
                decision.verdict().as_str_name(),
                request.default_verdict().as_str_name()
            )
        });
    }
    if let Err(error) = verifier.verify(decision) {
        return Some(error.to_string());
    }
    decision_mismatch(request, decision).map(|field| {
        format!(
            "the leader's decision {} names another {field}",
            decision.approval_id
        )
    })
}

/// The first field in which `decision` names another call than `request`.
pub(crate) fn decision_mismatch(
    request: &v1::ApprovalRequest,
    decision: &v1::ApprovalDecision,
) -> Option<&'static str> {
    mtswarm_auth::ApprovedCall::of(request).mismatch(decision)
}

/// Why `request` (as relayed or stored) is not one the leader may act on.
pub(crate) fn request_error(
    signer: Option<&DecisionSigner>,
    request: &v1::ApprovalRequest,
) -> Option<String> {
    let signer = signer?;
    signer
        .verifier()
        .verify_approval_request(request)
        .err()
        .map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_auth::WorkerKey;

    fn signed_request(leader: &DecisionSigner, worker: &WorkerKey) -> v1::ApprovalRequest {
        let assignment = v1::TaskAssignment {
            task_id: "t".into(),
            job_id: "j".into(),
            attempt: 1,
            agent_id: "a".into(),
            session_id: "s".into(),
            worker_id: "w".into(),
            slice_id: "b0-c0".into(),
            ..Default::default()
        };
        let mut grant = mtswarm_auth::grant_for(&assignment, &worker.public_key());
        leader.sign_grant(&mut grant).expect("grant");
        let mut request = v1::ApprovalRequest {
            approval_id: "ap".into(),
            job_id: "j".into(),
            agent_id: "a".into(),
            session_id: "s".into(),
            call_id: "c".into(),
            tool_name: "benchmark".into(),
            arguments_json: r#"{"artifact":"x"}"#.into(),
            risk: v1::RiskLevel::Medium as i32,
            default_verdict: v1::ApprovalVerdict::Deny as i32,
            grant: Some(grant),
            ..Default::default()
        };
        worker.sign_approval_request(&mut request).expect("sign");
        request
    }

    fn decision_for(
        leader: &DecisionSigner,
        request: &v1::ApprovalRequest,
    ) -> v1::ApprovalDecision {
        let mut decision =
            mtswarm_auth::ApprovedCall::of(request).decision(v1::ApprovalVerdict::Approve);
        leader.sign(&mut decision).expect("sign");
        decision
    }

    #[test]
    fn forged_requests_and_decisions_fail_and_genuine_ones_pass() {
        let leader = DecisionSigner::generate();
        let worker = WorkerKey::generate();
        let request = signed_request(&leader, &worker);
        let pending = v1::ApprovalRecord {
            request: Some(request.clone()),
            state: v1::ApprovalState::Pending as i32,
            ..Default::default()
        };
        assert_eq!(verification_error(Some(&leader), &pending), None);
        assert_eq!(verification_error(None, &pending), None);

        // The display rewritten: read_file at low risk.
        let mut spoofed = pending.clone();
        if let Some(r) = spoofed.request.as_mut() {
            r.tool_name = "read_file".into();
            r.risk = v1::RiskLevel::Low as i32;
        }
        assert!(verification_error(Some(&leader), &spoofed).is_some());

        let approved = v1::ApprovalRecord {
            state: v1::ApprovalState::Approved as i32,
            decision: Some(decision_for(&leader, &request)),
            ..pending.clone()
        };
        assert_eq!(verification_error(Some(&leader), &approved), None);

        // Another approval's genuine decision copied in.
        let mut other = request.clone();
        other.approval_id = "ap-other".into();
        let replayed = v1::ApprovalRecord {
            decision: Some(decision_for(&leader, &other)),
            ..approved.clone()
        };
        let error = verification_error(Some(&leader), &replayed).expect("refused");
        assert!(error.contains("approval id"), "{error}");

        // A worker's "timeout" that approves where the default denies.
        let timed_out = v1::ApprovalRecord {
            decision: Some(v1::ApprovalDecision {
                approval_id: "ap".into(),
                verdict: v1::ApprovalVerdict::Approve as i32,
                timed_out: true,
                ..Default::default()
            }),
            ..approved
        };
        assert!(verification_error(Some(&leader), &timed_out).is_some());
    }
}
