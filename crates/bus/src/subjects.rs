//! Every NATS subject, stream, consumer and KV bucket name mtswarm uses, in
//! one place, laid out per role so server permissions can confine identities:
//! a worker subscribes only to `mtswarm.task.<its worker id>.>` and publishes
//! only results, events, approval requests, and its KV keys.
//!
//! | name | kind | publisher | consumer | payload | notes |
//! |---|---|---|---|---|---|
//! | `mtswarm.task.<worker_id>.<slice_id>` | JetStream subject, stream `MTSWARM_TASKS` | leader | worker daemon (durable pull consumer `tasks-<worker_id>[-<slice_id>]`) | `TaskAssignment` | work-queue retention; `Nats-Msg-Id` = `<task_id>.<attempt>` dedupes within the duplicate window |
//! | `mtswarm.result.<job_id>` | JetStream subject, stream `MTSWARM_RESULTS` | worker | leader (durable pull consumer `results-<name>`) | `TaskResult` | limits retention; `Nats-Msg-Id` = `<task_id>.<attempt>` |
//! | `mtswarm.event.<job_id>.<agent_id>` | core NATS, captured by stream `MTSWARM_EVENTS` | worker, leader | the job journal (`MTSWARM_JOB_EVENTS` sources the stream into `mtswarm.jobevent.<job_id>.agents`, `WatchJob`), replay from the stream | `AgentEvent`, or `AgentEventBatch` (consecutive events of one session in one message) | limits: max age, max bytes, discard old |
//! | `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>` | JetStream subject, stream `MTSWARM_MEASUREMENTS` | worker | results store queries (ordered consumers) | `ResultRecord` (JSON) | limits retention, size-capped, `Nats-Msg-Id` = record id; see [`crate::results`] |
//! | `mtswarm.approval.request.<job_id>` | core NATS | worker | leader | `ApprovalRequest` | notification; the record lives in KV `mtswarm_approvals` |
//! | `mtswarm.approval.decision.<session_id>` | core NATS | leader | worker running the session | `ApprovalDecision` | notification; the record lives in KV `mtswarm_approvals` |
//! | `mtswarm_leases` (`$KV.mtswarm_leases.<slice_id>`, `$KV.mtswarm_leases.daemon.<worker_id>`) | KV bucket | worker | leader, workers | `SliceLease`, `DaemonLease` | one liveness key per daemon (per-key TTL, CAS renewals; lapse = expiry marker) keeps its slice claims, which are written only when they change |
//! | `mtswarm_workers` (`$KV.mtswarm_workers.<worker_id>`) | KV bucket | worker | leader | `WorkerRecord` | per-key TTL, fleet membership |
//! | `mtswarm_quarantine` (`$KV.mtswarm_quarantine.<slice_id>`) | KV bucket | worker, leader | leader | `SliceQuarantine` | |
//! | `mtswarm_jobs` (`$KV.mtswarm_jobs.<job_id>`, parts under `<job_id>.agent.<agent_id>`, `<job_id>.task.<task_id>`, `<job_id>.loop`) | KV bucket | leader | leader | `JobRecord`, `AgentPlacement`, `TaskRecord`, `LeaderCheckpoint` | CAS updates |
//! | `mtswarm_job_owners` (`$KV.mtswarm_job_owners.<job_id>`) | KV bucket | leader | leaders | `JobOwner` | per-key TTL, renewed by the owning leader with CAS; lapse = another leader takes the job |
//! | `mtswarm_checkpoints` (`$KV.mtswarm_checkpoints.<session_id>`, its history's messages at `<session_id>.m.<nonce>.<index>`) | KV bucket | worker | worker (resume) | `SessionCheckpoint` | latest only (history 1) |
//! | `mtswarm_approvals` (`$KV.mtswarm_approvals.<approval_id>`) | KV bucket | worker (request), leader (decision) | both | `ApprovalRecord` | decisions by CAS |
//!
//! Ids used as subject tokens, consumer names or KV keys must match
//! `[A-Za-z0-9_-]{1,128}` (see [`validate_id`]); UUIDs and names like
//! `board3-c1` qualify. JetStream API access (`$JS.API.>`, `$JS.ACK.>`) and
//! `_INBOX.>` must also be allowed for every identity.

use crate::error::BusError;

/// Common prefix of all mtswarm subjects.
pub const PREFIX: &str = "mtswarm";

/// Stream holding task assignments (work queue: a task is removed once acked).
pub const TASKS_STREAM: &str = "MTSWARM_TASKS";
/// Stream holding task results.
pub const RESULTS_STREAM: &str = "MTSWARM_RESULTS";
/// Stream capturing agent events for replay (`WatchJob` with `from_sequence`).
pub const EVENTS_STREAM: &str = "MTSWARM_EVENTS";
/// Stream holding every measured candidate (the results store, [`crate::results`]).
pub const MEASUREMENTS_STREAM: &str = "MTSWARM_MEASUREMENTS";

/// KV bucket: slice leases (key = slice id).
pub const LEASES_BUCKET: &str = "mtswarm_leases";
/// KV bucket: worker daemon membership (key = worker id).
pub const WORKERS_BUCKET: &str = "mtswarm_workers";
/// KV bucket: quarantined slices (key = slice id).
pub const QUARANTINE_BUCKET: &str = "mtswarm_quarantine";
/// KV bucket: job records (key = job id).
pub const JOBS_BUCKET: &str = "mtswarm_jobs";
/// KV bucket: job ownership leases of the leaders (key = job id; per-key
/// TTL, see [`crate::ownership`]).
pub const JOB_OWNERS_BUCKET: &str = "mtswarm_job_owners";
/// KV bucket: latest session checkpoint (key = session id).
pub const CHECKPOINTS_BUCKET: &str = "mtswarm_checkpoints";
/// KV bucket: approval records (key = approval id).
pub const APPROVALS_BUCKET: &str = "mtswarm_approvals";

/// Wildcard covering every task subject (stream subject filter).
pub const ALL_TASKS: &str = "mtswarm.task.>";
/// Wildcard covering every result subject.
pub const ALL_RESULTS: &str = "mtswarm.result.>";
/// Wildcard covering every event subject.
pub const ALL_EVENTS: &str = "mtswarm.event.>";
/// Wildcard covering every stored measurement
/// (`mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>`).
pub const ALL_MEASUREMENTS: &str = "mtswarm.measurement.>";
/// Wildcard covering every approval request.
pub const ALL_APPROVAL_REQUESTS: &str = "mtswarm.approval.request.>";

/// Maximum length of an id used in subjects, consumer names and keys.
pub const MAX_ID_LEN: usize = 128;

/// Checks that `value` can be used as a subject token, consumer name and KV
/// key: 1..=128 characters from `[A-Za-z0-9_-]`.
pub fn validate_id(kind: &'static str, value: &str) -> Result<(), BusError> {
    let invalid = |reason| BusError::InvalidId {
        kind,
        value: value.chars().take(MAX_ID_LEN + 8).collect(),
        reason,
    };
    if value.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if value.len() > MAX_ID_LEN {
        return Err(invalid("longer than 128 characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "only ASCII letters, digits, '_' and '-' are allowed",
        ));
    }
    Ok(())
}

/// `mtswarm.task.<worker_id>.<slice_id>`: where the leader sends a task for a slice.
pub fn task(worker_id: &str, slice_id: &str) -> Result<String, BusError> {
    validate_id("worker id", worker_id)?;
    validate_id("slice id", slice_id)?;
    Ok(format!("{PREFIX}.task.{worker_id}.{slice_id}"))
}

/// `mtswarm.task.<worker_id>.>`: every task for one worker daemon.
pub fn tasks_for_worker(worker_id: &str) -> Result<String, BusError> {
    validate_id("worker id", worker_id)?;
    Ok(format!("{PREFIX}.task.{worker_id}.>"))
}

/// `mtswarm.result.<job_id>`: where workers publish a job's results.
pub fn result(job_id: &str) -> Result<String, BusError> {
    validate_id("job id", job_id)?;
    Ok(format!("{PREFIX}.result.{job_id}"))
}

/// `mtswarm.event.<job_id>.<agent_id>`: one agent's progress events.
pub fn event(job_id: &str, agent_id: &str) -> Result<String, BusError> {
    validate_id("job id", job_id)?;
    validate_id("agent id", agent_id)?;
    Ok(format!("{PREFIX}.event.{job_id}.{agent_id}"))
}

/// `mtswarm.event.<job_id>.>`: all events of one job.
pub fn events_for_job(job_id: &str) -> Result<String, BusError> {
    validate_id("job id", job_id)?;
    Ok(format!("{PREFIX}.event.{job_id}.>"))
}

/// `mtswarm.approval.request.<job_id>`: approval requests of one job.
pub fn approval_request(job_id: &str) -> Result<String, BusError> {
    validate_id("job id", job_id)?;
    Ok(format!("{PREFIX}.approval.request.{job_id}"))
}

/// `mtswarm.approval.decision.<session_id>`: decisions for one session.
pub fn approval_decision(session_id: &str) -> Result<String, BusError> {
    validate_id("session id", session_id)?;
    Ok(format!("{PREFIX}.approval.decision.{session_id}"))
}

/// Durable consumer name of a worker's task consumer.
pub fn task_consumer_name(worker_id: &str, slice_id: Option<&str>) -> Result<String, BusError> {
    validate_id("worker id", worker_id)?;
    match slice_id {
        Some(slice_id) => {
            validate_id("slice id", slice_id)?;
            Ok(format!("tasks-{worker_id}-{slice_id}"))
        }
        None => Ok(format!("tasks-{worker_id}")),
    }
}

/// Durable consumer name of a result consumer.
pub fn result_consumer_name(name: &str) -> Result<String, BusError> {
    validate_id("result consumer name", name)?;
    Ok(format!("results-{name}"))
}

/// `Nats-Msg-Id` of a task assignment or result: `<task_id>.<attempt>`, so a
/// re-publish of the same attempt is dropped and a new attempt is not.
pub fn message_id(task_id: &str, attempt: u32) -> String {
    format!("{task_id}.{attempt}")
}

/// `Nats-Msg-Id` of a result: `<task_id>.<attempt>`, followed by
/// `.<result_token>` when the attempt has one. Only the worker the attempt
/// was placed on knows the token, so a forged result can never take the
/// genuine one's id (and get the genuine one dropped as a duplicate).
pub fn result_message_id(result: &crate::v1::TaskResult) -> String {
    let id = message_id(&result.task_id, result.attempt);
    if result.result_token.is_empty() {
        id
    } else {
        format!("{id}.{}", result.result_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_documented_layout() {
        assert_eq!(task("w1", "b0-c2").unwrap(), "mtswarm.task.w1.b0-c2");
        assert_eq!(tasks_for_worker("w1").unwrap(), "mtswarm.task.w1.>");
        assert_eq!(result("j1").unwrap(), "mtswarm.result.j1");
        assert_eq!(event("j1", "a7").unwrap(), "mtswarm.event.j1.a7");
        assert_eq!(events_for_job("j1").unwrap(), "mtswarm.event.j1.>");
        assert_eq!(
            approval_request("j1").unwrap(),
            "mtswarm.approval.request.j1"
        );
        assert_eq!(
            approval_decision("s1").unwrap(),
            "mtswarm.approval.decision.s1"
        );
        assert_eq!(message_id("t1", 2), "t1.2");
        assert_eq!(task_consumer_name("w1", Some("s3")).unwrap(), "tasks-w1-s3");
    }

    #[test]
    fn ids_that_would_break_subjects_are_rejected() {
        for bad in ["", "a.b", "a*", "a>", "a b", "ä", &"x".repeat(129)] {
            let error = task("w1", bad).expect_err(bad);
            assert!(
                matches!(
                    error,
                    BusError::InvalidId {
                        kind: "slice id",
                        ..
                    }
                ),
                "{error}"
            );
        }
        validate_id("job id", "0196f1c2-6b1e-7c3a-9d2e-1a2b3c4d5e6f").expect("uuid is valid");
    }
}
