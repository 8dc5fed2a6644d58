//! ListFleet: a live worker's slices are FREE or LEASED, a quarantined one
//! QUARANTINED with its record; the slices of a worker whose record is
//! stale, or gone while a lease still names the slice, are OFFLINE.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use mtswarm_bus::{LeaseRequest, Leases, Quarantine, Workers, v1};
use mtswarm_core::testing::ScriptedModel;

fn slice(slice_id: &str, board: &str) -> v1::SliceDescriptor {
    v1::SliceDescriptor {
        slice_id: slice_id.into(),
        board: board.into(),
        cluster: 0,
        cores: 8,
        backend: "emulator".into(),
    }
}

#[tokio::test]
async fn list_fleet_marks_offline_and_quarantined_slices() {
    let env = Env::start().await;
    let _live = FakeWorker::start(&env.bus, "live", "lb").await;
    let workers = Workers::open(&env.bus).await.expect("workers");
    let stale_beat = SystemTime::now() - Duration::from_secs(600);
    workers
        .register(
            &v1::WorkerRecord {
                worker_id: "stale".into(),
                endpoint: "http://127.0.0.1:9".into(),
                slices: vec![slice("sb-c0", "sb")],
                heartbeat_at: Some(prost_types::Timestamp::from(stale_beat)),
                ..Default::default()
            },
            Duration::from_secs(60),
        )
        .await
        .expect("stale worker");
    workers
        .register(
            &v1::WorkerRecord {
                worker_id: "sick".into(),
                endpoint: "http://127.0.0.1:9".into(),
                slices: vec![slice("qb-c0", "qb")],
                heartbeat_at: Some(prost_types::Timestamp::from(SystemTime::now())),
                ..Default::default()
            },
            Duration::from_secs(60),
        )
        .await
        .expect("sick worker");
    let quarantine = v1::SliceQuarantine {
        slice_id: "qb-c0".into(),
        worker_id: "sick".into(),
        reason: "3 crashes in a row".into(),
        consecutive_failures: 3,
        since: Some(prost_types::Timestamp::from(SystemTime::now())),
        by: "sick".into(),
    };
    Quarantine::open(&env.bus)
        .await
        .expect("quarantine")
        .put(&quarantine)
        .await
        .expect("quarantine record");
    // A lease left by a worker whose record is gone.
    Leases::open(&env.bus)
        .await
        .expect("leases")
        .acquire(&LeaseRequest {
            slice_id: "gone-c0".into(),
            worker_id: "gone".into(),
            session_id: String::new(),
            job_id: String::new(),
            ttl: Duration::from_secs(30),
        })
        .await
        .expect("orphan lease");

    let leader = env.leader(Arc::new(ScriptedModel::new([]))).await;
    let mut control = control(&leader).await;
    let fleet = control
        .list_fleet(v1::ListFleetRequest::default())
        .await
        .expect("list_fleet")
        .into_inner();
    let state_of = |slice_id: &str| -> (v1::SliceState, Option<v1::SliceQuarantine>) {
        let found = fleet
            .slices
            .iter()
            .find(|s| s.slice.as_ref().is_some_and(|d| d.slice_id == slice_id))
            .unwrap_or_else(|| panic!("slice {slice_id} listed: {:?}", fleet.slices));
        (found.state(), found.quarantine.clone())
    };
    assert_eq!(state_of("lb-c0"), (v1::SliceState::Free, None));
    assert_eq!(state_of("sb-c0").0, v1::SliceState::Offline);
    assert_eq!(state_of("gone-c0").0, v1::SliceState::Offline);
    assert_eq!(
        state_of("qb-c0"),
        (v1::SliceState::Quarantined, Some(quarantine))
    );
    leader.shutdown().await.expect("shutdown");
}
