//! One `LeaseSet` keeps many slice claims alive past several TTLs with one
//! key renewed per daemon (renewal writes grow with daemons, not slices), a
//! claim taken from under it is reported lost, and when its daemon dies
//! every slice lapses and another worker can take it; a daemon that comes
//! back takes its lease at a new epoch, under which its old claims do not
//! hold.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{setup, within};
use futures::StreamExt as _;
use mtswarm_bus::{BusError, KeptLease, LeaseEvent, LeaseRequest, Leases, subjects};

const SLICES: usize = 200;
const TTL: Duration = Duration::from_secs(2);
const RENEW_EVERY: Duration = Duration::from_millis(600);

fn slice(n: usize) -> String {
    format!("b0-c{n}")
}

fn request(n: usize, worker: &str) -> LeaseRequest {
    LeaseRequest::idle(slice(n), worker, TTL)
}

/// Every write to the leases bucket, by key, for `period`.
async fn writes_by_key(bus: &mtswarm_bus::Bus, period: Duration) -> HashMap<String, usize> {
    let store = bus
        .jetstream()
        .get_key_value(subjects::LEASES_BUCKET)
        .await
        .expect("leases bucket");
    let mut watch = store.watch_all().await.expect("raw watch");
    let mut writes: HashMap<String, usize> = HashMap::new();
    let until = tokio::time::Instant::now() + period;
    while let Ok(Some(entry)) = tokio::time::timeout_at(until, watch.next()).await {
        *writes.entry(entry.expect("entry").key).or_default() += 1;
    }
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_daemon_lease_keeps_many_claims_past_their_ttl_and_its_lapse_frees_them_all() {
    let (_server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    let set = leases.keep_set("w1", TTL, RENEW_EVERY);
    let mut first_epoch = HashMap::new();
    for n in 0..SLICES {
        let held = set.claim(&slice(n)).await.expect("claim");
        assert_eq!(held.value.worker_id, "w1");
        assert_ne!(held.value.daemon_epoch, 0, "a daemon's claim");
        first_epoch.insert(held.value.slice_id.clone(), held.value.epoch);
    }
    assert_eq!(set.len(), SLICES);
    let mut watch = leases.watch().await.expect("watch");

    // For three TTLs only the daemon's key is written, a few times a TTL;
    // no claim is written and none lapses.
    let started = Instant::now();
    let writes = writes_by_key(&bus, 3 * TTL).await;
    let wanted = ((3 * TTL).as_millis() / RENEW_EVERY.as_millis()) as usize - 1;
    assert_eq!(
        writes.keys().collect::<Vec<_>>(),
        vec!["daemon.w1"],
        "only the daemon lease is renewed: {writes:?}"
    );
    assert!(writes["daemon.w1"] >= wanted, "{writes:?}");
    assert!(started.elapsed() >= 3 * TTL);
    let listed = leases.list().await.expect("list");
    assert_eq!(listed.len(), SLICES, "every claim holds past its TTL");
    let daemon = set.daemon().expect("the daemon lease counts");
    for lease in &listed {
        assert_eq!(lease.value.expires_at, daemon.value.expires_at, "{lease:?}");
    }
    for n in 0..SLICES {
        assert!(
            matches!(set.state(&slice(n)), Some(KeptLease::Held(_))),
            "{}: {:?}",
            slice(n),
            set.state(&slice(n))
        );
    }
    for standalone in [
        leases.acquire(&request(7, "w2")).await,
        leases.reclaim(&request(7, "w2")).await,
    ] {
        let refused = standalone.expect_err("still held by w1");
        assert!(matches!(refused, BusError::LeaseHeld { .. }), "{refused}");
    }

    // The daemon dies: nothing renews, its one key lapses and every slice
    // with it, each lapse naming when.
    drop(set);
    let mut lapsed = HashSet::new();
    within("every lease lapsed", async {
        while lapsed.len() < SLICES {
            match watch.next().await.expect("watch open").expect("watch item") {
                LeaseEvent::Lapsed {
                    slice_id,
                    expired_at,
                } => {
                    assert!(expired_at.is_some(), "{slice_id}");
                    lapsed.insert(slice_id);
                }
                other => panic!("a kept claim changed before the lapse: {other:?}"),
            }
        }
    })
    .await;
    assert!(leases.list().await.expect("list").is_empty());
    let other = leases.keep_set("w2", TTL, RENEW_EVERY);
    for n in 0..SLICES {
        let held = other.claim(&slice(n)).await.expect("free after the lapse");
        assert_eq!(held.value.worker_id, "w2");
        assert!(held.value.epoch > first_epoch[&held.value.slice_id]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_back_at_a_new_epoch_ends_the_claims_of_its_earlier_life() {
    let (_server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    let first = leases.keep_set("w1", TTL, RENEW_EVERY);
    first.claim(&slice(0)).await.expect("claim");
    first
        .change(&slice(0), |lease| lease.session_id = "s-old".into())
        .await
        .expect("change")
        .expect("kept");
    let mut watch = leases.watch_with_current().await.expect("watch");
    let held = within("the claim seen held", async {
        loop {
            if let LeaseEvent::Held(lease) = watch.next().await.expect("open").expect("item") {
                break lease;
            }
        }
    })
    .await;
    assert_eq!(held.value.session_id, "s-old");

    // The same daemon restarts (its old process frozen): a new set takes
    // the daemon lease at a new epoch; the old claim lapses at once.
    let second = leases.keep_set("w1", TTL, RENEW_EVERY);
    let reclaimed = second.claim(&slice(1)).await.expect("claim");
    let lapsed = within("the old life's claim lapsed", async {
        loop {
            if let LeaseEvent::Lapsed { slice_id, .. } =
                watch.next().await.expect("open").expect("item")
            {
                break slice_id;
            }
        }
    })
    .await;
    assert_eq!(lapsed, slice(0));
    assert!(leases.get(&slice(0)).await.expect("get").is_none());
    assert!(reclaimed.value.daemon_epoch > held.value.daemon_epoch);

    // The frozen process wakes: its renewal is refused, so its claims are
    // lost and a change through it is refused.
    within("the old set's loss reported", async {
        while !matches!(first.state(&slice(0)), Some(KeptLease::Lost { .. })) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let refused = first.change(&slice(0), |_| {}).await.expect_err("lost");
    assert!(matches!(refused, BusError::LeaseLost { .. }), "{refused}");
    // The new life claims the slice again, idle.
    let again = second.claim(&slice(0)).await.expect("claim again");
    assert_eq!(again.value.session_id, "");
    assert_eq!(
        leases
            .get(&slice(0))
            .await
            .expect("get")
            .expect("held")
            .value,
        again.value
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_lease_names_its_session_and_one_taken_from_under_the_set_is_lost() {
    let (_server, bus) = setup().await;
    let leases = Leases::open(&bus).await.expect("leases");
    let set = leases.keep_set("w1", TTL, Duration::from_millis(200));
    for n in 0..3 {
        set.claim(&slice(n)).await.expect("claim");
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

    // An operator deletes one: its next change is refused and it is lost.
    leases.kv().delete("b0-c1", None).await.expect("delete");
    let refused = set.change("b0-c1", |_| {}).await.expect_err("lost");
    assert!(
        matches!(set.state("b0-c1"), Some(KeptLease::Lost { .. })),
        "{:?}",
        set.state("b0-c1")
    );
    assert!(matches!(refused, BusError::LeaseLost { .. }), "{refused}");

    // Releasing all frees the held ones and names the lost one.
    let failed = set.release_all().await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "b0-c1");
    assert!(set.is_empty());
    for n in [0, 2] {
        assert!(leases.get(&slice(n)).await.expect("get").is_none());
    }
    // The daemon lease went with them.
    assert!(leases.daemon("w1").await.expect("get").is_none());
}
