//! The leader's durable result consumer (one per leader id) and the replay of a resumed
//! job's results: both offer each result to its job's table
//! ([`crate::results`]) and act on the answer (record and journal an
//! accepted result, count and log the rest, hand a fenced current attempt
//! to the reassigner). See [`crate::results`] for the rules.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt as _;
use mtswarm_bus::{Backoff, ResultConsumerConfig, reopen, subjects, v1};
use mtswarm_telemetry::metrics::{FencedAttempt, metrics};
use tracing::Instrument as _;

use crate::error::ReplayError;
use crate::keys::LeaderKeys;
use crate::ownerships::Ownerships;
use crate::results::{Acceptance, AtomicCounters};
use crate::stores::Stores;
use crate::tables::JobTables;
use crate::trigger::{Trigger, Triggers};

/// What taking a result in uses: the bus and the job records (recording,
/// journaling, replaying), the jobs' tables, the ownerships that fence the
/// writes, the result key tokens are checked with, and the reassigner's
/// queue for fenced attempts.
pub(crate) struct ResultIntake {
    pub(crate) stores: Stores,
    pub(crate) tables: Arc<JobTables>,
    pub(crate) ownerships: Arc<Ownerships>,
    pub(crate) keys: LeaderKeys,
    pub(crate) triggers: Triggers,
}

/// Offers one result (from the live consumer or a replay) to its job's
/// table and does what the outcome asks: record and journal an accepted
/// result, log and count the rest, hand a fenced current attempt to the
/// reassigner. Returns `None` when the job has no table here.
///
/// Everything logged on the way carries the result's job, task and attempt
/// from one span around it.
pub(crate) async fn handle_result(
    intake: &ResultIntake,
    result: &v1::TaskResult,
) -> Option<Acceptance> {
    let span = tracing::info_span!(
        "task_result",
        job_id = %result.job_id,
        task_id = %result.task_id,
        attempt = result.attempt,
    );
    offer_result(intake, result).instrument(span).await
}

async fn offer_result(intake: &ResultIntake, result: &v1::TaskResult) -> Option<Acceptance> {
    let Some(job) = intake.tables.results.get(&result.job_id) else {
        tracing::debug!(
            "result for a job not running on this leader; left in the results stream for its resume"
        );
        return None;
    };
    let counters = &intake.tables.results.counters;
    // Only the session the attempt was placed on got its token.
    if let Some(key) = intake.keys.result()
        && !key.verify(
            &result.job_id,
            &result.task_id,
            result.attempt,
            &result.result_token,
        )
    {
        drop_forged(
            counters,
            result,
            "its token is not the one issued for this attempt",
        );
        return None;
    }
    if let Some(placed) = placement_mismatch(&intake.tables, result) {
        drop_forged(
            counters,
            result,
            &format!("it names another worker or slice than the attempt was placed on ({placed})"),
        );
        return None;
    }
    let acceptance = job.offer(result);
    match &acceptance {
        Acceptance::Accepted => {
            counters.accepted.fetch_add(1, Ordering::Relaxed);
            accepted(intake, result).await;
            job.publish_accepted(&result.task_id);
        }
        Acceptance::Restored => {
            counters.restored.fetch_add(1, Ordering::Relaxed);
        }
        Acceptance::Duplicate => {
            counters.duplicate.fetch_add(1, Ordering::Relaxed);
            tracing::info!("duplicate result dropped (task already has a result)");
        }
        Acceptance::Stale { current_attempt } => {
            counters.stale.fetch_add(1, Ordering::Relaxed);
            metrics().task_fenced(FencedAttempt::Stale);
            tracing::warn!(
                current_attempt,
                fenced = result.fenced,
                "result of a stale attempt dropped"
            );
        }
        Acceptance::FencedCurrent => {
            counters.fenced.fetch_add(1, Ordering::Relaxed);
            metrics().task_fenced(FencedAttempt::Current);
            tracing::warn!(
                error = %result.error,
                "fenced result of the current attempt; reassigning the task"
            );
            let cause_at = result
                .finished_at
                .and_then(|t| SystemTime::try_from(t).ok())
                .unwrap_or_else(SystemTime::now);
            intake.triggers.send(Trigger::Fenced {
                job_id: result.job_id.clone(),
                task_id: result.task_id.clone(),
                attempt: result.attempt,
                reason: format!("fenced result: {}", result.error),
                cause_at,
            });
        }
        Acceptance::UnknownTask => {
            counters.unknown_task.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("result for a task this job never assigned dropped");
        }
    }
    Some(acceptance)
}

/// Counts and logs a result dropped as forged, and why.
fn drop_forged(counters: &AtomicCounters, result: &v1::TaskResult, why: &str) {
    counters.forged.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        worker_id = %result.worker_id,
        session_id = %result.session_id,
        slice_id = %result.slice_id,
        "result dropped: {why}"
    );
}

/// Where the result's attempt was placed, when the result names another
/// worker or slice (`None`: it names the placement, or the attempt is not
/// the one on record here, which the table judges).
fn placement_mismatch(tables: &JobTables, result: &v1::TaskResult) -> Option<String> {
    use mtswarm_bus::results::canonical_slice_id;
    let context = tables.contexts.get(&result.job_id)?;
    let tasks = context.tasks();
    let assignment = tasks.get(&result.task_id)?.assignment.as_ref()?;
    if assignment.attempt != result.attempt {
        return None;
    }
    let same = assignment.worker_id == result.worker_id
        && canonical_slice_id(&assignment.slice_id) == canonical_slice_id(&result.slice_id);
    (!same).then(|| format!("{} / {}", assignment.worker_id, assignment.slice_id))
}

/// How long the server keeps a leader's result consumer once nobody pulls
/// from it. Leader ids are new on every start unless set, so without it
/// every leader that ever ran would leave a consumer on the results stream.
/// A live leader pulls all the time; one cut off for longer than this has
/// lost its jobs' leases long before, and gets a fresh consumer when it
/// comes back.
const RESULT_CONSUMER_INACTIVE_THRESHOLD: Duration = Duration::from_secs(15 * 60);

/// Consumes `mtswarm.result.>` with the leader's durable consumer until
/// `shutdown` fires: hands each result to [`handle_result`] and acks every
/// message once handled. A result for a job not running here is acked too:
/// the results stream keeps it, and the job's resume replays it (see the
/// module docs). The consumer and its message stream are re-created with
/// backoff whenever they fail (NATS restart), forever.
pub(crate) async fn consume_results(
    intake: Arc<ResultIntake>,
    consumer_name: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
    // One consumer per leader: each sees every result and keeps those of
    // the jobs it owns (a result of another leader's job finds no table
    // here and is acked; its owner gets it from its own consumer).
    let open = || async {
        intake
            .stores
            .bus
            .result_consumer(ResultConsumerConfig {
                inactive_threshold: RESULT_CONSUMER_INACTIVE_THRESHOLD,
                ..ResultConsumerConfig::new(consumer_name.clone())
            })
            .await?
            .messages()
            .await
    };
    loop {
        let Some(mut messages) = reopen("result consumer", &mut backoff, &mut shutdown, open).await
        else {
            return;
        };
        let mut failures_in_a_row = 0u32;
        loop {
            let item = tokio::select! {
                item = messages.next() => item,
                _ = shutdown.changed() => return,
            };
            let Some(item) = item else { break };
            let delivery = match item {
                Ok(delivery) => delivery,
                Err(error) => {
                    // While the server is away the stream reports missed
                    // heartbeats; after a few, re-create the consumer.
                    failures_in_a_row += 1;
                    tracing::warn!(%error, failures_in_a_row, "result delivery failed");
                    if failures_in_a_row >= 3 {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        _ = shutdown.changed() => return,
                    }
                    continue;
                }
            };
            failures_in_a_row = 0;
            let result = delivery.message().clone();
            handle_result(&intake, &result).await;
            if let Err(error) = delivery.ack().await {
                tracing::warn!(%error, task_id = %result.task_id, "result ack failed; it will be redelivered and deduplicated");
            }
        }
        if !backoff.sleep_or_shutdown(&mut shutdown).await {
            return;
        }
    }
}

/// Offers every result stored so far on the job's results subject (oldest
/// first) to its table; the table must be registered before. Returns the
/// number of results read.
pub(crate) async fn replay_job_results(
    intake: &ResultIntake,
    job_id: &str,
) -> Result<usize, ReplayError> {
    let subject = subjects::result(job_id)?;
    let stream = intake
        .stores
        .bus
        .jetstream()
        .get_stream_no_info(subjects::RESULTS_STREAM)
        .await
        .map_err(|e| ReplayError::OpenStream {
            stream: subjects::RESULTS_STREAM,
            source: Box::new(e),
        })?;
    // Everything stored up to now; later results reach the live consumer,
    // which finds the registered table.
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message.sequence,
        Err(error)
            if error.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            return Ok(0);
        }
        Err(error) => {
            return Err(ReplayError::LastResult {
                job_id: job_id.to_string(),
                source: Box::new(error),
            });
        }
    };
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: subject.clone(),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| ReplayError::Consumer {
            subject: subject.clone(),
            source: Box::new(e),
        })?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| ReplayError::Consumer {
            subject: subject.clone(),
            source: Box::new(e),
        })?;
    let mut read = 0;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .map_err(|_| ReplayError::Stalled {
                subject: subject.clone(),
            })?;
        let Some(message) = message else {
            return Err(ReplayError::EndedEarly { subject });
        };
        let message = message.map_err(|e| ReplayError::Read {
            subject: subject.clone(),
            source: Box::new(e),
        })?;
        let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(last);
        match mtswarm_bus::codec::decode::<v1::TaskResult>(
            &subject,
            message.headers.as_ref(),
            &message.payload,
        ) {
            Ok(result) => {
                read += 1;
                handle_result(intake, &result).await;
            }
            Err(error) => tracing::warn!(%error, sequence, "undecodable result skipped in replay"),
        }
        if sequence >= last {
            return Ok(read);
        }
    }
}

/// Records an accepted result: the task's record is marked done with its
/// status, then the job's counters and usage grow (unless the task was
/// recorded done already: a replayed result), and the result is journaled.
/// Runs in [`handle_result`]'s span, which names the result.
async fn accepted(intake: &ResultIntake, result: &v1::TaskResult) {
    // Only the job's owner records its results.
    let Some(fence) = intake.ownerships.fence(&result.job_id) else {
        tracing::warn!(
            reason = "this leader does not own the job",
            "accepted result not recorded here"
        );
        return;
    };
    if let Err(error) = fence.check("recording a task result") {
        tracing::warn!(reason = %error, "accepted result not recorded here");
        return;
    }
    let owner = intake.stores.jobs.as_owner(fence.epoch());
    // A refusal by the store (a later owner wrote the record) marks the
    // ownership lost; the result is then recorded by that owner.
    let refused = |error: mtswarm_bus::BusError| match fence.refused(error) {
        Ok(lost) => lost.to_string(),
        Err(other) => other.to_string(),
    };
    let usage = result.usage.clone().unwrap_or_default();
    let finished_at = result
        .finished_at
        .unwrap_or_else(|| prost_types::Timestamp::from(SystemTime::now()));
    let mut already_done = false;
    let mut confirmation = false;
    let mut assigned_at = None;
    let marked = owner
        .modify_task(&result.job_id, &result.task_id, |stored| {
            already_done = stored.is_some_and(|t| t.done);
            confirmation = stored.is_some_and(crate::ids::is_confirmation);
            assigned_at = stored
                .and_then(|t| t.assignment.as_ref())
                .and_then(|a| a.assigned_at);
            let mut task = stored.filter(|t| !t.done)?.clone();
            task.done = true;
            task.status = result.status;
            task.finished_at = Some(finished_at);
            Some(task)
        })
        .await;
    if let Err(error) = marked {
        let error = refused(error);
        tracing::warn!(%error, "task record not marked done with its result");
    }
    if !already_done {
        // Both ends on this leader's clock: the publish it confirmed and
        // the result it accepted now.
        let latency = assigned_at
            .and_then(|at| SystemTime::try_from(at).ok())
            .and_then(|at| SystemTime::now().duration_since(at).ok());
        metrics().task_completed(&status_label(result.status()), latency);
    }
    if !already_done
        && let Err(error) = owner
            .modify(&result.job_id, |job| {
                // A confirming task is the leader's, not one of the job's.
                if !confirmation {
                    job.tasks_done = job.tasks_done.saturating_add(1);
                }
                let total = job.usage.get_or_insert_with(Default::default);
                total.steps = total.steps.saturating_add(usage.steps);
                total.prompt_tokens = total.prompt_tokens.saturating_add(usage.prompt_tokens);
                total.completion_tokens = total
                    .completion_tokens
                    .saturating_add(usage.completion_tokens);
                total.device_seconds += usage.device_seconds;
            })
            .await
    {
        let error = refused(error);
        tracing::warn!(%error, "job record not updated with a result");
    }
    if let Err(error) = intake
        .stores
        .journal
        .append_with_id(
            &result.job_id,
            v1::job_event::Event::TaskResult(result.clone()),
            // One entry per accepted attempt, however often it is journaled.
            format!(
                "result.{}.{}.{}",
                result.job_id, result.task_id, result.attempt
            ),
        )
        .await
    {
        tracing::warn!(%error, "task result not journaled");
    }
}

/// A task status as the `status` attribute spells it (`ok`, `failed`,
/// `cancelled`).
fn status_label(status: v1::TaskStatus) -> String {
    let name = status.as_str_name();
    name.strip_prefix("TASK_STATUS_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}
