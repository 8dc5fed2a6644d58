//! Several leaders on one NATS: each job is run by the leader that owns it
//! (its ownership lease in `mtswarm_job_owners`, [`mtswarm_bus::ownership`]),
//! and only there. This module is the leader's side of it:
//!
//! - [`standby`]: watches the ownership leases; when one lapses (its owner
//!   died) or is released while the job is still QUEUED or RUNNING, this
//!   leader takes it (a conditional create: of several standbys one wins,
//!   with a larger epoch) and resumes it with the resume path of a
//!   restarted leader ([`super::resume_job`]). A start, and every
//!   re-opened watch (markers may have been missed meanwhile), scans the
//!   job records for unowned QUEUED or RUNNING jobs ([`take_unowned`]).
//!   Before resuming, it stamps the job's record with its epoch
//!   ([`mtswarm_bus::OwnerWrites::claim`]): the store refuses every later
//!   write of an earlier owner from then on.
//! - [`guard_ownership`]: when a job's ownership is lost here (a renewal
//!   refused, or a write that found its fence closed: this leader was
//!   paused past its TTL), the job's loop stops on this leader without
//!   recording an end ("job finished" is logged by the new owner only),
//!   its result table and context go, and nothing more is written for it.
//! - Cancellation from any leader is carried through KV: a leader without
//!   the job's runner writes CANCELLED to the record (CAS), and the owner's
//!   record watch ([`watch_cancellations`]) cancels its loop and agents.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_bus::{Backoff, Fence, KvChange, OwnerEvent, OwnershipError, reopen, v1};

use super::transition::{is_final, transition};
use crate::host::JobHost;

/// Stops the job on this leader once its ownership is lost (see the
/// module docs) and hands it to the standby loop, which takes it back
/// only if nobody else did.
pub(crate) fn guard_ownership(host: &Arc<JobHost>, job_id: &str, fence: Fence) {
    let host = host.clone();
    let job_id = job_id.to_string();
    tokio::spawn(async move {
        let Some(reason) = fence.lost().await else {
            return;
        };
        if *host.shutdown.borrow() {
            return;
        }
        tracing::warn!(
            job_id,
            leader_id = %host.config.leader_id,
            epoch = fence.epoch(),
            %reason,
            "job ownership lost; the job's loop stops on this leader and writes nothing more"
        );
        host.ownerships.forget_lost(&job_id, fence.epoch());
        if let Some((_, runner)) = host.tables.runners.remove(&job_id) {
            runner.abort();
            if runner.return_slot()
                && let Some(next) = host.tables.scheduler.finished()
            {
                super::start(host.clone(), next);
            }
        } else {
            drop(host.tables.scheduler.remove_queued(&job_id));
        }
        if let Some((_, context)) = host.tables.contexts.remove(&job_id) {
            for agent in context.agent_list() {
                host.placement
                    .claims
                    .release_of(&agent.slice_id, &agent.session_id);
            }
        }
        host.tables.results.remove(&job_id);
        host.ownerships.offer_take_over(&job_id);
    });
}

/// Resumes a QUEUED or RUNNING job this leader just took the ownership of
/// (at start or from a lapsed owner): rebuilt and admitted, or FAILED when
/// it cannot be resumed.
async fn resume_owned(host: &Arc<JobHost>, record: v1::JobRecord, fence: Fence) {
    let job_id = record.job_id.clone();
    guard_ownership(host, &job_id, fence.clone());
    match super::resume_job(host, record, fence.clone()).await {
        Ok(pending) => {
            tracing::info!(%job_id, "resuming a job left by a previous leader");
            if let Some(pending) = host.tables.scheduler.admit_resumed(pending) {
                super::start(host.clone(), pending);
            }
        }
        Err(error) => {
            tracing::error!(%job_id, %error, "job cannot be resumed; it fails");
            host.tables.results.remove(&job_id);
            transition(
                host,
                &job_id,
                Some(&fence),
                v1::JobState::Failed,
                &format!("failed: not resumable: {error}"),
                |r| {
                    r.finished_at =
                        Some(prost_types::Timestamp::from(std::time::SystemTime::now()));
                    r.error = format!("not resumable after a leader restart: {error}");
                },
            )
            .await;
            host.ownerships.release(&job_id).await;
        }
    }
}

/// Takes `job_id` over when it is QUEUED or RUNNING and nobody owns it;
/// true when this leader resumed it.
async fn take_over(host: &Arc<JobHost>, job_id: &str) -> bool {
    if host.ownerships.owns(job_id) || *host.shutdown.borrow() {
        return false;
    }
    let live = |record: &v1::JobRecord| !is_final(record.state());
    match host.stores.jobs.get(job_id).await {
        Ok(Some(record)) if live(&record.value) => {}
        Ok(_) => return false,
        Err(error) => {
            tracing::warn!(%error, job_id, "job record not read; not taking the job over");
            return false;
        }
    }
    let fence = match host.ownerships.take(job_id).await {
        Ok(fence) => fence,
        Err(OwnershipError::Held { owner, .. }) => {
            tracing::debug!(job_id, owner, "job owned by another leader; left to it");
            return false;
        }
        Err(error) => {
            tracing::warn!(%error, job_id, "job ownership not taken");
            return false;
        }
    };
    // Stamp the record with this epoch before acting on the job: from
    // now on the store refuses every write of an earlier owner (one paused
    // past its lease may still think it holds the job). The record is read
    // under the ownership by it: the job may have ended meanwhile.
    match host.stores.jobs.as_owner(fence.epoch()).claim(job_id).await {
        Ok(record) if live(&record.value) => {
            // Boxed: a resume's future is large, and this one nests in the
            // standby loop's.
            Box::pin(resume_owned(host, record.value, fence)).await;
            true
        }
        Ok(_) => {
            host.ownerships.release(job_id).await;
            false
        }
        Err(error) => {
            let error = match fence.refused(error) {
                Ok(lost) => lost.to_string(),
                Err(other) => other.to_string(),
            };
            tracing::warn!(%error, job_id, "job record not claimed; not taking the job over");
            host.ownerships.release(job_id).await;
            false
        }
    }
}

/// Takes over every QUEUED or RUNNING job nobody owns, RUNNING ones first,
/// then in submission order (a start, and after a watch gap). Reads every
/// job record: it runs at start and on reconnects, never per message.
pub(crate) async fn take_unowned(host: &Arc<JobHost>) -> Result<usize, mtswarm_bus::BusError> {
    let mut records: Vec<v1::JobRecord> = host
        .stores
        .jobs
        .list()
        .await?
        .into_iter()
        .map(|v| v.value)
        .filter(|r| matches!(r.state(), v1::JobState::Queued | v1::JobState::Running))
        .filter(|r| !host.ownerships.owns(&r.job_id))
        .collect();
    let created = |r: &v1::JobRecord| {
        r.created_at
            .as_ref()
            .map(|t| (t.seconds, t.nanos))
            .unwrap_or_default()
    };
    records.sort_by(|a, b| {
        (a.state() != v1::JobState::Running)
            .cmp(&(b.state() != v1::JobState::Running))
            .then_with(|| created(a).cmp(&created(b)))
            .then_with(|| a.job_id.cmp(&b.job_id))
    });
    let mut taken = 0;
    for record in records {
        let owner = host.ownerships.owners.get(&record.job_id).await?;
        // A live owner that is not this leader keeps its job; one under
        // this leader's id (a restart with a stable id) is taken back.
        if owner.is_some_and(|o| o.value.leader_id != host.config.leader_id) {
            continue;
        }
        if take_over(host, &record.job_id).await {
            taken += 1;
        }
    }
    Ok(taken)
}

/// The standby loop (see the module docs) until shutdown: ownership
/// changes and jobs handed over by [`guard_ownership`], one take-over at a
/// time.
pub(crate) async fn standby(
    host: Arc<JobHost>,
    mut candidates: tokio::sync::mpsc::UnboundedReceiver<String>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
    loop {
        let open = || host.ownerships.owners.watch();
        let Some(mut watch) =
            reopen("job ownership watch", &mut backoff, &mut shutdown, open).await
        else {
            return;
        };
        if let Err(error) = take_unowned(&host).await {
            tracing::warn!(%error, "unowned jobs not scanned; the next watch retries");
        }
        loop {
            let job_id = tokio::select! {
                _ = shutdown.changed() => return,
                job_id = candidates.recv() => match job_id {
                    Some(job_id) => job_id,
                    None => return,
                },
                event = watch.next() => match event {
                    Some(Ok(OwnerEvent::Lapsed { job_id } | OwnerEvent::Released { job_id })) => job_id,
                    Some(Ok(OwnerEvent::Held(_))) => continue,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "job ownership watch failed; re-opening it");
                        break;
                    }
                    None => break,
                },
            };
            let started = tokio::time::Instant::now();
            if take_over(&host, &job_id).await {
                tracing::info!(
                    job_id,
                    leader_id = %host.config.leader_id,
                    took_ms = started.elapsed().as_millis() as u64,
                    "took over a job whose owner's lease lapsed"
                );
            }
        }
        if !backoff.sleep_or_shutdown(&mut shutdown).await {
            return;
        }
    }
}

/// Cancels this leader's run of a job another leader cancelled through
/// the job's record (see the module docs), until shutdown.
pub(crate) async fn watch_cancellations(
    host: Arc<JobHost>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
    loop {
        let open = || host.stores.jobs.watch();
        let Some(mut watch) = reopen("job record watch", &mut backoff, &mut shutdown, open).await
        else {
            return;
        };
        loop {
            let change = tokio::select! {
                _ = shutdown.changed() => return,
                change = watch.next() => change,
            };
            let record = match change {
                Some(Ok(KvChange::Put { value, .. })) => value.value,
                Some(Ok(_)) => continue,
                Some(Err(error)) => {
                    tracing::warn!(%error, "job record watch failed; re-opening it");
                    break;
                }
                None => break,
            };
            if record.state() != v1::JobState::Cancelled || !host.ownerships.owns(&record.job_id) {
                continue;
            }
            let job_id = record.job_id.clone();
            let reason = format!("cancelled through another leader: {}", record.error);
            if let Some(runner) = host.tables.runners.get(&job_id) {
                runner.cancel(&reason);
            } else if let Some(queued) = host.tables.scheduler.remove_queued(&job_id) {
                host.placement
                    .cancel_all_agents(&queued.context, "job cancelled")
                    .await;
                host.tables.results.remove(&job_id);
                host.ownerships.release(&job_id).await;
                tracing::info!(job_id, "queued job cancelled through another leader");
            }
        }
        if !backoff.sleep_or_shutdown(&mut shutdown).await {
            return;
        }
    }
}
