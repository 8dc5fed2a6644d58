//! The job manager: admits a submission (the model endpoint against the
//! allowlist, the spec, a run place, the job's ownership, its record) and
//! then starts or queues its runner. The `Control` service only translates:
//! a request in, a [`Submitted`] or a [`SubmitError`] out.
//!
//! What an admission takes before its record exists (a place with the
//! scheduler, the ownership lease) is held by an [`Admission`] guard: any
//! way out before [`Admission::commit`], an error or a retried submission
//! found on the way, gives both back, so no exit has to remember a rollback.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mtswarm_bus::{BusError, Fence, OwnershipError, v1};
use sha2::{Digest as _, Sha256};

use crate::host::JobHost;
use crate::job::PendingStart;
use crate::runner;
use crate::scheduler::Ticket;
use crate::validate::{ValidatedJob, validate_submit};

/// Longest idempotency key a submission may carry.
const MAX_IDEMPOTENCY_KEY_BYTES: usize = 256;

/// Why a submission was refused; each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The job names a model endpoint outside the operator's allowlist.
    #[error("spec.model.base_url: {0}")]
    Endpoint(String),
    /// The spec breaks a rule (validation's message).
    #[error("{0}")]
    Invalid(String),
    /// The idempotency key is longer than [`MAX_IDEMPOTENCY_KEY_BYTES`].
    #[error("idempotency_key is too long (at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes)")]
    KeyTooLong,
    /// No place to run or queue the job.
    #[error("{0}")]
    Busy(String),
    /// The job's ownership could not be taken.
    #[error("job {job_id} ownership not taken: {source}")]
    Ownership {
        /// The job.
        job_id: String,
        /// Why.
        #[source]
        source: Box<OwnershipError>,
    },
    /// Reading or writing the job's record failed.
    #[error(transparent)]
    Bus(Box<BusError>),
}

impl From<BusError> for SubmitError {
    fn from(error: BusError) -> Self {
        Self::Bus(Box::new(error))
    }
}

/// An admitted submission (or a retry of one already admitted).
#[derive(Debug)]
pub(crate) struct Submitted {
    /// The job.
    pub(crate) job_id: String,
    /// Its trace id; empty when a retry raced the first submission.
    pub(crate) trace_id: String,
}

/// Admits jobs and starts their runners.
#[derive(Clone)]
pub(crate) struct JobManager {
    host: Arc<JobHost>,
}

impl JobManager {
    /// The manager of the daemon's jobs.
    pub(crate) fn new(host: Arc<JobHost>) -> Self {
        Self { host }
    }

    /// Admits `request` for `submitted_by`; its workflow span goes below
    /// `span` (the SubmitJob span, which gets the job id).
    pub(crate) async fn submit(
        &self,
        request: v1::SubmitJobRequest,
        submitted_by: String,
        span: &tracing::Span,
    ) -> Result<Submitted, SubmitError> {
        let validated = self.validate(&request)?;
        let job_id = job_id_for(&request.idempotency_key)?;
        span.record("job.id", job_id.as_str());
        let retry = !request.idempotency_key.is_empty();
        // A place is taken before the record is written, so a refusal
        // stores nothing and an accepted job always has a place.
        let ticket = self
            .host
            .tables
            .scheduler
            .reserve()
            .map_err(|e| SubmitError::Busy(e.to_string()))?;
        let mut admission = Admission::new(&self.host, &job_id, ticket);
        let traceparent = mtswarm_telemetry::propagation::current_trace_headers()
            .and_then(|h| h.get(mtswarm_telemetry::propagation::TRACEPARENT).cloned())
            .unwrap_or_default();
        if retry && let Some(existing) = self.host.stores.jobs.get(&job_id).await? {
            tracing::info!(%job_id, "submission retried with the same idempotency key");
            let trace_id = trace_id_of(&existing.value.traceparent);
            return Ok(Submitted { job_id, trace_id });
        }
        // The receiving leader owns the job from before its record exists,
        // so every QUEUED or RUNNING record has (or had) an owner whose
        // lapse the other leaders see.
        let fence = match admission.take_ownership().await {
            Ok(fence) => fence,
            Err(OwnershipError::Held { .. }) if retry => {
                tracing::info!(%job_id, "submission retried with the same idempotency key (owned by another leader)");
                return Ok(Submitted::raced(job_id));
            }
            Err(source) => {
                return Err(SubmitError::Ownership {
                    job_id,
                    source: Box::new(source),
                });
            }
        };
        let record = queued_record(&job_id, &validated, submitted_by, traceparent, &fence);
        match self.host.stores.jobs.create(&record).await {
            Ok(_) => {}
            Err(BusError::AlreadyExists { .. }) if retry => {
                tracing::info!(%job_id, "submission retried with the same idempotency key");
                // Raced by a retry of the same submission: its record's
                // trace is not known here.
                return Ok(Submitted::raced(job_id));
            }
            Err(error) => return Err(error.into()),
        }
        let ticket = admission.commit();
        runner::guard_ownership(&self.host, &job_id, fence.clone());
        self.journal_submitted(&job_id).await;
        self.start_or_queue(&job_id, validated, fence, span, ticket);
        tracing::info!(%job_id, "job submitted");
        Ok(Submitted {
            job_id,
            trace_id: trace_id_of(&record.traceparent),
        })
    }

    /// The model endpoint against the operator's allowlist, then the spec.
    fn validate(&self, request: &v1::SubmitJobRequest) -> Result<ValidatedJob, SubmitError> {
        let host = &self.host;
        if let Some(model) = request.spec.as_ref().and_then(|s| s.model.as_ref())
            && !model.base_url.trim().is_empty()
        {
            host.config
                .endpoints()
                .check(&model.base_url)
                .map_err(|e| SubmitError::Endpoint(e.to_string()))?;
        }
        validate_submit(
            request.spec.as_ref(),
            &host.kernel_root,
            &host.config.limits,
        )
        .map_err(|e| SubmitError::Invalid(e.to_string()))
    }

    /// Journals the job's first state change (QUEUED, "submitted").
    async fn journal_submitted(&self, job_id: &str) {
        let queued = v1::job_event::Event::StateChange(v1::JobStateChange {
            previous: v1::JobState::Unspecified as i32,
            current: v1::JobState::Queued as i32,
            reason: "submitted".to_string(),
            outcome: None,
        });
        if let Err(error) = self
            .host
            .stores
            .journal
            .append_confirmed(job_id, queued)
            .await
        {
            tracing::warn!(%error, %job_id, "submission not journaled");
        }
    }

    /// Builds the admitted job's context (its deadline from its wall-time
    /// budget) and starts its runner in its workflow span, below `span`, or
    /// queues it when every run slot is taken.
    fn start_or_queue(
        &self,
        job_id: &str,
        validated: ValidatedJob,
        fence: Fence,
        span: &tracing::Span,
        ticket: Ticket,
    ) {
        let host = &self.host;
        let budgets = validated.spec.budgets.unwrap_or_default();
        let deadline = SystemTime::now()
            + if budgets.wall_time_seconds > 0 {
                Duration::from_secs(budgets.wall_time_seconds)
            } else {
                host.config.default_task_deadline
            };
        let context = Arc::new(host.job_context(
            job_id.to_owned(),
            validated.spec,
            validated.kernel_dir,
            deadline,
            fence,
        ));
        let pending = PendingStart {
            context,
            attachments: validated.attachments,
            span: crate::spans::workflow_span(span, job_id, false),
            resume_state: None,
        };
        match host.tables.scheduler.commit(ticket, pending) {
            Some(pending) => runner::start(host.clone(), pending),
            None => tracing::info!(%job_id, "job queued: every run slot is taken"),
        }
    }
}

impl Submitted {
    /// A retry that raced the first submission: its trace is not known.
    fn raced(job_id: String) -> Self {
        Self {
            job_id,
            trace_id: String::new(),
        }
    }
}

/// What a submission holds before its record exists: its scheduler place
/// and, once taken, the job's ownership. Dropped before [`Self::commit`],
/// it gives the place back and releases the ownership.
struct Admission {
    host: Arc<JobHost>,
    job_id: String,
    ticket: Ticket,
    owned: bool,
    committed: bool,
}

impl Admission {
    fn new(host: &Arc<JobHost>, job_id: &str, ticket: Ticket) -> Self {
        Self {
            host: host.clone(),
            job_id: job_id.to_owned(),
            ticket,
            owned: false,
            committed: false,
        }
    }

    /// Takes the job's ownership; released again unless committed.
    async fn take_ownership(&mut self) -> Result<Fence, OwnershipError> {
        let fence = self.host.ownerships.take(&self.job_id).await?;
        self.owned = true;
        Ok(fence)
    }

    /// The record exists: the place and the ownership are the job's now.
    fn commit(mut self) -> Ticket {
        self.committed = true;
        self.ticket
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        self.host.tables.scheduler.cancel(self.ticket);
        if self.owned {
            let host = self.host.clone();
            let job_id = std::mem::take(&mut self.job_id);
            tokio::spawn(async move { host.ownerships.release(&job_id).await });
        }
    }
}

/// Job id for a submission: derived from the idempotency key (so a retry
/// maps to the same KV key and the create is the atomic check), else fresh.
fn job_id_for(idempotency_key: &str) -> Result<String, SubmitError> {
    if idempotency_key.is_empty() {
        return Ok(uuid::Uuid::now_v7().simple().to_string());
    }
    if idempotency_key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(SubmitError::KeyTooLong);
    }
    let digest = Sha256::digest(idempotency_key.as_bytes());
    Ok(format!("idem-{}", &hex::encode(digest)[..32]))
}

/// The job's first record: QUEUED, owned at `fence`'s epoch.
fn queued_record(
    job_id: &str,
    validated: &ValidatedJob,
    submitted_by: String,
    traceparent: String,
    fence: &Fence,
) -> v1::JobRecord {
    let now = prost_types::Timestamp::from(SystemTime::now());
    v1::JobRecord {
        job_id: job_id.to_owned(),
        spec: Some(validated.spec.clone()),
        state: v1::JobState::Queued as i32,
        submitted_by,
        created_at: Some(now),
        updated_at: Some(now),
        traceparent,
        owner_epoch: fence.epoch(),
        ..Default::default()
    }
}

/// The trace id of a stored traceparent, empty when there is none.
fn trace_id_of(traceparent: &str) -> String {
    mtswarm_telemetry::propagation::trace_id_of(traceparent)
        .unwrap_or_default()
        .to_string()
}
