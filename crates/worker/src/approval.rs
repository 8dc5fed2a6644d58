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

mod call;

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use futures::StreamExt;
use mtswarm_bus::{BusError, Delivery, KvChange, KvWatch, ReceivedStream, v1};
use mtswarm_core::{ApprovalDecision, ApprovalRequest, Risk};
use mtswarm_telemetry::metrics::{ApprovalDecisionKind, metrics};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use self::call::{
    OwnCall, Stored, adopt, genuine, names_the_call, restore, settle, stored_decision,
};
use crate::config::DefaultVerdict;
use crate::events::{EventPublisher, now_timestamp};
use crate::host::SessionHost;
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
    pub(crate) shared: &'a SessionHost,
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
pub(crate) fn approval_id(session_id: &str, task_id: &str, call_id: &str) -> String {
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

/// One call waiting, with what is known about its decision.
struct Pending {
    request: v1::ApprovalRequest,
    own: OwnCall,
    decision: Option<v1::ApprovalDecision>,
    /// Revision of the last stored record refused (logged once per revision).
    refused: Option<u64>,
}

/// Takes what `stored` says for `pending`: its decision, or, when the
/// leader decided another call in it, the session's own request stored
/// again as pending (so listings show what really waits and a person can
/// decide it).
async fn take_stored(
    shared: &SessionHost,
    pending: &mut Pending,
    stored: &mtswarm_bus::Versioned<v1::ApprovalRecord>,
) {
    match stored_decision(shared, &pending.own, stored, &mut pending.refused, "record") {
        Stored::Decided(decision) => pending.decision = Some(*decision),
        Stored::Waiting => {}
        Stored::OtherCall => restore(shared, &pending.request, stored.revision).await,
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
    let mut sources = Sources::open(shared, wait.session_id).await;
    let (mut pending, earliest) = ask(wait, approvals).await;
    // Only the requests that wait here count as pending and have their
    // wait measured (a resumed run may find some decided already).
    let undecided: HashSet<String> = pending
        .iter()
        .filter(|(_, p)| p.decision.is_none())
        .map(|(id, _)| id.clone())
        .collect();
    let _waiting = WaitingApprovals::new(&shared.identity.worker_id, undecided.len());
    let left = shared
        .config
        .approval_timeout
        .checked_sub(earliest.elapsed().unwrap_or_default())
        .unwrap_or_default();
    let deadline = tokio::time::Instant::now() + left;
    collect(shared, &mut pending, &mut sources, deadline, stop, delivery).await?;
    Ok(report(wait, &pending, &undecided).await)
}

/// Where decisions arrive: the session's decision subject and the
/// approvals bucket's watch; either may be missing (and the watch is
/// re-created on a progress tick).
struct Sources {
    messages: Option<ReceivedStream<v1::ApprovalDecision>>,
    records: Option<KvWatch<v1::ApprovalRecord>>,
}

impl Sources {
    async fn open(shared: &SessionHost, session_id: &str) -> Self {
        let messages = match shared
            .stores
            .bus
            .subscribe_approval_decisions(session_id)
            .await
        {
            Ok(stream) => Some(stream),
            Err(error) => {
                tracing::warn!(%error, "approval decision subscription failed; relying on the KV watch");
                None
            }
        };
        let records = match shared.stores.approvals.watch().await {
            Ok(stream) => Some(stream),
            Err(error) => {
                tracing::warn!(%error, "approvals watch failed; relying on decision messages");
                None
            }
        };
        Self { messages, records }
    }
}

/// The verdict a request falls back to when its wait times out.
fn default_verdict(shared: &SessionHost) -> v1::ApprovalVerdict {
    match shared.config.approval_default {
        DefaultVerdict::Deny => v1::ApprovalVerdict::Deny,
        DefaultVerdict::Approve => v1::ApprovalVerdict::Approve,
    }
}

/// Stores and announces a request per call, by approval id, with what is
/// known of its decision already (a resumed session's); and the earliest
/// time one of them was first requested (the timeout counts from it).
async fn ask(
    wait: &ApprovalWait<'_>,
    approvals: &[ApprovalRequest],
) -> (HashMap<String, Pending>, SystemTime) {
    let shared = wait.shared;
    let mut pending: HashMap<String, Pending> = HashMap::new();
    let mut earliest = SystemTime::now();
    for call in approvals {
        let mut request = request_for(wait, call);
        if let Err(error) = shared
            .identity
            .record_key
            .sign_approval_request(&mut request)
        {
            tracing::warn!(%error, "approval request not signed");
        }
        let own = OwnCall::of(&request);
        let mut refused = None;
        let (request, decision) = store(shared, &own, request, &mut refused).await;
        if let Some(at) = request
            .requested_at
            .and_then(|ts| SystemTime::try_from(ts).ok())
            && at < earliest
        {
            earliest = at;
        }
        if decision.is_none()
            && let Err(error) = shared.stores.bus.publish_approval_request(&request).await
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
    (pending, earliest)
}

/// The request for one call, with what the call will do (its candidate,
/// slice, device time and files) and its task's placement grant; unsigned.
fn request_for(wait: &ApprovalWait<'_>, call: &ApprovalRequest) -> v1::ApprovalRequest {
    let config = &wait.shared.config;
    let preview = wait.tools.preview(&call.tool, &call.arguments);
    v1::ApprovalRequest {
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
        timeout_seconds: config.approval_timeout.as_secs().max(1),
        default_verdict: default_verdict(wait.shared) as i32,
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
    }
}

/// Creates the request's record; when one exists (a session asking again)
/// it is adopted ([`adopt`]). The request that stands, and its decision
/// when the record has one for this call.
async fn store(
    shared: &SessionHost,
    own: &OwnCall,
    request: v1::ApprovalRequest,
    refused: &mut Option<u64>,
) -> (v1::ApprovalRequest, Option<v1::ApprovalDecision>) {
    match shared.stores.approvals.create(&request).await {
        Ok(_) => (request, None),
        Err(BusError::AlreadyExists { .. }) => {
            match shared.stores.approvals.get(&request.approval_id).await {
                Ok(Some(stored)) => adopt(shared, own, request, stored, refused).await,
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
    }
}

/// Waits until every pending call is decided: by a message, by its record
/// (watched, and read again on every progress tick), or by the timeout's
/// default verdict at `deadline`; the task's delivery is kept in progress
/// meanwhile. A stop of the session ends the wait.
async fn collect<T>(
    shared: &SessionHost,
    pending: &mut HashMap<String, Pending>,
    sources: &mut Sources,
    deadline: tokio::time::Instant,
    stop: &mut watch::Receiver<StopMode>,
    delivery: &Delivery<T>,
) -> Result<(), Interrupted> {
    // The first progress ack one period from now, without waiting for a
    // first tick (see `session::drive`).
    let period = shared.progress_interval();
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    while pending.values().any(|p| p.decision.is_none()) {
        tokio::select! {
            message = next_or_pending(&mut sources.messages) => {
                match message {
                    Some(Ok(received)) => take_message(shared, pending, received.message).await,
                    Some(Err(error)) => tracing::warn!(%error, "bad approval decision message"),
                    None => sources.messages = None,
                }
            }
            change = next_or_pending(&mut sources.records) => {
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
                        sources.records = None;
                    }
                    None => sources.records = None,
                }
            }
            _ = tokio::time::sleep_until(deadline) => time_out(shared, pending).await,
            _ = progress.tick() => tick(shared, pending, sources, delivery).await,
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
    Ok(())
}

/// A decision message: taken when it decides a pending call exactly and
/// the leader signed it, after it is recorded (the record wins).
async fn take_message(
    shared: &SessionHost,
    pending: &mut HashMap<String, Pending>,
    decision: v1::ApprovalDecision,
) {
    if !(pending
        .get(&decision.approval_id)
        .is_some_and(|p| p.decision.is_none() && names_the_call(&p.own, &decision, "message"))
        && genuine(shared, &decision, "message"))
    {
        return;
    }
    let own = pending.get(&decision.approval_id).map(|p| p.own.clone());
    let settled = match own {
        Some(own) => settle(shared, &own, decision).await,
        None => decision,
    };
    if let Some(p) = pending.get_mut(&settled.approval_id) {
        p.decision = Some(settled);
    }
}

/// The timeout: every call still pending gets the default verdict,
/// recorded (unless decided meanwhile) and published.
async fn time_out(shared: &SessionHost, pending: &mut HashMap<String, Pending>) {
    let verdict = default_verdict(shared);
    for p in pending.values_mut().filter(|p| p.decision.is_none()) {
        let decision = v1::ApprovalDecision {
            reason: "approval timed out".to_owned(),
            decided_by: "timeout".to_owned(),
            decided_at: Some(now_timestamp()),
            timed_out: true,
            ..p.own.decision(verdict)
        };
        let settled = settle(shared, &p.own, decision).await;
        if settled.timed_out
            && let Err(error) = shared.stores.bus.publish_approval_decision(&settled).await
        {
            tracing::warn!(%error, "timeout decision not published");
        }
        p.decision = Some(settled);
    }
}

/// A progress tick: the task's delivery kept in progress, the watch
/// re-created if it ended, and the pending records read again (decisions
/// that reached neither the subject nor the watch: NATS restarted in
/// between).
async fn tick<T>(
    shared: &SessionHost,
    pending: &mut HashMap<String, Pending>,
    sources: &mut Sources,
    delivery: &Delivery<T>,
) {
    if let Err(error) = delivery.in_progress().await {
        tracing::debug!(%error, "progress ack failed");
    }
    if sources.records.is_none() {
        sources.records = shared.stores.approvals.watch().await.ok();
    }
    for p in pending.values_mut().filter(|p| p.decision.is_none()) {
        if let Ok(Some(stored)) = shared.stores.approvals.get(&p.request.approval_id).await {
            take_stored(shared, p, &stored).await;
        }
    }
}

/// Publishes each decision as an event of the session, records the wait of
/// those decided here, and returns the decisions by call id.
async fn report(
    wait: &ApprovalWait<'_>,
    pending: &HashMap<String, Pending>,
    undecided: &HashSet<String>,
) -> Decisions {
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
    decisions
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

async fn next_or_pending<S, I>(stream: &mut Option<S>) -> Option<I>
where
    S: futures::Stream<Item = I> + Unpin,
{
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
