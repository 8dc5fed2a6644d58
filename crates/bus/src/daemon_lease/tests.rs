use std::time::{Duration, SystemTime};

use mtswarm_proto::v1::{DaemonLease, SliceLease};

use super::{LeaseView, ViewInput, live_claim};
use crate::kv::Versioned;
use crate::lease_event::LeaseEvent;
use crate::ttl_lease::Change;

fn daemon(worker: &str, epoch: u64, expires_s: u64) -> Change<DaemonLease> {
    Change::Held(Versioned {
        value: DaemonLease {
            worker_id: worker.into(),
            epoch,
            ttl_seconds: 3,
            expires_at: Some((SystemTime::UNIX_EPOCH + Duration::from_secs(expires_s)).into()),
            ..DaemonLease::default()
        },
        revision: epoch,
    })
}

fn claim(slice: &str, worker: &str, daemon_epoch: u64, revision: u64) -> Change<SliceLease> {
    Change::Held(Versioned {
        value: SliceLease {
            slice_id: slice.into(),
            worker_id: worker.into(),
            daemon_epoch,
            epoch: revision,
            ..SliceLease::default()
        },
        revision,
    })
}

fn held(events: &[LeaseEvent]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            LeaseEvent::Held(l) => Some((l.value.slice_id.clone(), l.value.daemon_epoch)),
            _ => None,
        })
        .collect()
}

fn lapsed(events: &[LeaseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            LeaseEvent::Lapsed { slice_id, .. } => Some(slice_id.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_claim_waits_for_its_daemon_and_reads_with_its_times() {
    let mut view = LeaseView::default();
    assert!(
        view.apply(ViewInput::Claim(claim("s0", "w1", 5, 10)))
            .is_empty()
    );
    let events = view.apply(ViewInput::Daemon(daemon("w1", 5, 100)));
    assert_eq!(held(&events), vec![("s0".to_owned(), 5)]);
    let LeaseEvent::Held(lease) = &events[0] else {
        unreachable!()
    };
    assert_eq!(lease.value.ttl_seconds, 3);
    assert_eq!(lease.revision, 10, "the claim's own revision");
    // A renewal of the daemon is no event; a claim written now is held at once.
    assert!(
        view.apply(ViewInput::Daemon(daemon("w1", 5, 103)))
            .is_empty()
    );
    let events = view.apply(ViewInput::Claim(claim("s1", "w1", 5, 11)));
    assert_eq!(held(&events), vec![("s1".to_owned(), 5)]);
}

#[test]
fn a_daemon_lapse_lapses_its_claims_with_its_expiry_and_only_those() {
    let mut view = LeaseView::default();
    for input in [
        ViewInput::Daemon(daemon("w1", 5, 100)),
        ViewInput::Daemon(daemon("w2", 6, 100)),
        ViewInput::Claim(claim("s0", "w1", 5, 10)),
        ViewInput::Claim(claim("s1", "w1", 5, 11)),
        ViewInput::Claim(claim("s2", "w2", 6, 12)),
        ViewInput::Claim(claim("s3", "w9", 0, 13)),
    ] {
        view.apply(input);
    }
    let events = view.apply(ViewInput::Daemon(Change::Lapsed { key: "w1".into() }));
    assert_eq!(lapsed(&events), vec!["s0", "s1"]);
    assert!(events.iter().all(|e| matches!(
        e,
        LeaseEvent::Lapsed { expired_at: Some(at), .. }
            if *at == SystemTime::UNIX_EPOCH + Duration::from_secs(100)
    )));
    // Gone daemons lapse nothing twice; a claim with its own TTL lapses by its key.
    assert!(
        view.apply(ViewInput::Daemon(Change::Released { key: "w1".into() }))
            .is_empty()
    );
    let events = view.apply(ViewInput::Claim(Change::Lapsed { key: "s3".into() }));
    assert_eq!(lapsed(&events), vec!["s3"]);
}

#[test]
fn a_new_epoch_lapses_the_old_lifes_claims_and_holds_the_new_ones() {
    let mut view = LeaseView::default();
    view.apply(ViewInput::Daemon(daemon("w1", 5, 100)));
    view.apply(ViewInput::Claim(claim("s0", "w1", 5, 10)));
    view.apply(ViewInput::Claim(claim("s1", "w1", 5, 11)));
    // The new life's claim of s1 arrives before its daemon lease.
    assert!(
        view.apply(ViewInput::Claim(claim("s1", "w1", 7, 14)))
            .is_empty()
    );
    let events = view.apply(ViewInput::Daemon(daemon("w1", 7, 120)));
    assert_eq!(lapsed(&events), vec!["s0"]);
    assert_eq!(held(&events), vec![("s1".to_owned(), 7)]);
    assert!(
        view.apply(ViewInput::Daemon(daemon("w1", 7, 121)))
            .is_empty()
    );
}

#[test]
fn the_liveness_rule() {
    let own_ttl = SliceLease {
        worker_id: "w1".into(),
        ..SliceLease::default()
    };
    assert!(live_claim(own_ttl, |_| None).is_some());
    let of_daemon = SliceLease {
        worker_id: "w1".into(),
        daemon_epoch: 5,
        ..SliceLease::default()
    };
    let Change::Held(current) = daemon("w1", 5, 100) else {
        unreachable!()
    };
    let Change::Held(later) = daemon("w1", 6, 100) else {
        unreachable!()
    };
    assert!(live_claim(of_daemon.clone(), |_| None).is_none());
    assert!(live_claim(of_daemon.clone(), |_| Some(&later.value)).is_none());
    let live = live_claim(of_daemon, |w| (w == "w1").then_some(&current.value)).expect("live");
    assert_eq!(live.expires_at, current.value.expires_at);
}

#[test]
fn a_watch_from_now_announces_no_claim_it_knew_before() {
    let Change::Held(before) = claim("s0", "w1", 5, 10) else {
        unreachable!()
    };
    let mut view = LeaseView::with_claims(vec![before]);
    assert!(
        view.apply(ViewInput::Daemon(daemon("w1", 5, 100)))
            .is_empty()
    );
    // ... but a lapse of its daemon lapses it.
    let events = view.apply(ViewInput::Daemon(Change::Lapsed { key: "w1".into() }));
    assert_eq!(lapsed(&events), vec!["s0"]);
}
