//! Scenario 9: the fleet runs on a real 3-node nats-server cluster on
//! loopback, every stream and bucket at 3 replicas, the leader, the workers
//! and the observer connected to all three URLs. Mid-job (both tasks out,
//! one checkpointed), the node that leads the tasks stream is SIGKILLed
//! (the results stream's leader when the observer happens to be connected
//! to the tasks leader: the observer's core subscriptions must not miss a
//! publish). The job completes with every task accepted once and no
//! attempt published twice or moved; the node is started again and catches
//! up until it holds a current replica of every stream and bucket.

use std::time::Duration;

use futures::StreamExt as _;

use mtswarm_bus::testing::cluster::{
    LocalCluster, stream_info, stream_leader, wait_meta_leader, wait_node_current,
};
use mtswarm_bus::{Bus, BusConfig, subjects};
use mtswarm_tests::chaos::ChaosOptions;
use mtswarm_tests::{node_bin, small_fleet_toml};
use tokio::time::Instant;

use crate::support::{Started, assert_workers_alive, ms, one_at_a_time, outcome, start_mid_job};

/// Bound of the cluster's own waits (elections take seconds).
const WAIT: Duration = Duration::from_secs(60);

// Under load (a full CI run on 2 cores) the election of a new leader for
// each stream the killed node led takes seconds. Two faults made the
// scenario fail there: the journal published its events without waiting
// for the stream, so an accepted result sent while the journal stream had
// no leader was dropped (the job succeeded, its events had no results);
// and a lease keeper waited on one renewal the dead leader never
// acknowledged for up to the rest of its TTL, so the lease was given up
// although the bucket had a new leader long before (a task moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_completes_when_a_stream_leader_of_a_three_node_cluster_is_killed() {
    let _serial = one_at_a_time().await;
    let mut cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .expect("start task")
        .expect("3 nats-servers start");
    let mut config = BusConfig::new(cluster.urls()[0].clone()).with_name("chaos-probe");
    config.servers = cluster.urls();
    let probe = Bus::connect(config).await.expect("connect the probe");
    probe.wait_connected(WAIT).await.expect("probe connected");
    wait_meta_leader(&probe, WAIT).await;

    let mut options = ChaosOptions::new(node_bin!(), small_fleet_toml(2, 1, 2));
    // Long enough that no lease lapses while the cluster elects new stream
    // leaders: nothing may move.
    options.lease_ttl_seconds = 10;
    options.nats_urls = cluster.urls();
    for args in [&mut options.leader_args, &mut options.worker_args] {
        args.extend(["--nats-replicas".to_string(), "3".to_string()]);
    }
    let Started {
        mut stack,
        mut control,
        job_id,
        submitted_at,
    } = start_mid_job(options, "Tune vecadd; a NATS node will die").await;

    let tasks = stream_info(&probe, subjects::TASKS_STREAM)
        .await
        .expect("tasks stream info");
    assert_eq!(tasks.config.num_replicas, 3, "{:?}", tasks.config);

    let observer_node = stack.observer.bus().client().server_info().server_name;
    let tasks_leader = stream_leader(&probe, subjects::TASKS_STREAM, WAIT).await;
    let results_leader = stream_leader(&probe, subjects::RESULTS_STREAM, WAIT).await;
    let (victim_name, leads) = if tasks_leader != observer_node {
        (tasks_leader.clone(), "tasks")
    } else if results_leader != observer_node {
        (results_leader.clone(), "results")
    } else {
        (
            moved_leader(&probe, subjects::TASKS_STREAM, &observer_node).await,
            "tasks",
        )
    };
    let victim = cluster
        .index_of(&victim_name)
        .expect("a node of the cluster");
    eprintln!(
        "killing {victim_name} (leads the {leads} stream; tasks leader {tasks_leader}, results leader {results_leader}, observer on {observer_node})"
    );
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| cluster.kill(victim)).expect("SIGKILL the node");

    let end = outcome(&stack, &mut control, &job_id, Duration::from_secs(180)).await;
    let completed_after_kill = end.finished_at.duration_since(killed_at);
    let job_ms = end.finished_at.duration_since(submitted_at);
    let new_tasks_leader = stream_leader(&probe, subjects::TASKS_STREAM, WAIT).await;
    let new_results_leader = stream_leader(&probe, subjects::RESULTS_STREAM, WAIT).await;

    tokio::task::block_in_place(|| cluster.restart(victim)).expect("start the node again");
    let restarted_at = Instant::now();
    let streams = wait_node_current(&probe, &victim_name, WAIT).await;
    let catch_up = restarted_at.elapsed();

    end.report(
        "nats_cluster",
        &[
            ("killed", victim_name.clone()),
            ("killed_leads", leads.to_string()),
            ("job_ms", ms(job_ms)),
            ("completed_ms_after_kill", ms(completed_after_kill)),
            ("catch_up_ms", ms(catch_up)),
            ("replicated_streams", streams.to_string()),
        ],
    );
    end.assert_nothing_lost(&stack);
    assert_eq!(
        end.counts.republished, 0,
        "an attempt was published twice: {:?}",
        end.counts
    );
    // With leases far longer than an election nothing should move. A move
    // costs time, never a result (asserted above); should one happen, its
    // logs say why.
    if end.counts.highest_attempt > 1 {
        eprintln!(
            "nats_cluster: a task moved ({:?}); logs:\n{}",
            end.counts,
            stack.logs()
        );
    }
    assert!(
        end.counts.highest_attempt <= 2,
        "a task moved more than once on one node loss: {:?}",
        end.counts
    );
    assert_eq!(end.counts.tasks, 2, "{:?}", end.counts);
    let moved = if leads == "tasks" {
        &new_tasks_leader
    } else {
        &new_results_leader
    };
    assert_ne!(moved, &victim_name, "the {leads} stream got a new leader");
    // Every stream and bucket is replicated, and the node is current on each.
    let all: Vec<_> = probe.jetstream().stream_names().collect().await;
    assert_eq!(streams, all.len(), "replicated streams of {all:?}");
    assert_workers_alive(&mut stack);
}

/// Asks the leader of `stream`, on `node`, to step down, and returns the
/// new leader (another node), waiting at most [`WAIT`].
async fn moved_leader(probe: &Bus, stream: &str, node: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let subject = format!("$JS.API.STREAM.LEADER.STEPDOWN.{stream}");
        if let Err(error) = probe.client().request(subject, "".into()).await {
            eprintln!("step down of {stream}: {error}");
        }
        let leader = stream_leader(probe, stream, WAIT).await;
        if leader != node {
            return leader;
        }
        assert!(
            Instant::now() < deadline,
            "the leader of {stream} stays on {node}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
