//! Jobs as every suite drives them through the leader's Control service:
//! the spec of a test job, submitting it, reading its record and its whole
//! WatchJob stream, picking results and agent events out of that stream,
//! and reading the job's measurement records from the results store. The end-to-end, chaos, trace and real-model tests share one copy
//! so that they all read a job the same way, over whichever client they
//! hold (plain, with trace context, with a bearer token).

use std::time::Duration;

use mtswarm_bus::results::{ResultQuery, ResultRecord, ResultsStore};
use mtswarm_bus::{Bus, BusConfig};
use mtswarm_proto::v1;
use mtswarm_proto::v1::control_client::ControlClient;
use tokio_stream::StreamExt as _;

use crate::stack::{GrpcTransport, TestStack};

/// A job on `kernel_dir` with a ten-minute wall-time budget, `num_agents`
/// agents (0: the leader decides) and no shell.
pub fn job_spec(goal: &str, kernel_dir: &str, num_agents: u32, auto_approve: bool) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: kernel_dir.to_string(),
        slice_selector: String::new(),
        budgets: Some(v1::Budgets {
            wall_time_seconds: 600,
            ..Default::default()
        }),
        num_agents,
        model: None,
        auto_approve,
        allow_shell: false,
        approval_rules: Vec::new(),
    }
}

/// Submits `spec` (no idempotency key) and returns the new job's id;
/// panics when the leader refuses it.
pub async fn submit<T: GrpcTransport>(control: &mut ControlClient<T>, spec: v1::JobSpec) -> String {
    control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: String::new(),
        })
        .await
        .expect("SubmitJob accepted")
        .into_inner()
        .job_id
}

/// The job's record, or the leader's refusal (`None`: answered without one).
pub async fn try_get_job<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    job_id: &str,
) -> Result<Option<v1::JobRecord>, tonic::Status> {
    control
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_string(),
        })
        .await
        .map(|response| response.into_inner().job)
}

/// The job's record; panics when there is none.
pub async fn get_job<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    job_id: &str,
) -> v1::JobRecord {
    try_get_job(control, job_id)
        .await
        .expect("GetJob")
        .expect("a job record")
}

/// Every job ListJobs lists, all pages (a page token repeated ends it).
pub async fn list_all_jobs<T: GrpcTransport>(control: &mut ControlClient<T>) -> Vec<v1::JobRecord> {
    let mut jobs = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = control
            .list_jobs(v1::ListJobsRequest {
                states: Vec::new(),
                page_size: 0,
                page_token: page_token.clone(),
            })
            .await
            .expect("ListJobs")
            .into_inner();
        jobs.extend(page.jobs);
        if page.next_page_token.is_empty() || page.next_page_token == page_token {
            return jobs;
        }
        page_token = page.next_page_token;
    }
}

/// Whether a job in `state` has ended (it never changes again).
pub fn is_final(state: v1::JobState) -> bool {
    matches!(
        state,
        v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
    )
}

/// Reads the job's stream from the start until it ends (the job is final),
/// at most `timeout`; panics after that with the last events and
/// `context()` (e.g. process logs).
pub async fn watch_to_end<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    job_id: &str,
    timeout: Duration,
    context: impl Fn() -> String,
) -> Vec<v1::JobEvent> {
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: 0,
        })
        .await
        .expect("WatchJob")
        .into_inner();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!(
                "job {job_id} not final within {timeout:?}; last events: {:#?}\n{}",
                &events[events.len().saturating_sub(10)..],
                context()
            ),
            Ok(None) => return events,
            Ok(Some(Err(status))) => panic!("WatchJob failed: {status}"),
            Ok(Some(Ok(event))) => events.push(event),
        }
    }
}

/// The task results on a job's stream: the results the leader accepted.
pub fn task_results(events: &[v1::JobEvent]) -> Vec<v1::TaskResult> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::TaskResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

/// The agent events on a job's stream (workers' and the leader's own).
pub fn agent_events(events: &[v1::JobEvent]) -> Vec<v1::AgentEvent> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::AgentEvent(a)) => Some(a.clone()),
            _ => None,
        })
        .collect()
}

/// The job's approvals in any of `states` (none: in every state).
pub async fn approvals<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    job_id: &str,
    states: &[v1::ApprovalState],
) -> Vec<v1::ApprovalRecord> {
    control
        .list_approvals(v1::ListApprovalsRequest {
            job_id: job_id.to_string(),
            states: states.iter().map(|s| *s as i32).collect(),
        })
        .await
        .expect("ListApprovals")
        .into_inner()
        .approvals
}

/// Decides approval `approval_id` with `verdict` as `decided_by`: the
/// decided record, or the leader's refusal (e.g. decided already).
pub async fn decide_approval<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
    decided_by: &str,
) -> Result<v1::ApprovalRecord, tonic::Status> {
    decide_approval_for(
        control,
        approval_id,
        verdict,
        reason,
        decided_by,
        v1::ApprovalScope::Call,
    )
    .await
}

/// [`decide_approval`] with a scope: this call, or every later call of the
/// tool in the job or by the agent.
pub async fn decide_approval_for<T: GrpcTransport>(
    control: &mut ControlClient<T>,
    approval_id: &str,
    verdict: v1::ApprovalVerdict,
    reason: &str,
    decided_by: &str,
    scope: v1::ApprovalScope,
) -> Result<v1::ApprovalRecord, tonic::Status> {
    control
        .decide_approval(v1::DecideApprovalRequest {
            approval_id: approval_id.to_string(),
            verdict: verdict as i32,
            reason: reason.to_string(),
            decided_by: decided_by.to_string(),
            scope: scope as i32,
        })
        .await
        .map(|r| r.into_inner().approval.expect("the decided record"))
}

/// Every measurement record of `job_id` in `stack`'s results store (at
/// most 10,000), in stream order.
pub async fn job_records(stack: &TestStack, job_id: &str) -> Vec<ResultRecord> {
    let bus = Bus::connect(BusConfig::new(stack.nats.url()))
        .await
        .expect("connect to NATS");
    let store = ResultsStore::open(&bus).await.expect("results store");
    let records = store
        .query(&ResultQuery {
            job_id: Some(job_id.to_string()),
            limit: 10_000,
            ..ResultQuery::default()
        })
        .await
        .expect("query the job's records");
    let _ = bus.drain().await;
    records
}
