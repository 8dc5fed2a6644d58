//! Approvals across processes. When a run pauses, every call waiting for a
//! decision gets an `ApprovalRecord` (PENDING) in the approvals bucket and an
//! `ApprovalRequest` on `mtswarm.approval.request.<job>`. The session then
//! waits for decisions from two sources: the decision subject of the
//! session (the leader publishes there after deciding) and a watch on the
//! approvals bucket (a decision written while no notification reached this
//! process). The stored record is authoritative: a decision that arrives
//! only as a message is written to the record first (CAS), and if the
//! record was decided otherwise, the record wins. Without a decision before
//! the timeout (counted from the original request, so a resumed session
//! does not restart the clock) the configured default verdict is written
//! and applied.
//!
//! Approval ids are derived from session, task and call id (a task keeps
//! its id across attempts), so a session resumed on another worker asking
//! again for the same call finds the existing record: a PENDING record stays
//! listed, a decision made while no worker ran the session is applied at
//! once, and a later decision reaches the new session through the decision
//! subject of its session id, the bucket watch, or (if both were lost to a
//! NATS restart) the record itself, read on every progress tick.
//!
//! Any worker identity may write the approvals bucket (records move with
//! sessions), so neither source is trusted by itself: with the leader's
//! public key configured, a decision counts only when the leader signed it
//! ([`mtswarm_auth::DecisionVerifier`]). An unsigned or badly signed
//! decision, as a message or as a stored record, is dropped and logged
//! with its approval id and the run keeps waiting; the only verdict applied
//! without a signature is this session's own timeout default.
//!
//! A signed decision is still applied only to the call it names, exactly:
//! its approval id, job, session and call id, tool, canonical arguments
//! and risk must be this session's own pending call's ([`OwnCall`]), so a
//! decision copied from another approval, another job (a standing decision
//! relabelled) or a record whose display was rewritten decides nothing.
//! The request this session stores carries its task's placement grant and
//! is signed with the daemon's record key, so the leader can tell it from
//! a rewrite; a stored record that is not this call's is replaced by it.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use futures::StreamExt;
use mtswarm_bus::{BusError, Delivery, KvChange, v1};
use mtswarm_core::{ApprovalDecision, ApprovalRequest, Risk};
use mtswarm_telemetry::metrics::{ApprovalDecisionKind, metrics};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::config::DefaultVerdict;
use crate::events::{EventPublisher, now_timestamp};
use crate::shared::Shared;
use crate::stop::StopMode;

/// Decisions per call id, as the engine wants them.
pub(crate) type Decisions = HashMap<String, ApprovalDecision>;

/// Why the wait ended without decisions.
pub(crate) enum Interrupted {
    Cancel(String),
    Abandon,
    /// The slice was lost while waiting (see `StopMode::Fence`).
    Fence,
}

/// The session and task a wait belongs to.
pub(crate) struct ApprovalWait<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) session_id: &'a str,
    pub(crate) agent_id: &'a str,
    pub(crate) task: &'a v1::TaskAssignment,
    pub(crate) events: &'a EventPublisher,
    pub(crate) step: u32,
    /// The session's tools, for what each call will do (the request's
    /// candidate, slice, device time and files).
    pub(crate) tools: &'a mtswarm_tools::ToolEnv,
}

/// The approval id of one call of one task of one session: `ap-` and 32 hex
/// digits of a SHA-256 over the three ids, so a session resumed on another
/// worker asking again for the same call finds the same approval record.
pub fn approval_id(session_id: &str, task_id: &str, call_id: &str) -> String {
    let mut hash = Sha256::new();
    for part in [session_id, task_id, call_id] {
        hash.update(part.as_bytes());
        hash.update([0u8]);
    }
    format!("ap-{}", &hex::encode(hash.finalize())[..32])
}

fn risk_level(risk: Risk) -> v1::RiskLevel {
    match risk {
        Risk::Low => v1::RiskLevel::Low,
        Risk::Medium => v1::RiskLevel::Medium,
        Risk::High => v1::RiskLevel::High,
    }
}

fn to_core(decision: &v1::ApprovalDecision) -> ApprovalDecision {
    match decision.verdict() {
        v1::ApprovalVerdict::Approve => ApprovalDecision::Approve,
        _ => ApprovalDecision::Deny {
            reason: Some(if decision.reason.trim().is_empty() {
                if decision.timed_out {
                    "approval timed out".to_owned()
                } else {
                    format!(
                        "denied by {}",
                        non_empty(&decision.decided_by, "the reviewer")
                    )
                }
            } else {
                decision.reason.clone()
            }),
        },
    }
}

fn non_empty<'a>(text: &'a str, fallback: &'a str) -> &'a str {
    if text.trim().is_empty() {
        fallback
    } else {
        text
    }
}

/// What this session's own pending call is, as a decision must name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnCall {
    pub(crate) approval_id: String,
    pub(crate) job_id: String,
    pub(crate) agent_id: String,
    pub(crate) session_id: String,
    pub(crate) call_id: String,
    pub(crate) tool_name: String,
    pub(crate) arguments_sha256: String,
    pub(crate) risk: i32,
}

impl OwnCall {
    fn of(request: &v1::ApprovalRequest) -> Self {
        Self {
            approval_id: request.approval_id.clone(),
            job_id: request.job_id.clone(),
            agent_id: request.agent_id.clone(),
            session_id: request.session_id.clone(),
            call_id: request.call_id.clone(),
            tool_name: request.tool_name.clone(),
            arguments_sha256: mtswarm_auth::arguments_digest(&request.arguments_json),
            risk: request.risk,
        }
    }

    /// The first field in which `decision` names another call, if any.
    pub(crate) fn mismatch(&self, decision: &v1::ApprovalDecision) -> Option<&'static str> {
        [
            ("approval id", decision.approval_id == self.approval_id),
            ("job", decision.job_id == self.job_id),
            ("session", decision.session_id == self.session_id),
            ("call id", decision.call_id == self.call_id),
            ("tool", decision.tool_name == self.tool_name),
            (
                "arguments",
                decision.arguments_sha256 == self.arguments_sha256,
            ),
            ("risk", decision.risk == self.risk),
        ]
        .into_iter()
        .find_map(|(field, same)| (!same).then_some(field))
    }

    /// Whether a stored request describes this call (the same ids, tool,
    /// arguments and risk), whoever stored it.
    fn describes(&self, request: &v1::ApprovalRequest) -> bool {
        let stored = OwnCall::of(request);
        stored == *self
    }
}

/// One call waiting, with what is known about its decision.
struct Pending {
    request: v1::ApprovalRequest,
    own: OwnCall,
    decision: Option<v1::ApprovalDecision>,
    /// Revision of the last stored record refused (logged once per revision).
    refused: Option<u64>,
}

/// True when `decision` decides `own` exactly (logged when not).
fn names_the_call(own: &OwnCall, decision: &v1::ApprovalDecision, source: &'static str) -> bool {
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
fn genuine(shared: &Shared, decision: &v1::ApprovalDecision, source: &'static str) -> bool {
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
enum Stored {
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
fn stored_decision(
    shared: &Shared,
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

/// Takes what `stored` says for `pending`: its decision, or, when the
/// leader decided another call in it, the session's own request stored
/// again as pending (so listings show what really waits and a person can
/// decide it).
async fn take_stored(
    shared: &Shared,
    pending: &mut Pending,
    stored: &mtswarm_bus::Versioned<v1::ApprovalRecord>,
) {
    match stored_decision(shared, &pending.own, stored, &mut pending.refused, "record") {
        Stored::Decided(decision) => pending.decision = Some(*decision),
        Stored::Waiting => {}
        Stored::OtherCall => restore(shared, &pending.request, stored.revision).await,
    }
}

/// Stores `request` (this session's own) as the pending record again,
/// over the rewritten revision `revision`.
async fn restore(shared: &Shared, request: &v1::ApprovalRequest, revision: u64) {
    tracing::warn!(approval.id = %request.approval_id, "approval record rewritten for another call; storing this session's pending request again");
    let record = v1::ApprovalRecord {
        request: Some(request.clone()),
        state: v1::ApprovalState::Pending as i32,
        decision: None,
        verification_error: String::new(),
    };
    if let Err(error) = shared
        .approvals
        .kv()
        .update(&request.approval_id, &record, revision)
        .await
    {
        tracing::warn!(%error, approval.id = %request.approval_id, "pending approval request not stored again");
    }
}

/// Store, announce and wait for the decisions of a paused run.
pub(crate) async fn await_decisions<T>(
    wait: &ApprovalWait<'_>,
    approvals: &[ApprovalRequest],
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<T>,
) -> Result<Decisions, Interrupted> {
    let shared = wait.shared;
    // Listen before announcing, so no decision can slip in between.
    let mut messages = match shared
        .bus
        .subscribe_approval_decisions(wait.session_id)
        .await
    {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, "approval decision subscription failed; relying on the KV watch");
            None
        }
    };
    let mut records = match shared.approvals.watch().await {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, "approvals watch failed; relying on decision messages");
            None
        }
    };
    let timeout = shared.config.approval_timeout;
    let default_verdict = match shared.config.approval_default {
        DefaultVerdict::Deny => v1::ApprovalVerdict::Deny,
        DefaultVerdict::Approve => v1::ApprovalVerdict::Approve,
    };
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut earliest = SystemTime::now();
    for call in approvals {
        let preview = wait.tools.preview(&call.tool, &call.arguments);
        let request = v1::ApprovalRequest {
            approval_id: approval_id(wait.session_id, &wait.task.task_id, &call.call_id),
            job_id: wait.task.job_id.clone(),
            agent_id: wait.agent_id.to_owned(),
            session_id: wait.session_id.to_owned(),
            call_id: call.call_id.clone(),
            tool_name: call.tool.clone(),
            arguments_json: call.arguments.to_string(),
            risk: risk_level(call.risk) as i32,
            reason: format!(
                "{:?}-risk tool `{}` is not auto-approved for this session",
                call.risk, call.tool
            ),
            requested_at: Some(now_timestamp()),
            timeout_seconds: timeout.as_secs().max(1),
            default_verdict: default_verdict as i32,
            summary: preview.summary(&call.tool),
            candidate_json: if preview.candidate.is_empty() {
                String::new()
            } else {
                json!(preview.candidate).to_string()
            },
            slice_id: preview.slice_id.clone(),
            estimated_device_seconds: preview.estimated_device_seconds.unwrap_or(0.0),
            files: preview.files.clone(),
            grant: wait.task.grant.clone(),
            signature: Vec::new(),
        };
        let mut request = request;
        if let Err(error) = shared.record_key.sign_approval_request(&mut request) {
            tracing::warn!(%error, "approval request not signed");
        }
        let own = OwnCall::of(&request);
        let mut refused = None;
        let (request, decision) = match shared.approvals.create(&request).await {
            Ok(_) => (request, None),
            Err(BusError::AlreadyExists { .. }) => {
                match shared.approvals.get(&request.approval_id).await {
                    Ok(Some(stored)) => adopt(shared, &own, request, stored, &mut refused).await,
                    Ok(None) => (request, None),
                    Err(error) => {
                        tracing::warn!(%error, "approval record unreadable");
                        (request, None)
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, approval.id = %request.approval_id, "approval record not stored");
                (request, None)
            }
        };
        if let Some(at) = request
            .requested_at
            .and_then(|ts| SystemTime::try_from(ts).ok())
            && at < earliest
        {
            earliest = at;
        }
        if decision.is_none()
            && let Err(error) = shared.bus.publish_approval_request(&request).await
        {
            tracing::warn!(%error, "approval request not published");
        }
        pending.insert(
            request.approval_id.clone(),
            Pending {
                request,
                own,
                decision,
                refused,
            },
        );
    }
    // Only the requests that wait here count as pending and have their
    // wait measured (a resumed run may find some decided already).
    let undecided: HashSet<String> = pending
        .iter()
        .filter(|(_, p)| p.decision.is_none())
        .map(|(id, _)| id.clone())
        .collect();
    let _waiting = WaitingApprovals::new(&shared.worker_id, undecided.len());
    let left = timeout
        .checked_sub(earliest.elapsed().unwrap_or_default())
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + left;
    // The first progress ack one period from now, without waiting for a
    // first tick (see `session::drive`).
    let period = shared.progress_interval();
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);

    while pending.values().any(|p| p.decision.is_none()) {
        tokio::select! {
            message = next_or_pending(&mut messages) => {
                match message {
                    Some(Ok(received)) => {
                        let decision = received.message;
                        if pending.get(&decision.approval_id).is_some_and(|p| {
                            p.decision.is_none() && names_the_call(&p.own, &decision, "message")
                        }) && genuine(shared, &decision, "message")
                        {
                            let own = pending.get(&decision.approval_id).map(|p| p.own.clone());
                            let settled = match own {
                                Some(own) => settle(shared, &own, decision).await,
                                None => decision,
                            };
                            if let Some(p) = pending.get_mut(&settled.approval_id) {
                                p.decision = Some(settled);
                            }
                        }
                    }
                    Some(Err(error)) => tracing::warn!(%error, "bad approval decision message"),
                    None => messages = None,
                }
            }
            change = next_or_pending(&mut records) => {
                match change {
                    Some(Ok(KvChange::Put { key, value })) => {
                        if let Some(p) = pending.get_mut(&key)
                            && p.decision.is_none()
                        {
                            take_stored(shared, p, &value).await;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        // Re-created on the next progress tick.
                        tracing::warn!(%error, "approvals watch error");
                        records = None;
                    }
                    None => records = None,
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                for p in pending.values_mut().filter(|p| p.decision.is_none()) {
                    let decision = v1::ApprovalDecision {
                        approval_id: p.request.approval_id.clone(),
                        job_id: p.request.job_id.clone(),
                        session_id: p.request.session_id.clone(),
                        call_id: p.request.call_id.clone(),
                        verdict: default_verdict as i32,
                        reason: "approval timed out".to_owned(),
                        decided_by: "timeout".to_owned(),
                        decided_at: Some(now_timestamp()),
                        timed_out: true,
                        tool_name: p.own.tool_name.clone(),
                        agent_id: p.own.agent_id.clone(),
                        arguments_sha256: p.own.arguments_sha256.clone(),
                        risk: p.own.risk,
                        ..Default::default()
                    };
                    let settled = settle(shared, &p.own, decision).await;
                    if settled.timed_out
                        && let Err(error) = shared.bus.publish_approval_decision(&settled).await
                    {
                        tracing::warn!(%error, "timeout decision not published");
                    }
                    p.decision = Some(settled);
                }
            }
            _ = progress.tick() => {
                if let Err(error) = delivery.in_progress().await {
                    tracing::debug!(%error, "progress ack failed");
                }
                // Decisions that reached neither the subject nor the watch
                // (NATS restarted in between) are read from the records.
                if records.is_none() {
                    records = shared.approvals.watch().await.ok();
                }
                for p in pending.values_mut().filter(|p| p.decision.is_none()) {
                    if let Ok(Some(stored)) = shared.approvals.get(&p.request.approval_id).await {
                        take_stored(shared, p, &stored).await;
                    }
                }
            }
            changed = stop.changed() => {
                let mode = if changed.is_err() { StopMode::Abandon } else { stop.borrow().clone() };
                match mode {
                    StopMode::Abandon => return Err(Interrupted::Abandon),
                    StopMode::Fence(_) => return Err(Interrupted::Fence),
                    StopMode::Cancel(why) => return Err(Interrupted::Cancel(why)),
                    StopMode::Run | StopMode::AfterTask | StopMode::Idle(_) => {}
                }
            }
        }
    }

    let mut decisions = Decisions::new();
    for p in pending.values() {
        let Some(decision) = &p.decision else {
            continue;
        };
        wait.events
            .publish(
                wait.step,
                v1::AgentEventKind::ApprovalDecided,
                json!({
                    "type": "approval_decided",
                    "task_id": wait.task.task_id,
                    "approval_id": decision.approval_id,
                    "call_id": p.request.call_id,
                    "tool": p.request.tool_name,
                    "verdict": decision.verdict().as_str_name(),
                    "reason": decision.reason,
                    "decided_by": decision.decided_by,
                    "timed_out": decision.timed_out,
                }),
            )
            .await;
        if undecided.contains(&decision.approval_id) {
            record_wait(&p.request, decision);
        }
        decisions.insert(p.request.call_id.clone(), to_core(decision));
    }
    Ok(decisions)
}

/// Counts `count` approvals of this worker as pending until dropped,
/// however the wait ends (decided, timed out, or the run interrupted).
struct WaitingApprovals<'a> {
    worker_id: &'a str,
    count: i64,
}

impl<'a> WaitingApprovals<'a> {
    fn new(worker_id: &'a str, count: usize) -> Self {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        metrics().approvals_waiting(worker_id, count);
        Self { worker_id, count }
    }
}

impl Drop for WaitingApprovals<'_> {
    fn drop(&mut self) {
        metrics().approvals_waiting(self.worker_id, -self.count);
    }
}

/// Records how long `request` waited for `decision` and how it ended.
fn record_wait(request: &v1::ApprovalRequest, decision: &v1::ApprovalDecision) {
    let kind = if decision.timed_out {
        ApprovalDecisionKind::TimedOut
    } else if decision.verdict() == v1::ApprovalVerdict::Approve {
        ApprovalDecisionKind::Approved
    } else {
        ApprovalDecisionKind::Denied
    };
    let waited = request
        .requested_at
        .and_then(|at| SystemTime::try_from(at).ok())
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .unwrap_or_default();
    metrics().approval_decided(kind, waited);
}

/// Record `decision` (the leader's, verified, or this session's own
/// timeout) on the stored request unless it was decided already; returns
/// the decision that stands. A stored decision the leader did not sign
/// does not stand: `decision` is applied instead.
async fn settle(
    shared: &Shared,
    own: &OwnCall,
    decision: v1::ApprovalDecision,
) -> v1::ApprovalDecision {
    for _ in 0..4 {
        match shared.approvals.decide(&decision).await {
            Ok(record) => return record.value.decision.unwrap_or(decision),
            Err(BusError::AlreadyDecided { .. }) | Err(BusError::CasConflict { .. }) => {
                match shared.approvals.get(&decision.approval_id).await {
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
                        if let Err(error) = shared.approvals.decide_at(&decision, &forged).await {
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
async fn adopt(
    shared: &Shared,
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
    if own.describes(&stored_request) && verified.is_ok() {
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

async fn next_or_pending<S, I>(stream: &mut Option<S>) -> Option<I>
where
    S: futures::Stream<Item = I> + Unpin,
{
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
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
        v1::ApprovalDecision {
            approval_id: request.approval_id.clone(),
            job_id: request.job_id.clone(),
            session_id: request.session_id.clone(),
            call_id: request.call_id.clone(),
            verdict: v1::ApprovalVerdict::Approve as i32,
            tool_name: request.tool_name.clone(),
            arguments_sha256: mtswarm_auth::arguments_digest(&request.arguments_json),
            risk: request.risk,
            ..Default::default()
        }
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
        assert!(own.describes(&request()));
        let mut shown = request();
        shown.tool_name = "read_file".into();
        assert!(!own.describes(&shown));
    }
}
