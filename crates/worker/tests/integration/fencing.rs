//! A worker that loses its slice while running an attempt stops the run and
//! publishes a fenced CANCELLED result for that attempt: when a later
//! attempt took over the session's checkpoint, when the slice's claim is
//! lost, and when the daemon's one lease is (every slice at once; the
//! daemon then takes it again and claims its slices anew).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::{Approvals, Checkpoints, Leases, v1};
use serde_json::json;

fn params() -> serde_json::Value {
    json!({
        "candidates": [{"N": 4096, "CHUNK": 256}, {"N": 4096, "CHUNK": 1024}],
        "repeats": 3
    })
}

/// Starts a session on `emu0`'s first slice and runs attempt 1 of a task
/// until it pauses for the approval of its first validation.
struct Paused {
    env: Env,
    handle: mtswarm_worker::WorkerHandle,
    slice: String,
    request: v1::ApprovalRequest,
    watch: JobWatch,
}

async fn paused_attempt(job: &str) -> Paused {
    let env = Env::start().await;
    let handle = env.daemon(env.config("emu0")).await;
    let slice = handle.slice_ids()[0].clone();
    let mut watch = env.watch(job, "tf").await;
    let session = Session::on(&handle, &slice, job, "agentF", "sessF");
    spawn(&handle, session.spawn_request()).await;
    env.publish(&session.task("taskF", 1, params())).await;
    let request = next_message(&mut watch.requests, "the approval request").await;
    Paused {
        env,
        handle,
        slice,
        request,
        watch,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_fenced_by_a_later_attempt_publishes_a_fenced_result() {
    let mut paused = paused_attempt("jobF1").await;
    let checkpoints = Checkpoints::open(&paused.env.bus)
        .await
        .expect("checkpoints");
    let approvals = Approvals::open(&paused.env.bus).await.expect("approvals");

    // Attempt 2 of the task took the session over elsewhere.
    let mut taken_over = stored(checkpoints.kv(), "sessF").await;
    assert_eq!(taken_over.attempt, 1);
    taken_over.attempt = 2;
    taken_over.updated_at = None;
    checkpoints
        .put(&taken_over)
        .await
        .expect("attempt 2 checkpoint");

    // Attempt 1 resumes, and its next checkpoint is refused.
    approvals
        .decide(&approve(&paused.request))
        .await
        .expect("decide");
    let result = fenced_result(&mut paused.watch.results).await;
    assert!(result.error.contains("later attempt"), "{}", result.error);
    // Attempt 1 never overwrote attempt 2's checkpoint.
    assert_eq!(stored(checkpoints.kv(), "sessF").await.attempt, 2);
    let mut seen = Vec::new();
    let finished = events_until(&mut paused.watch.events, &mut seen, |e| task_finished(e, 1)).await;
    assert_eq!(payload(&finished)["fenced"], true);
    paused.handle.shutdown().await.expect("shutdown");
}

/// The paused attempt ends fenced for the loss of its slice's lease, and
/// its session with it.
async fn fenced_for_its_lease(paused: &mut Paused) {
    let result = fenced_result(&mut paused.watch.results).await;
    assert!(
        result.error.contains("lease") && result.error.contains(&paused.slice),
        "{}",
        result.error
    );
    fenced_session_end(&mut paused.watch.events, "sessF").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_fences_the_running_attempt_and_ends_the_session() {
    let mut paused = paused_attempt("jobF2").await;
    let leases = Leases::open(&paused.env.bus).await.expect("leases");
    let lease = stored(leases.kv(), &paused.slice).await;
    assert_eq!(lease.session_id, "sessF");

    // The lease is gone under the worker (what a lapse or a takeover does):
    // its next renewal is refused.
    leases
        .kv()
        .delete(&paused.slice, None)
        .await
        .expect("delete the lease");
    fenced_for_its_lease(&mut paused).await;
    paused.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_lease_loss_fences_the_run_and_the_daemon_claims_its_slices_again() {
    let mut paused = paused_attempt("jobF3").await;
    let leases = Leases::open(&paused.env.bus).await.expect("leases");
    let worker_id = paused.handle.worker_id().to_owned();
    let before = stored(leases.kv(), &paused.slice).await;
    assert_eq!(before.session_id, "sessF");
    let daemon = leases
        .daemon(&worker_id)
        .await
        .expect("read")
        .expect("the daemon lease is held");
    assert_eq!(before.daemon_epoch, daemon.value.epoch);

    // The daemon's one lease is gone under it (what a lapse or another
    // process taking it does): its next renewal is refused, every slice is
    // lost at once, and the attempt running on one is fenced.
    leases
        .kv()
        .nested_view::<v1::DaemonLease>()
        .delete(&format!("daemon.{worker_id}"), None)
        .await
        .expect("delete the daemon lease");
    assert!(leases.get(&paused.slice).await.expect("get").is_none());
    fenced_for_its_lease(&mut paused).await;

    // The daemon takes its lease again at a new epoch and claims its
    // slices anew, idle.
    let slices = paused.handle.slice_ids();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let daemon_now = leases.daemon(&worker_id).await.expect("read");
        let mut claims = Vec::new();
        for slice in &slices {
            claims.push(leases.get(slice).await.expect("get"));
        }
        if let Some(daemon_now) = daemon_now
            && daemon_now.value.epoch > daemon.value.epoch
            && claims.iter().all(|c| {
                c.as_ref().is_some_and(|c| {
                    c.value.daemon_epoch == daemon_now.value.epoch && c.value.session_id.is_empty()
                })
            })
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the daemon did not claim its slices again: {claims:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    paused.handle.shutdown().await.expect("shutdown");
}
