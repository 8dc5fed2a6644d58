//! A slice lease kept on a real 3-node nats-server cluster at 3 replicas
//! survives the SIGKILL of the node that leads the leases bucket: the
//! renewals sent while the cluster elects a new leader are never
//! acknowledged, and the keeper must retry them instead of spending its TTL
//! waiting on one, so the lease is renewed again on the new leader well
//! within its TTL and is never reported lost.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use mtswarm_bus::testing::cluster::{LocalCluster, stream_leader, wait_meta_leader};
use mtswarm_bus::{Bus, BusConfig, KeptLease, LeaseRequest, Leases, TopologyConfig, subjects};

/// Bound of the cluster's own waits (elections take seconds).
const WAIT: Duration = Duration::from_secs(60);
/// The lease TTL of the chaos scenario `nats_cluster`.
const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_lease_outlives_the_election_of_its_buckets_leader() {
    let mut cluster = tokio::task::spawn_blocking(|| LocalCluster::start(3))
        .await
        .expect("start task")
        .expect("3 nats-servers start");
    let mut config = BusConfig::new(cluster.urls()[0].clone()).with_name("lease-cluster");
    config.servers = cluster.urls();
    let bus = Bus::connect(config).await.expect("connect");
    bus.wait_connected(WAIT).await.expect("connected");
    wait_meta_leader(&bus, WAIT).await;
    bus.ensure_topology(&TopologyConfig {
        replicas: 3,
        ..TopologyConfig::small()
    })
    .await
    .expect("topology");
    let leases = Leases::open(&bus).await.expect("leases");
    let held = leases
        .acquire(&LeaseRequest {
            session_id: "s0".into(),
            job_id: "j0".into(),
            ..LeaseRequest::idle("b0-c0", "w0", TTL)
        })
        .await
        .expect("acquire");
    let keeper = leases.keep(held, TTL / 3);
    let mut state = keeper.subscribe();

    let bucket_stream = format!("KV_{}", subjects::LEASES_BUCKET);
    let leader = stream_leader(&bus, &bucket_stream, WAIT).await;
    // Just after a renewal, so the next one meets the election.
    state.changed().await.expect("renewed");
    let renewed_before = match keeper.state() {
        KeptLease::Held(held) => held.revision,
        other => panic!("not held before the kill: {other:?}"),
    };
    let victim = cluster.index_of(&leader).expect("a node of the cluster");
    tokio::task::block_in_place(|| cluster.kill(victim)).expect("SIGKILL the bucket's leader");
    let killed_at = tokio::time::Instant::now();

    // Renewed on the new leader, and never lost on the way.
    let renewed = mtswarm_bus::testing::renewed_after(&mut state, renewed_before, WAIT).await;
    let after = killed_at.elapsed();
    let KeptLease::Held(renewed) = renewed else {
        panic!("lost over the election, {after:?} after the kill: {renewed:?}");
    };
    let new_leader = stream_leader(&bus, &bucket_stream, WAIT).await;
    assert_ne!(new_leader, leader, "the bucket got a new leader");
    eprintln!("lease renewed on {new_leader} {after:?} after its leader {leader} was killed");
    // The bucket holds the keeper's latest write.
    let stored = leases
        .get("b0-c0")
        .await
        .expect("read the lease")
        .expect("lease live");
    assert!(stored.revision >= renewed.revision, "{stored:?}");
    assert_eq!(stored.value.session_id, "s0");
    keeper.release().await.expect("released while held");
}
