//! Whether a decision counts for this session's call: the leader signed
//! it (when its key is configured) and it names this very call
//! ([`OwnCall`]: approval id, job, session, call id, tool, canonical
//! arguments and risk). Any worker identity may write the approvals
//! bucket, so a stored record is checked like a message, and one rewritten
//! for another call is replaced by this session's own request.

use mtswarm_bus::{BusError, v1};

use crate::host::SessionHost;

/// What this session's own pending call is, as a decision must name it.
pub(crate) type OwnCall = mtswarm_auth::ApprovedCall;

/// Whether a stored request describes `own` (the same ids, tool,
/// arguments and risk), whoever stored it.
fn describes(own: &OwnCall, request: &v1::ApprovalRequest) -> bool {
    OwnCall::of(request) == *own
}

/// True when `decision` decides `own` exactly (logged when not).
pub(super) fn names_the_call(
    own: &OwnCall,
    decision: &v1::ApprovalDecision,
    source: &'static str,
) -> bool {
    match own.mismatch(decision) {
        None => true,
        Some(field) => {
            tracing::warn!(
                approval.id = %own.approval_id,
                decision.approval_id = %decision.approval_id,
                source,
                field,
                "approval decision dropped: it names another call than this session's; still waiting"
            );
            false
        }
    }
}

/// True when `decision` may be applied: the leader signed it, or no leader
/// key is configured. A refused decision is logged with its approval id.
pub(super) fn genuine(
    shared: &SessionHost,
    decision: &v1::ApprovalDecision,
    source: &'static str,
) -> bool {
    let Some(verifier) = &shared.config.leader_key else {
        return true;
    };
    match verifier.verify(decision) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(
                approval.id = %decision.approval_id,
                source,
                decided_by = %decision.decided_by,
                %error,
                "approval decision dropped: not signed by the leader; still waiting"
            );
            false
        }
    }
}

/// What a stored record says of this session's call.
pub(super) enum Stored {
    /// Undecided, or a decision the leader did not sign (refused, logged).
    Waiting,
    /// The leader's decision of this very call.
    Decided(Box<v1::ApprovalDecision>),
    /// A decision the leader signed for another call: the record was
    /// rewritten (its display, or a decision copied in from elsewhere).
    OtherCall,
}

/// What the stored record says of `own`. `refused` remembers the revision
/// last refused so that a record re-read on every tick is logged once.
pub(super) fn stored_decision(
    shared: &SessionHost,
    own: &OwnCall,
    stored: &mtswarm_bus::Versioned<v1::ApprovalRecord>,
    refused: &mut Option<u64>,
    source: &'static str,
) -> Stored {
    if stored.value.state() == v1::ApprovalState::Pending {
        return Stored::Waiting;
    }
    let Some(decision) = stored.value.decision.as_ref() else {
        return Stored::Waiting;
    };
    if *refused == Some(stored.revision) {
        return Stored::Waiting;
    }
    *refused = Some(stored.revision);
    if !genuine(shared, decision, source) {
        return Stored::Waiting;
    }
    if !names_the_call(own, decision, source) {
        return Stored::OtherCall;
    }
    *refused = None;
    Stored::Decided(Box::new(decision.clone()))
}

/// Stores `request` (this session's own) as the pending record again,
/// over the rewritten revision `revision`.
pub(super) async fn restore(shared: &SessionHost, request: &v1::ApprovalRequest, revision: u64) {
    tracing::warn!(approval.id = %request.approval_id, "approval record rewritten for another call; storing this session's pending request again");
    let record = v1::ApprovalRecord {
        request: Some(request.clone()),
        state: v1::ApprovalState::Pending as i32,
        decision: None,
        verification_error: String::new(),
    };
    if let Err(error) = shared
        .stores
        .approvals
        .kv()
        .update(&request.approval_id, &record, revision)
        .await
    {
        tracing::warn!(%error, approval.id = %request.approval_id, "pending approval request not stored again");
    }
}

/// Record `decision` (the leader's, verified, or this session's own
/// timeout) on the stored request unless it was decided already; returns
/// the decision that stands. A stored decision the leader did not sign
/// does not stand: `decision` is applied instead.
pub(super) async fn settle(
    shared: &SessionHost,
    own: &OwnCall,
    decision: v1::ApprovalDecision,
) -> v1::ApprovalDecision {
    for _ in 0..4 {
        match shared.stores.approvals.decide(&decision).await {
            Ok(record) => return record.value.decision.unwrap_or(decision),
            Err(BusError::AlreadyDecided { .. }) | Err(BusError::CasConflict { .. }) => {
                match shared.stores.approvals.get(&decision.approval_id).await {
                    Ok(Some(stored)) if stored.value.state() != v1::ApprovalState::Pending => {
                        if let Some(standing) = &stored.value.decision
                            && genuine(shared, standing, "record")
                            && names_the_call(own, standing, "record")
                        {
                            return standing.clone();
                        }
                        // Replace the forgery, so listings show what was applied.
                        let mut forged = stored;
                        forged.value.state = v1::ApprovalState::Pending as i32;
                        forged.value.decision = None;
                        if let Err(error) =
                            shared.stores.approvals.decide_at(&decision, &forged).await
                        {
                            tracing::warn!(%error, approval.id = %decision.approval_id, "forged approval record not replaced");
                        }
                        return decision;
                    }
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "approval record unreadable; using the decision as sent");
                        return decision;
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, approval.id = %decision.approval_id, "decision not recorded; applying it");
                return decision;
            }
        }
    }
    decision
}

/// The stored record of this call when the session asks again (a resumed
/// or moved session): kept, with its decision if that decides this call,
/// when it describes this very call (and, with the leader's key, verifies
/// as a worker's request for it); otherwise it is not this call's record
/// (rewritten by another writer) and is replaced by this session's own
/// pending request, so listings show what waits.
pub(super) async fn adopt(
    shared: &SessionHost,
    own: &OwnCall,
    request: v1::ApprovalRequest,
    stored: mtswarm_bus::Versioned<v1::ApprovalRecord>,
    refused: &mut Option<u64>,
) -> (v1::ApprovalRequest, Option<v1::ApprovalDecision>) {
    let stored_request = stored.value.request.clone().unwrap_or_default();
    let verified = match &shared.config.leader_key {
        Some(verifier) => verifier.verify_approval_request(&stored_request),
        None => Ok(()),
    };
    if describes(own, &stored_request) && verified.is_ok() {
        match stored_decision(shared, own, &stored, refused, "record") {
            Stored::Decided(decision) => return (stored_request, Some(*decision)),
            Stored::Waiting => return (stored_request, None),
            Stored::OtherCall => {
                restore(shared, &stored_request, stored.revision).await;
                return (stored_request, None);
            }
        }
    }
    let why = match verified {
        Err(error) => error.to_string(),
        Ok(()) => "it describes another call".to_string(),
    };
    tracing::warn!(approval.id = %own.approval_id, %why, "stored approval record is not this call's");
    restore(shared, &request, stored.revision).await;
    (request, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> v1::ApprovalRequest {
        v1::ApprovalRequest {
            approval_id: "ap-1".into(),
            job_id: "job-b".into(),
            agent_id: "tuner-1".into(),
            session_id: "s-1".into(),
            call_id: "c1-benchmark".into(),
            tool_name: "benchmark".into(),
            arguments_json: r#"{"artifact":"a1","repeats":3}"#.into(),
            risk: v1::RiskLevel::Medium as i32,
            ..Default::default()
        }
    }

    fn decision_for(request: &v1::ApprovalRequest) -> v1::ApprovalDecision {
        OwnCall::of(request).decision(v1::ApprovalVerdict::Approve)
    }

    #[test]
    fn only_a_decision_of_this_very_call_decides_it() {
        let own = OwnCall::of(&request());
        assert_eq!(own.mismatch(&decision_for(&request())), None);
        // The same arguments spelled otherwise are the same call.
        let mut respelled = request();
        respelled.arguments_json = r#"{ "repeats": 3, "artifact": "a1" }"#.into();
        assert_eq!(own.mismatch(&decision_for(&respelled)), None);

        type Change = Box<dyn Fn(&mut v1::ApprovalRequest)>;
        let cases: Vec<(&str, Change)> = vec![
            ("approval id", Box::new(|r| r.approval_id = "ap-2".into())),
            // A standing decision of another job relabelled: checked here
            // too, whatever the leader did.
            ("job", Box::new(|r| r.job_id = "job-a".into())),
            ("session", Box::new(|r| r.session_id = "s-2".into())),
            ("call id", Box::new(|r| r.call_id = "c2".into())),
            ("tool", Box::new(|r| r.tool_name = "read_file".into())),
            (
                "arguments",
                Box::new(|r| r.arguments_json = r#"{"artifact":"a2","repeats":3}"#.into()),
            ),
            ("risk", Box::new(|r| r.risk = v1::RiskLevel::Low as i32)),
        ];
        for (field, change) in cases {
            let mut other = request();
            change(&mut other);
            assert_eq!(own.mismatch(&decision_for(&other)), Some(field), "{field}");
        }
        assert!(describes(&own, &request()));
        let mut shown = request();
        shown.tool_name = "read_file".into();
        assert!(!describes(&own, &shown));
    }
}
