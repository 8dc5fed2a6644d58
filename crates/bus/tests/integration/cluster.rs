//! A real 3-node nats-server cluster on loopback with every stream and
//! bucket at 3 replicas: a node killed with SIGKILL (a follower, then the
//! tasks stream's leader) does not stop the bus clients, connected with all
//! three URLs, from publishing and consuming; nothing acknowledged is lost;
//! a restarted node catches up until every replica is current.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::task;
use futures::StreamExt as _;
use mtswarm_bus::testing::cluster::{
    LocalCluster, stream_info, stream_leader, wait_meta_leader, wait_replicas_current,
};
use mtswarm_bus::{
    Bus, BusConfig, BusError, DeliveryStream, Jobs, TaskConsumerConfig, TopologyConfig, subjects,
    v1,
};

/// Bound of every wait of this test (elections take seconds).
const WAIT: Duration = Duration::from_secs(60);
/// Tasks and job records written per phase.
const PER_PHASE: usize = 25;

fn three_replicas() -> TopologyConfig {
    TopologyConfig {
        replicas: 3,
        ..TopologyConfig::small()
    }
}

async fn connect_all(cluster: &LocalCluster, name: &str) -> Bus {
    let mut config = BusConfig::new(cluster.urls()[0].clone()).with_name(name);
    config.servers = cluster.urls();
    config.request_timeout = Duration::from_secs(5);
    let bus = Bus::connect(config).await.expect("connect");
    bus.wait_connected(WAIT).await.expect("connected");
    bus
}

/// Retries `op` until it succeeds or [`WAIT`] passes: during a failover a
/// write may time out or find no leader; a retried task publish keeps its
/// message id, so the stream stores it once.
async fn until_ok<T, F, Fut>(what: &str, op: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, BusError>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        match op().await {
            Ok(value) => return value,
            Err(error) if Instant::now() < deadline => {
                eprintln!("{what}: retrying after {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => panic!("{what} failed for {WAIT:?}: {error}"),
        }
    }
}

/// What the test wrote and the cluster acknowledged.
#[derive(Default)]
struct Written {
    tasks: BTreeSet<String>,
    jobs: BTreeSet<String>,
}

/// Publishes `PER_PHASE` tasks and job records named after `phase`,
/// recording each one the cluster acknowledged.
async fn write_phase(leader: &Bus, jobs: &Jobs, phase: &str, written: &mut Written) {
    for i in 0..PER_PHASE {
        let task_id = format!("{phase}-t{i}");
        let assignment = task(&task_id, 1, "w1", "s1");
        until_ok(&format!("publish {task_id}"), || {
            leader.publish_task(&assignment)
        })
        .await;
        written.tasks.insert(task_id);

        let job_id = format!("{phase}-job{i}");
        let record = v1::JobRecord {
            job_id: job_id.clone(),
            summary: format!("written in phase {phase}"),
            ..Default::default()
        };
        until_ok(&format!("put {job_id}"), || jobs.kv().put(&job_id, &record)).await;
        written.jobs.insert(job_id);
    }
}

/// Consumes (and acks) tasks until every acknowledged task was delivered.
async fn consume_all(
    deliveries: &mut DeliveryStream<v1::TaskAssignment>,
    written: &Written,
    consumed: &mut BTreeSet<String>,
) {
    let wait = async {
        while !written.tasks.is_subset(consumed) {
            match deliveries.next().await.expect("task stream stays open") {
                Ok(delivery) => {
                    let task_id = delivery.message().task_id.clone();
                    // A lost ack only means a redelivery, which the set absorbs.
                    if let Err(error) = delivery.ack().await {
                        eprintln!("ack of {task_id}: {error}");
                    }
                    consumed.insert(task_id);
                }
                Err(error) => eprintln!("transient consumer error: {error}"),
            }
        }
    };
    tokio::time::timeout(WAIT, wait).await.unwrap_or_else(|_| {
        let missing: Vec<_> = written.tasks.difference(consumed).collect();
        panic!("tasks acknowledged but never delivered: {missing:?}")
    });
}

async fn assert_jobs_readable(jobs: &Jobs, written: &Written) {
    for job_id in &written.jobs {
        let stored = until_ok(&format!("get {job_id}"), || jobs.get(job_id)).await;
        let stored = stored.unwrap_or_else(|| panic!("job record {job_id} lost"));
        assert_eq!(&stored.value.job_id, job_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_replica_bus_survives_a_killed_node_and_the_node_catches_up() {
    let mut cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .expect("start task")
        .expect("3 nats-servers start");
    let leader = connect_all(&cluster, "leader").await;
    let worker = connect_all(&cluster, "worker").await;
    wait_meta_leader(&leader, WAIT).await;
    let topology = three_replicas();
    until_ok("ensure R3", || leader.ensure_topology(&topology)).await;
    wait_replicas_current(&leader, WAIT).await;

    let tasks_info = stream_info(&leader, subjects::TASKS_STREAM)
        .await
        .expect("tasks info");
    assert_eq!(tasks_info.config.num_replicas, 3);
    let replicas = tasks_info.cluster.expect("clustered").replicas;
    assert_eq!(replicas.len(), 2, "two followers: {replicas:?}");

    // More replicas than the cluster has: the server refuses, and the error
    // says so with the numbers.
    let five = TopologyConfig {
        replicas: 5,
        ..three_replicas()
    };
    let error = leader.ensure_topology(&five).await.expect_err("5 of 3");
    let BusError::Replicas {
        replicas, servers, ..
    } = &error
    else {
        panic!("not a replicas error: {error}");
    };
    assert_eq!((*replicas, *servers), (5, 3), "{error}");

    let jobs = Jobs::open(&leader).await.expect("jobs bucket");
    let mut deliveries = worker
        .task_consumer("w1", TaskConsumerConfig::default())
        .await
        .expect("task consumer")
        .messages()
        .await
        .expect("task stream");
    let mut written = Written::default();
    let mut consumed = BTreeSet::new();
    write_phase(&leader, &jobs, "all-up", &mut written).await;
    consume_all(&mut deliveries, &written, &mut consumed).await;

    // A follower of the tasks stream dies; then its leader does.
    let tasks_leader = stream_leader(&leader, subjects::TASKS_STREAM, WAIT).await;
    let follower = (0..cluster.size())
        .find(|&index| cluster.name(index) != tasks_leader)
        .expect("a follower");
    for (label, victim) in [("follower-down", Some(follower)), ("leader-down", None)] {
        let victim = match victim {
            Some(index) => index,
            None => {
                let name = stream_leader(&leader, subjects::TASKS_STREAM, WAIT).await;
                cluster.index_of(&name).expect("the leader is a node")
            }
        };
        eprintln!("killing {} ({label})", cluster.name(victim));
        cluster.kill(victim).expect("SIGKILL");
        write_phase(&leader, &jobs, label, &mut written).await;
        consume_all(&mut deliveries, &written, &mut consumed).await;
        assert_jobs_readable(&jobs, &written).await;

        tokio::task::block_in_place(|| cluster.restart(victim)).expect("restart");
        let started = Instant::now();
        wait_replicas_current(&leader, WAIT).await;
        eprintln!(
            "{} caught up in {:?} after {label}",
            cluster.name(victim),
            started.elapsed()
        );
    }

    assert_eq!(written.tasks.len(), 3 * PER_PHASE);
    assert_eq!(
        consumed, written.tasks,
        "every acknowledged task, nothing else"
    );
    assert_jobs_readable(&jobs, &written).await;
    let stored = jobs.kv().keys().await.expect("keys");
    assert_eq!(stored.len(), written.jobs.len(), "{stored:?}");
}
