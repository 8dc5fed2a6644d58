//! NATS restart: the leader's background loops (result consumer, lease and
//! quarantine watches, reassigner, relays) outlive a nats-server stop and
//! start on the same port. After the restart a job still runs end to end,
//! including a reassignment after its worker dies.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::ConnectionState;
use mtswarm_bus::v1;

fn gflops(_: &v1::TaskAssignment) -> f64 {
    3.0
}

/// Waits until the leader's connection is in state `wanted`.
async fn reach(
    state: &mut tokio::sync::watch::Receiver<ConnectionState>,
    wanted: ConnectionState,
    what: &str,
) {
    within(what, state.wait_for(|s| *s == wanted))
        .await
        .expect("state");
}

#[tokio::test]
async fn the_leader_survives_a_nats_restart() {
    let mut env = Env::start().await;
    let model = one_task_script("fn1-c0", 3.0);
    let leader = env.leader(model).await;
    let mut state = leader.bus().connection_state();

    env.nats.stop().expect("stop nats-server");
    reach(
        &mut state,
        ConnectionState::Disconnected,
        "the leader to see the disconnect",
    )
    .await;
    env.nats.restart().expect("restart nats-server");
    reach(
        &mut state,
        ConnectionState::Connected,
        "the leader to reconnect",
    )
    .await;
    env.bus
        .wait_connected(WAIT)
        .await
        .expect("test client reconnects");

    let dying = FakeWorker::start(&env.bus, "fn1", "fn1").await;
    let _spare = FakeWorker::start(&env.bus, "fn2", "fn2").await;
    let (answer, mut answered) = answer_tasks(&env.bus, "fn2", gflops);
    let mut first_tasks = task_stream(&env.bus, "fn1").await;
    let mut control = control(&leader).await;
    let job_id = submit(&mut control, "Tune k1 after a NATS restart.").await;
    let first = next_task(&mut first_tasks, "the task on fn1").await;
    assert_eq!(first.message().attempt, 1);
    dying.kill().await;
    let (moved, _) = within("the task re-published on fn2", answered.recv())
        .await
        .expect("a task");
    assert_eq!(moved.task_id, first.message().task_id);
    assert_eq!(moved.attempt, 2);

    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));
    let counters = leader.counters();
    assert_eq!((counters.accepted, counters.reassigned), (1, 1));
    answer.abort();
    leader.shutdown().await.expect("shutdown");
}
