//! The `Control` gRPC service (control.proto): the job manager's front door.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
use mtswarm_auth::{Identity, Role, require, require_any};
use mtswarm_bus::{BusError, v1};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::approvals::{DecideError, decide};
use crate::host::JobHost;
use crate::job_manager::{JobManager, SubmitError};
use crate::journal::WATCH_IDLE_CHECK;
use crate::requests;
use crate::runner::{self, is_final};

/// Roles that may read jobs (get, list, watch): a submitter its own only
/// ([`may_read`]).
const READ_JOBS: &[Role] = &[Role::Submit, Role::Read, Role::Admin];

/// Whether `identity` may read `job` and its events and approvals: its
/// own (it submitted it), or every job with the `read` or `admin` role.
fn may_read(identity: &Identity, job: &v1::JobRecord) -> bool {
    reads_every_job(identity) || job.submitted_by == identity.name
}

/// The identity reads every job (`read` or `admin`).
fn reads_every_job(identity: &Identity) -> bool {
    identity.has(Role::Read) || identity.has(Role::Admin)
}

/// PERMISSION_DENIED for a job another identity submitted.
fn not_yours(job_id: &str, identity: &Identity) -> Status {
    tracing::warn!(job.id = %job_id, identity = %identity.name, "read of another identity's job refused");
    Status::permission_denied(format!(
        "job {job_id} was submitted by another identity; reading it needs the `read` or `admin` role"
    ))
}
/// Events buffered per WatchJob stream before the reader is waited for.
const WATCH_BUFFER: usize = 256;
/// How long CancelJob waits for the runner to record the cancellation.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

pub(crate) struct ControlService {
    pub(crate) host: Arc<JobHost>,
    /// Admits the jobs this service is asked to run.
    pub(crate) jobs: JobManager,
}

/// A refused submission as the caller sees it.
fn submit_status(error: SubmitError) -> Status {
    match error {
        SubmitError::Endpoint(_) | SubmitError::Invalid(_) | SubmitError::KeyTooLong => {
            Status::invalid_argument(error.to_string())
        }
        SubmitError::Busy(_) => Status::resource_exhausted(error.to_string()),
        SubmitError::Ownership { .. } => Status::unavailable(error.to_string()),
        SubmitError::Bus(error) => bus_status(*error),
    }
}

fn bus_status(error: BusError) -> Status {
    match error {
        BusError::InvalidId { .. } => Status::invalid_argument(error.to_string()),
        BusError::NotFound { .. } => Status::not_found(error.to_string()),
        other => Status::unavailable(other.to_string()),
    }
}

fn check_job_id(job_id: &str) -> Result<(), Status> {
    Ok(requests::check_job_id(job_id)?)
}

/// A job as `ListJobs` answers it: the stored record alone. One written by
/// an earlier leader that still embeds its agents, tasks and loop state is
/// answered without them too (their number kept in `agents_total`), so a
/// listing's size does not depend on which leader wrote the records.
fn listed(mut job: v1::JobRecord) -> v1::JobRecord {
    mtswarm_bus::jobs::strip_parts(&mut job);
    job
}

fn timestamp_key(t: &Option<prost_types::Timestamp>) -> (i64, i32) {
    t.as_ref().map(|t| (t.seconds, t.nanos)).unwrap_or_default()
}

impl ControlService {
    /// The job's record with its agents, tasks and loop state (read from
    /// their keys for this one job).
    async fn read_job(&self, job_id: &str) -> Result<v1::JobRecord, Status> {
        check_job_id(job_id)?;
        self.host
            .stores
            .jobs
            .assembled(job_id)
            .await
            .map_err(bus_status)?
            .ok_or_else(|| Status::not_found(format!("job {job_id} not found")))
    }

    /// The job's stored record alone (state, owner, counts).
    async fn stored_job(&self, job_id: &str) -> Result<v1::JobRecord, Status> {
        check_job_id(job_id)?;
        self.host
            .stores
            .jobs
            .get(job_id)
            .await
            .map_err(bus_status)?
            .map(|v| v.value)
            .ok_or_else(|| Status::not_found(format!("job {job_id} not found")))
    }
}

/// Resolves once the daemon shuts down (or the signal is gone).
async fn stopped(shutdown: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, Status>> + Send>>;

#[tonic::async_trait]
impl v1::control_server::Control for ControlService {
    async fn submit_job(
        &self,
        request: Request<v1::SubmitJobRequest>,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let span = tracing::info_span!(
            "SubmitJob",
            otel.kind = "server",
            rpc.system = "grpc",
            job.id = tracing::field::Empty,
        );
        if let Err(error) =
            mtswarm_telemetry::grpc::set_parent_from_metadata(&span, request.metadata())
        {
            tracing::debug!(%error, "SubmitJob trace context not applied");
        }
        let identity = require(&request, Role::Submit)?;
        let submitted = self
            .jobs
            .submit(request.into_inner(), identity.name, &span)
            .instrument(span.clone())
            .await
            .map_err(submit_status)?;
        Ok(Response::new(v1::SubmitJobResponse {
            job_id: submitted.job_id,
            trace_id: submitted.trace_id,
        }))
    }

    async fn get_job(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Response<v1::GetJobResponse>, Status> {
        let identity = require_any(&request, READ_JOBS)?;
        let job = self.read_job(&request.get_ref().job_id).await?;
        if !may_read(&identity, &job) {
            return Err(not_yours(&job.job_id, &identity));
        }
        Ok(Response::new(v1::GetJobResponse { job: Some(job) }))
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Response<v1::ListJobsResponse>, Status> {
        let identity = require_any(&request, READ_JOBS)?;
        let request = request.into_inner();
        let requests::Page {
            offset,
            size: page_size,
        } = requests::list_jobs_page(&request)?;
        let mut jobs: Vec<v1::JobRecord> = self
            .host
            .stores
            .jobs
            .list()
            .await
            .map_err(bus_status)?
            .into_iter()
            .map(|v| listed(v.value))
            .filter(|job| may_read(&identity, job))
            .filter(|job| request.states.is_empty() || request.states.contains(&job.state))
            .collect();
        // Newest first; the id breaks ties so pages are stable.
        jobs.sort_by(|a, b| {
            timestamp_key(&b.created_at)
                .cmp(&timestamp_key(&a.created_at))
                .then_with(|| a.job_id.cmp(&b.job_id))
        });
        let total = jobs.len();
        let page: Vec<v1::JobRecord> = jobs.into_iter().skip(offset).take(page_size).collect();
        let next = offset + page.len();
        Ok(Response::new(v1::ListJobsResponse {
            jobs: page,
            next_page_token: if next < total {
                next.to_string()
            } else {
                String::new()
            },
        }))
    }

    type WatchJobStream = WatchStream;

    async fn watch_job(
        &self,
        request: Request<v1::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let identity = require_any(&request, READ_JOBS)?;
        let request = request.into_inner();
        let job_id = request.job_id.clone();
        let stored = self.stored_job(&job_id).await?;
        if !may_read(&identity, &stored) {
            return Err(not_yours(&job_id, &identity));
        }
        let mut shutdown = self.host.shutdown.clone();
        // Opening waits out a stream leader election (up to half a minute),
        // but never the daemon's shutdown.
        let mut events = tokio::select! {
            opened = self.host.stores.journal.watch(&job_id, request.from_sequence) => {
                opened.map_err(|e| Status::unavailable(e.to_string()))?
            }
            () = stopped(&mut shutdown) => {
                return Err(Status::unavailable("the leader is shutting down; watch again"));
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        let host = self.host.clone();
        tokio::spawn(async move {
            let mut last_sequence = 0;
            loop {
                let next = tokio::select! {
                    next = tokio::time::timeout(WATCH_IDLE_CHECK, events.next()) => next,
                    () = stopped(&mut shutdown) => {
                        let _ = tx
                            .send(Err(Status::unavailable(
                                "the leader is shutting down; watch again with from_sequence = last sequence + 1",
                            )))
                            .await;
                        return;
                    }
                };
                match next {
                    Ok(Some(Ok(event))) => {
                        last_sequence = event.sequence;
                        let ends = matches!(
                            &event.event,
                            Some(v1::job_event::Event::StateChange(change)) if is_final(change.current())
                        );
                        if tx.send(Ok(event)).await.is_err() || ends {
                            return;
                        }
                    }
                    Ok(Some(Err(error))) => {
                        let _ = tx.send(Err(Status::unavailable(error.to_string()))).await;
                        return;
                    }
                    Ok(None) => {
                        let _ = tx
                            .send(Err(Status::unavailable("job event stream ended")))
                            .await;
                        return;
                    }
                    Err(_) => {
                        if tx.is_closed() {
                            return;
                        }
                        // Silence: the job may have ended before `from_sequence`
                        // or its final entry aged out of the journal.
                        let record = match host.stores.jobs.get(&job_id).await {
                            Ok(Some(record)) => record.value,
                            _ => continue,
                        };
                        if is_final(record.state()) {
                            let _ = tx
                                .send(Ok(v1::JobEvent {
                                    job_id: job_id.clone(),
                                    sequence: last_sequence,
                                    timestamp: record.finished_at,
                                    event: Some(v1::job_event::Event::StateChange(
                                        v1::JobStateChange {
                                            previous: v1::JobState::Unspecified as i32,
                                            current: record.state,
                                            reason: "final state (from the job record)".into(),
                                            outcome: record.outcome.clone(),
                                        },
                                    )),
                                }))
                                .await;
                            return;
                        }
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel_job(
        &self,
        request: Request<v1::CancelJobRequest>,
    ) -> Result<Response<v1::CancelJobResponse>, Status> {
        let identity = require_any(&request, &[Role::Submit, Role::Admin])?;
        let request = request.into_inner();
        let record = self.stored_job(&request.job_id).await?;
        if !identity.has(Role::Admin) && record.submitted_by != identity.name {
            tracing::warn!(job.id = %request.job_id, identity = %identity.name, "cancel of another identity's job refused");
            return Err(Status::permission_denied(format!(
                "job {} was submitted by another identity; cancelling it needs the `admin` role",
                request.job_id
            )));
        }
        if is_final(record.state()) {
            return Ok(Response::new(v1::CancelJobResponse {
                state: record.state,
            }));
        }
        let reason = if request.reason.is_empty() {
            "cancelled by request".to_string()
        } else {
            request.reason.clone()
        };
        let done = self.host.tables.runners.get(&request.job_id).map(|runner| {
            runner.cancel(&reason);
            runner.done()
        });
        match done {
            Some(mut done) => {
                let _ = tokio::time::timeout(CANCEL_WAIT, done.wait_for(|d| *d)).await;
            }
            None => {
                // No runner in this process (queued here, run by another
                // leader, or left by a dead one): it never starts now. A
                // job another leader runs is cancelled through its record,
                // which its owner watches (`runner/ownership.rs`).
                let fence = self.host.ownerships.fence(&request.job_id);
                let queued_here = self.host.tables.scheduler.remove_queued(&request.job_id);
                if let Some(queued) = &queued_here {
                    // A job resumed after a restart may have agents running.
                    self.host
                        .placement
                        .cancel_all_agents(&queued.context, "job cancelled")
                        .await;
                    self.host.tables.results.remove(&request.job_id);
                }
                runner::transition(
                    &self.host,
                    &request.job_id,
                    fence.as_ref(),
                    v1::JobState::Cancelled,
                    &format!("cancelled: {reason}"),
                    |r| {
                        r.finished_at = Some(prost_types::Timestamp::from(SystemTime::now()));
                        r.error = reason.clone();
                    },
                )
                .await;
                if queued_here.is_some() {
                    self.host.ownerships.release(&request.job_id).await;
                }
            }
        }
        let record = self.stored_job(&request.job_id).await?;
        Ok(Response::new(v1::CancelJobResponse {
            state: record.state,
        }))
    }

    async fn list_fleet(
        &self,
        request: Request<v1::ListFleetRequest>,
    ) -> Result<Response<v1::ListFleetResponse>, Status> {
        require(&request, Role::Admin)?;
        let selector = requests::list_fleet_selector(request.get_ref())?;
        let host = &self.host;
        let view = host
            .placement
            .fleet_view(selector.as_ref())
            .await
            .map_err(bus_status)?;
        Ok(Response::new(v1::ListFleetResponse {
            slices: view.slices,
            workers: view.workers,
        }))
    }

    async fn list_approvals(
        &self,
        request: Request<v1::ListApprovalsRequest>,
    ) -> Result<Response<v1::ListApprovalsResponse>, Status> {
        let identity = require_any(
            &request,
            &[Role::Approve, Role::Submit, Role::Read, Role::Admin],
        )?;
        let request = request.into_inner();
        let job_id = requests::approvals_job_id(&request)?;
        // Approvers decide every job's calls; a submitter sees its own
        // jobs' only (their arguments are its business alone).
        let every_job = identity.has(Role::Approve) || reads_every_job(&identity);
        if let Some(job_id) = job_id
            && !every_job
            && !may_read(&identity, &self.stored_job(job_id).await?)
        {
            return Err(not_yours(job_id, &identity));
        }
        let states = requests::approval_states(&request)?;
        // A record that fails verification is not decided, whatever it
        // says: a listing of pending ones shows it too (as unverified).
        let wants_pending = states.is_empty() || states.contains(&v1::ApprovalState::Pending);
        let read_states: Vec<v1::ApprovalState> = if wants_pending {
            Vec::new()
        } else {
            states.clone()
        };
        let mut approvals: Vec<v1::ApprovalRecord> = self
            .host
            .stores
            .approvals
            .list(job_id, &read_states)
            .await
            .map_err(bus_status)?
            .into_iter()
            .map(|v| v.value)
            .collect();
        if !every_job {
            let mut owners: std::collections::HashMap<String, bool> = Default::default();
            let mut mine = Vec::with_capacity(approvals.len());
            for approval in approvals {
                let job_id = approval
                    .request
                    .as_ref()
                    .map(|r| r.job_id.clone())
                    .unwrap_or_default();
                let readable = match owners.get(&job_id) {
                    Some(readable) => *readable,
                    None => {
                        let readable = match self.host.stores.jobs.get(&job_id).await {
                            Ok(Some(job)) => may_read(&identity, &job.value),
                            _ => false,
                        };
                        owners.insert(job_id, readable);
                        readable
                    }
                };
                if readable {
                    mine.push(approval);
                }
            }
            approvals = mine;
        }
        // What the leader believes of each record, for whoever reads it.
        let signer = self.host.keys.decision();
        for approval in &mut approvals {
            approval.verification_error =
                crate::approvals::verify::verification_error(signer, approval).unwrap_or_default();
        }
        approvals.retain(|a| {
            states.is_empty()
                || states.contains(&a.state())
                || (wants_pending && !a.verification_error.is_empty())
        });
        approvals.sort_by_key(|a| {
            a.request
                .as_ref()
                .map(|r| (timestamp_key(&r.requested_at), r.approval_id.clone()))
        });
        Ok(Response::new(v1::ListApprovalsResponse { approvals }))
    }

    async fn decide_approval(
        &self,
        request: Request<v1::DecideApprovalRequest>,
    ) -> Result<Response<v1::DecideApprovalResponse>, Status> {
        let identity = require(&request, Role::Approve)?;
        let host = &self.host;
        // The decider is who the credential says, whatever the request
        // wrote (a server without identities keeps the request's name).
        let mut request = request.into_inner();
        if identity.authenticated || request.decided_by.is_empty() {
            request.decided_by = identity.name;
        }
        match decide(
            &host.stores.bus,
            &host.stores.approvals,
            &host.stores.journal,
            host.keys.decision(),
            &request,
        )
        .await
        {
            Ok(record) => Ok(Response::new(v1::DecideApprovalResponse {
                approval: Some(record.value),
            })),
            Err(error @ DecideError::Invalid(_)) => {
                Err(Status::invalid_argument(error.to_string()))
            }
            Err(error @ DecideError::NotFound(_)) => Err(Status::not_found(error.to_string())),
            Err(error @ DecideError::AlreadyDecided { .. }) => {
                Err(Status::failed_precondition(error.to_string()))
            }
            Err(DecideError::Bus(error)) => Err(bus_status(error)),
            Err(error @ DecideError::Sign(_)) => Err(Status::internal(error.to_string())),
            Err(error @ DecideError::Unverified { .. }) => {
                Err(Status::failed_precondition(error.to_string()))
            }
        }
    }

    async fn lift_quarantine(
        &self,
        request: Request<v1::LiftQuarantineRequest>,
    ) -> Result<Response<v1::LiftQuarantineResponse>, Status> {
        require(&request, Role::Admin)?;
        let request = request.into_inner();
        let slice_id = requests::quarantined_slice(&request)?;
        let quarantine = &self.host.stores.quarantine;
        let previous = quarantine
            .get(slice_id)
            .await
            .map_err(bus_status)?
            .map(|v| v.value);
        if previous.is_some() {
            quarantine.lift(slice_id).await.map_err(bus_status)?;
            tracing::info!(slice.id = slice_id, reason = %request.reason, "quarantine lifted");
        }
        Ok(Response::new(v1::LiftQuarantineResponse {
            lifted: previous.is_some(),
            previous,
        }))
    }
}
