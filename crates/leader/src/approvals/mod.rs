//! The approval broker: every approval request of every agent (workers and
//! the leader's own loop) becomes an `ApprovalRecord` in the approvals KV
//! (ListApprovals reads it) and an entry of its job's journal (WatchJob);
//! decisions are signed with the leader's decision key, written by CAS and
//! published to the waiting session.
//!
//! A record some other writer marked decided without the leader's signature
//! (any worker identity may write the bucket) does not count as decided
//! here: the waiting worker refuses it, so a human decision replaces it.
//! Timed-out records are the exception: a worker writes its own timeout
//! verdict, unsigned, after applying it.
//!
//! A decision may reach beyond its call ("this tool for this job", "for
//! this agent"): [`standing`] keeps it and decides the later requests it
//! covers as they arrive, without asking anyone.
//!
//! A request counts only when [`verify`] says its worker signed it under
//! the leader's own grant for that job, agent and session: others are
//! dropped when relayed, never covered by a standing decision, listed as
//! failing verification, and a decision on one is always a deny. Every
//! decision the leader signs names the call exactly (tool, canonical
//! arguments, risk), so the worker applies it to nothing else.

pub(crate) mod leader_wait;
pub(crate) mod standing;
pub(crate) mod verify;

use std::time::SystemTime;

use futures::StreamExt as _;
use mtswarm_bus::{Approvals, Backoff, Bus, BusError, Versioned, reopen, v1};

use crate::journal::Journal;

/// Why a decision was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecideError {
    /// The request is unusable: a bad approval id, an unspecified verdict or
    /// a decision the approvals store refuses; the text says which.
    #[error("{0}")]
    Invalid(String),
    /// No approval record has this id (the approval id).
    #[error("approval {0} not found")]
    NotFound(String),
    /// The record is no longer pending; the first decision stands.
    #[error("approval {approval_id} is already decided ({state})")]
    AlreadyDecided {
        /// Approval id from the request.
        approval_id: String,
        /// The stored state as its protobuf enum name, or "changed
        /// concurrently" when the record could not be read back.
        state: String,
    },
    /// Reading or writing the approvals KV failed.
    #[error("{0}")]
    Bus(BusError),
    /// The leader's decision key could not sign the decision.
    #[error("{0}")]
    Sign(mtswarm_auth::SignatureError),
    /// The stored request failed verification: it was denied, whatever
    /// was asked.
    #[error("approval {approval_id} failed verification ({reason}); it was denied")]
    Unverified {
        /// Approval id from the request.
        approval_id: String,
        /// Why it failed.
        reason: String,
    },
}

/// `current` as the worker sees it: a decided record without the leader's
/// signature (and not a worker's own timeout) is still pending.
pub(crate) fn as_worker_sees_it(
    signer: Option<&mtswarm_auth::DecisionSigner>,
    current: &Versioned<v1::ApprovalRecord>,
) -> Versioned<v1::ApprovalRecord> {
    let mut seen = current.clone();
    if let Some(signer) = signer
        && current.value.state() != v1::ApprovalState::Pending
        && let Some(decision) = &current.value.decision
        && !decision.timed_out
        && let Some(error) = signer
            .verifier()
            .verify(decision)
            .err()
            .map(|e| e.to_string())
            .or_else(|| {
                let request = current.value.request.as_ref()?;
                verify::decision_mismatch(request, decision)
                    .map(|field| format!("it names another {field}"))
            })
    {
        tracing::warn!(%error, approval_id = %decision.approval_id, "stored approval decision is not the leader's; deciding over it");
        seen.value.state = v1::ApprovalState::Pending as i32;
        seen.value.decision = None;
    }
    seen
}

/// Records and journals approval requests published on the bus until
/// `shutdown` fires. A request whose record already exists (the worker
/// stores it before announcing it) is journaled only. Only requests of
/// jobs `owns` says this leader owns: each is journaled by its job's owner.
/// A request a standing approval covers is decided at once.
pub(crate) async fn relay_requests(
    bus: Bus,
    approvals: Approvals,
    journal: Journal,
    signer: Option<mtswarm_auth::DecisionSigner>,
    owns: impl Fn(&str) -> bool + Send + 'static,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(5),
    );
    let mut requests = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let Some(stream) = requests.as_mut() else {
            // The client re-subscribes by itself after a reconnect; this
            // only runs when the subscription could not be made or ended.
            match reopen(
                "approval requests subscription",
                &mut backoff,
                &mut shutdown,
                || bus.subscribe_approval_requests(None),
            )
            .await
            {
                Some(stream) => requests = Some(stream),
                None => break,
            }
            continue;
        };
        let item = tokio::select! {
            item = stream.next() => item,
            _ = shutdown.changed() => break,
        };
        let Some(item) = item else {
            requests = None;
            continue;
        };
        let request = match item {
            Ok(received) => received.message,
            Err(error) => {
                tracing::warn!(%error, "undecodable approval request dropped");
                continue;
            }
        };
        if !owns(&request.job_id) {
            continue;
        }
        if let Some(reason) = verify::request_error(signer.as_ref(), &request) {
            tracing::warn!(
                approval_id = %request.approval_id,
                job_id = %request.job_id,
                session_id = %request.session_id,
                tool = %request.tool_name,
                %reason,
                "approval request refused: not signed by the worker its task was placed on"
            );
            continue;
        }
        match approvals.create(&request).await {
            Ok(_) | Err(BusError::AlreadyExists { .. }) => {}
            Err(error) => {
                tracing::warn!(%error, approval_id = %request.approval_id, "approval request not stored");
            }
        }
        let job_id = request.job_id.clone();
        let standing = standing::covering(&approvals, signer.as_ref(), &request).await;
        if let Err(error) = journal
            .append(
                &job_id,
                v1::job_event::Event::ApprovalRequested(request.clone()),
            )
            .await
        {
            tracing::warn!(%error, %job_id, "approval request not journaled");
        }
        if let Some(standing) = standing {
            decide_standing(
                &bus,
                &approvals,
                &journal,
                signer.as_ref(),
                &request,
                &standing,
            )
            .await;
        }
    }
}

/// Decides `request` as the standing decision `standing` says, naming it.
async fn decide_standing(
    bus: &Bus,
    approvals: &Approvals,
    journal: &Journal,
    signer: Option<&mtswarm_auth::DecisionSigner>,
    request: &v1::ApprovalRequest,
    standing: &v1::ApprovalDecision,
) {
    let whom = match standing.scope() {
        v1::ApprovalScope::ToolForAgent => format!("for agent {}", standing.agent_id),
        _ => "for this job".to_string(),
    };
    let decision = v1::DecideApprovalRequest {
        approval_id: request.approval_id.clone(),
        verdict: standing.verdict,
        reason: format!(
            "standing decision {} by {}: `{}` {whom}{}",
            standing.approval_id,
            standing.decided_by,
            standing.tool_name,
            if standing.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", standing.reason)
            }
        ),
        decided_by: standing.decided_by.clone(),
        scope: v1::ApprovalScope::Call as i32,
    };
    match decide_as(
        bus,
        approvals,
        journal,
        signer,
        &decision,
        Some(&standing.approval_id),
    )
    .await
    {
        Ok(_) => tracing::info!(
            approval_id = %request.approval_id,
            standing = %standing.approval_id,
            tool = %request.tool_name,
            "approval decided by a standing decision"
        ),
        // Someone (or the session's timeout) decided first: that stands.
        Err(DecideError::AlreadyDecided { .. }) => {}
        Err(error) => {
            tracing::warn!(%error, approval_id = %request.approval_id, "standing decision not applied; the request waits for a human");
        }
    }
}

/// Decides a pending approval: CAS-writes the decision, publishes it to the
/// session and journals it. A decision for the tool in the job (or for the
/// agent) is also kept as a standing approval.
pub(crate) async fn decide(
    bus: &Bus,
    approvals: &Approvals,
    journal: &Journal,
    signer: Option<&mtswarm_auth::DecisionSigner>,
    request: &v1::DecideApprovalRequest,
) -> Result<Versioned<v1::ApprovalRecord>, DecideError> {
    let decided = decide_as(bus, approvals, journal, signer, request, None).await?;
    if let Some(standing) = decided
        .value
        .decision
        .as_ref()
        .filter(|d| standing::is_standing(d.scope()))
    {
        // Calls of the same tool already waiting are covered too.
        let waiting = match approvals
            .list(Some(&standing.job_id), &[v1::ApprovalState::Pending])
            .await
        {
            Ok(waiting) => waiting,
            Err(error) => {
                // Those calls are decided as they are asked again, or by a human.
                tracing::warn!(%error, approval_id = %standing.approval_id, "waiting approvals not listed; the standing decision covers later requests only");
                Vec::new()
            }
        };
        for record in waiting {
            let Some(pending) = record.value.request else {
                continue;
            };
            let covered = pending.tool_name == standing.tool_name
                && pending.job_id == standing.job_id
                && (standing.scope() == v1::ApprovalScope::ToolForJob
                    || pending.agent_id == standing.agent_id)
                && verify::request_error(signer, &pending).is_none();
            if covered {
                decide_standing(bus, approvals, journal, signer, &pending, standing).await;
            }
        }
    }
    Ok(decided)
}

/// [`decide`], recording the standing decision that decided it, if any.
async fn decide_as(
    bus: &Bus,
    approvals: &Approvals,
    journal: &Journal,
    signer: Option<&mtswarm_auth::DecisionSigner>,
    request: &v1::DecideApprovalRequest,
    standing_approval_id: Option<&str>,
) -> Result<Versioned<v1::ApprovalRecord>, DecideError> {
    crate::requests::check_decision(request).map_err(|e| DecideError::Invalid(e.0))?;
    let current = approvals
        .get(&request.approval_id)
        .await
        .map_err(DecideError::Bus)?
        .ok_or_else(|| DecideError::NotFound(request.approval_id.clone()))?;
    let current = as_worker_sees_it(signer, &current);
    let pending = current.value.request.clone().unwrap_or_default();
    let unverified = current
        .value
        .request
        .as_ref()
        .map_or(Some("the record holds no request".to_string()), |r| {
            verify::request_error(signer, r)
        });
    let verdict = Verdict::of(request, unverified.as_deref());
    if standing::is_standing(verdict.scope) && pending.risk() == v1::RiskLevel::High {
        return Err(DecideError::Invalid(format!(
            "`{}` is a high-risk tool: its calls are decided one at a time (scope {} refused)",
            pending.tool_name,
            verdict.scope.as_str_name()
        )));
    }
    let standing_scope = standing::is_standing(verdict.scope);
    let mut decision = decision_for(request, &pending, verdict, standing_approval_id);
    if let Some(signer) = signer {
        signer.sign(&mut decision).map_err(DecideError::Sign)?;
    }
    let decided = write_decision(approvals, &decision, &current).await?;
    if standing_scope {
        standing::remember(approvals, &decided.value).await;
    }
    announce(bus, journal, &decision).await;
    if let Some(reason) = unverified {
        return Err(DecideError::Unverified {
            approval_id: request.approval_id.clone(),
            reason,
        });
    }
    Ok(decided)
}

/// What a decision says: the request's verdict, scope and reason, unless
/// the stored request failed verification (then denied, for this call
/// only, and said so).
struct Verdict {
    verdict: v1::ApprovalVerdict,
    scope: v1::ApprovalScope,
    reason: String,
}

impl Verdict {
    fn of(request: &v1::DecideApprovalRequest, unverified: Option<&str>) -> Self {
        let Some(why) = unverified else {
            return Self {
                verdict: request.verdict(),
                scope: request.scope(),
                reason: request.reason.clone(),
            };
        };
        // Never approved, never standing: denied and said so.
        tracing::warn!(approval_id = %request.approval_id, reason = %why, "decision on an approval that failed verification: denied");
        Self {
            verdict: v1::ApprovalVerdict::Deny,
            scope: v1::ApprovalScope::Call,
            reason: format!("the request failed verification: {why}"),
        }
    }
}

/// The decision on `pending`, naming the call exactly (tool, canonical
/// arguments, risk) so the worker applies it to nothing else; unsigned.
fn decision_for(
    request: &v1::DecideApprovalRequest,
    pending: &v1::ApprovalRequest,
    verdict: Verdict,
    standing_approval_id: Option<&str>,
) -> v1::ApprovalDecision {
    v1::ApprovalDecision {
        approval_id: request.approval_id.clone(),
        reason: verdict.reason,
        decided_by: if request.decided_by.is_empty() {
            "anonymous".to_string()
        } else {
            request.decided_by.clone()
        },
        decided_at: Some(prost_types::Timestamp::from(SystemTime::now())),
        scope: if standing::is_standing(verdict.scope) {
            verdict.scope as i32
        } else {
            v1::ApprovalScope::Call as i32
        },
        standing_approval_id: standing_approval_id.unwrap_or_default().to_string(),
        // The call itself, as its worker signed it: applied to nothing else.
        ..mtswarm_auth::ApprovedCall::of(pending).decision(verdict.verdict)
    }
}

/// Writes the decision over the record as read (CAS): the first decision
/// stands, a later one is refused with the state it found.
async fn write_decision(
    approvals: &Approvals,
    decision: &v1::ApprovalDecision,
    current: &Versioned<v1::ApprovalRecord>,
) -> Result<Versioned<v1::ApprovalRecord>, DecideError> {
    match approvals.decide_at(decision, current).await {
        Ok(decided) => Ok(decided),
        Err(BusError::AlreadyDecided { approval_id, state }) => {
            Err(DecideError::AlreadyDecided { approval_id, state })
        }
        Err(BusError::CasConflict { .. }) => {
            // Another decision landed between the read and the write.
            let state = approvals
                .get(&decision.approval_id)
                .await
                .ok()
                .flatten()
                .map(|r| r.value.state().as_str_name().to_string())
                .unwrap_or_else(|| "changed concurrently".into());
            Err(DecideError::AlreadyDecided {
                approval_id: decision.approval_id.clone(),
                state,
            })
        }
        Err(BusError::InvalidDecision { reason, .. }) => {
            Err(DecideError::Invalid(reason.to_string()))
        }
        Err(error) => Err(DecideError::Bus(error)),
    }
}

/// Publishes the decision to the waiting session and journals it in its
/// job; the stored record holds it either way.
async fn announce(bus: &Bus, journal: &Journal, decision: &v1::ApprovalDecision) {
    if !decision.session_id.is_empty()
        && let Err(error) = bus.publish_approval_decision(decision).await
    {
        // The record holds the decision; a session can also read it from KV.
        tracing::warn!(%error, approval_id = %decision.approval_id, "decision not published");
    }
    if !decision.job_id.is_empty()
        && let Err(error) = journal
            .append(
                &decision.job_id,
                v1::job_event::Event::ApprovalDecided(decision.clone()),
            )
            .await
    {
        tracing::warn!(%error, "approval decision not journaled");
    }
}
