//! One `LeaseSet` loop keeps many slice leases alive past several TTLs,
//! a lease taken from under it is reported lost, and when its holder dies
//! every slice lapses and another worker can take it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{WAIT, setup, within};
use futures::StreamExt as _;
use mtswarm_bus::{BusError, KeptLease, LeaseEvent, LeaseRequest, Leases};

const SLICES: usize = 200;
const TTL: Duration = Duration::from_secs(2);
const RENEW_EVERY: Duration = Duration::from_millis(600);

fn request(slice: usize, worker: &str) -> LeaseRequest {
    LeaseRequest::idle(format!("b0-c{slice}"), worker, TTL)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_loop_keeps_many_leases_past_their_ttl_and_a_dead_holder_frees_them_all() {
    let (_server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    let set = leases.keep_set(RENEW_EVERY);
    let mut first_epoch = HashMap::new();
    for slice in 0..SLICES {
        let held = leases
            .acquire(&request(slice, "w1"))
            .await
            .expect("acquire");
        first_epoch.insert(held.value.slice_id.clone(), held.value.epoch);
        set.insert(held);
    }
    assert_eq!(set.len(), SLICES);

    // Every key is written again and again by the one loop; none lapses.
    let mut watch = leases.watch().await.expect("watch");
    let wanted = (3 * TTL).as_millis() / RENEW_EVERY.as_millis();
    let started = Instant::now();
    let mut renewals: HashMap<String, u128> = HashMap::new();
    tokio::time::timeout(WAIT * 2, async {
        while renewals.len() < SLICES || renewals.values().any(|n| *n < wanted) {
            match watch.next().await.expect("watch open").expect("watch item") {
                LeaseEvent::Held(lease) => {
                    assert_eq!(lease.value.worker_id, "w1");
                    *renewals.entry(lease.value.slice_id).or_default() += 1;
                }
                other => panic!("a kept lease changed hands: {other:?}"),
            }
        }
    })
    .await
    .expect("every lease renewed several times within the wait");
    assert!(
        started.elapsed() >= 3 * TTL - RENEW_EVERY,
        "{wanted} renewals each took only {:?}",
        started.elapsed()
    );
    for slice in 0..SLICES {
        let slice_id = format!("b0-c{slice}");
        assert!(
            matches!(set.state(&slice_id), Some(KeptLease::Held(_))),
            "{slice_id}: {:?}",
            set.state(&slice_id)
        );
    }
    let taken = leases
        .acquire(&request(7, "w2"))
        .await
        .expect_err("still held by w1");
    assert!(matches!(taken, BusError::LeaseHeld { .. }), "{taken}");

    // The holder dies: nothing renews, every slice lapses and is free.
    drop(set);
    let mut lapsed = std::collections::HashSet::new();
    within("every lease lapsed", async {
        while lapsed.len() < SLICES {
            if let LeaseEvent::Lapsed { slice_id } =
                watch.next().await.expect("watch open").expect("watch item")
            {
                lapsed.insert(slice_id);
            }
        }
    })
    .await;
    for slice in 0..SLICES {
        let held = leases
            .acquire(&request(slice, "w2"))
            .await
            .expect("free after the lapse");
        assert!(held.value.epoch > first_epoch[&held.value.slice_id]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_lease_names_its_session_and_one_taken_from_under_the_set_is_lost() {
    let (_server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    let set = leases.keep_set(Duration::from_millis(200));
    for slice in 0..3 {
        set.insert(
            leases
                .acquire(&request(slice, "w1"))
                .await
                .expect("acquire"),
        );
    }
    let changed = set
        .change("b0-c0", |lease| lease.session_id = "s1".into())
        .await
        .expect("change")
        .expect("kept");
    let stored = leases.get("b0-c0").await.expect("get").expect("held");
    assert_eq!(stored.value.session_id, "s1");
    assert_eq!(stored.revision, changed.revision);
    assert!(
        set.change("b0-c9", |_| {})
            .await
            .expect("no lease")
            .is_none()
    );

    // An operator deletes one: the loop's next renewal is refused.
    leases.kv().delete("b0-c1", None).await.expect("delete");
    within("the loss reported", async {
        while !matches!(set.state("b0-c1"), Some(KeptLease::Lost { .. })) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let refused = set.change("b0-c1", |_| {}).await.expect_err("lost");
    assert!(matches!(refused, BusError::LeaseLost { .. }), "{refused}");

    // Releasing all frees the held ones and names the lost one.
    let failed = set.release_all().await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "b0-c1");
    assert!(set.is_empty());
    for slice in [0, 2] {
        assert!(
            leases
                .get(&format!("b0-c{slice}"))
                .await
                .expect("get")
                .is_none()
        );
    }
}
