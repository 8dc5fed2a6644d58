//! The fleet as the leader sees it: the slices registered by worker daemons
//! (workers KV), combined with the leases (who runs on a slice) and the
//! quarantine records, and filtered by the hw crate's slice selector.
//!
//! Slice states: OFFLINE when its worker's record is stale (no heartbeat
//! within the configured `worker_stale_after`) or gone (a lease still names
//! the slice but no worker record lists it: only its id is known then);
//! else QUARANTINED when a quarantine record exists; else LEASED when a
//! lease names a session; else FREE. A quarantined slice carries its
//! `SliceQuarantine` whatever its state.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use mtswarm_bus::{BusError, Leases, Quarantine, Workers, v1};
use mtswarm_hw::SliceSelector;
use mtswarm_hw::board::Slice;
use mtswarm_hw::fleet::parse_backend;

use crate::error::SelectorError;

/// Workers and their slices with a state each.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetView {
    /// The slices the selector matched, by slice id, each with its state;
    /// a slice only a lease still names (its worker is gone) appears only
    /// when there is no selector.
    pub slices: Vec<v1::FleetSlice>,
    /// Every worker record, stale ones included, by worker id (not
    /// filtered by the selector).
    pub workers: Vec<v1::WorkerRecord>,
}

/// The hw crate's view of a slice descriptor, for selector matching; `None`
/// when the descriptor names a backend the hw crate does not know.
pub(crate) fn hw_slice(descriptor: &v1::SliceDescriptor) -> Option<Slice> {
    Some(Slice {
        board: descriptor.board.clone(),
        cluster: u32::try_from(descriptor.cluster).ok(),
        cores: descriptor.cores,
        backend: parse_backend(&descriptor.backend).ok()?,
    })
}

/// True when `selector` (None = all) matches the slice.
pub(crate) fn selector_matches(selector: Option<&SliceSelector>, slice: &v1::FleetSlice) -> bool {
    match selector {
        None => true,
        Some(selector) => slice
            .slice
            .as_ref()
            .and_then(hw_slice)
            .is_some_and(|s| selector.matches(&s)),
    }
}

/// Parses a selector string; empty or `*` means every slice.
pub(crate) fn parse_selector(text: &str) -> Result<Option<SliceSelector>, SelectorError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    SliceSelector::parse(text).map(Some).map_err(SelectorError)
}

/// True when the worker's last heartbeat is older than `stale_after` (a
/// record without a heartbeat time counts as fresh: its KV TTL governs it).
pub(crate) fn worker_is_stale(worker: &v1::WorkerRecord, stale_after: Duration) -> bool {
    worker
        .heartbeat_at
        .and_then(|t| SystemTime::try_from(t).ok())
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .is_some_and(|age| age > stale_after)
}

/// Reads workers, leases and quarantine records and joins them (see the
/// module docs for the states).
pub(crate) async fn read_fleet(
    workers: &Workers,
    leases: &Leases,
    quarantine: &Quarantine,
    selector: Option<&SliceSelector>,
    stale_after: Duration,
) -> Result<FleetView, BusError> {
    let (worker_records, lease_records, quarantined) =
        tokio::try_join!(workers.list(), leases.list(), quarantine.list())?;
    let leases: HashMap<String, v1::SliceLease> = lease_records
        .into_iter()
        .map(|l| (l.value.slice_id.clone(), l.value))
        .collect();
    let quarantined: HashMap<String, v1::SliceQuarantine> = quarantined
        .into_iter()
        .map(|q| (q.value.slice_id.clone(), q.value))
        .collect();
    let mut view = FleetView::default();
    let mut listed: HashSet<String> = HashSet::new();
    for worker in worker_records {
        let worker = worker.value;
        let offline = worker_is_stale(&worker, stale_after);
        for descriptor in &worker.slices {
            listed.insert(descriptor.slice_id.clone());
            let lease = leases.get(&descriptor.slice_id).cloned();
            let quarantine = quarantined.get(&descriptor.slice_id).cloned();
            let state = if offline {
                v1::SliceState::Offline
            } else if quarantine.is_some() {
                v1::SliceState::Quarantined
            } else if lease.as_ref().is_some_and(|l| !l.session_id.is_empty()) {
                v1::SliceState::Leased
            } else {
                v1::SliceState::Free
            };
            let slice = v1::FleetSlice {
                slice: Some(descriptor.clone()),
                worker_id: worker.worker_id.clone(),
                state: state as i32,
                lease: if state == v1::SliceState::Leased {
                    lease
                } else {
                    None
                },
                quarantine,
                lock_utilization: 0.0,
            };
            if selector_matches(selector, &slice) {
                view.slices.push(slice);
            }
        }
        view.workers.push(worker);
    }
    // Leases of slices no worker record lists: their worker is gone.
    for (slice_id, lease) in &leases {
        if listed.contains(slice_id) {
            continue;
        }
        let slice = v1::FleetSlice {
            slice: Some(v1::SliceDescriptor {
                slice_id: slice_id.clone(),
                ..Default::default()
            }),
            worker_id: lease.worker_id.clone(),
            state: v1::SliceState::Offline as i32,
            lease: None,
            quarantine: quarantined.get(slice_id).cloned(),
            lock_utilization: 0.0,
        };
        if selector.is_none() {
            view.slices.push(slice);
        }
    }
    view.slices.sort_by(|a, b| {
        let key = |s: &v1::FleetSlice| {
            s.slice
                .as_ref()
                .map(|d| d.slice_id.clone())
                .unwrap_or_default()
        };
        key(a).cmp(&key(b))
    });
    view.workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
    Ok(view)
}

/// Lower-case state name for tool output.
pub(crate) fn state_name(state: v1::SliceState) -> &'static str {
    match state {
        v1::SliceState::Free => "free",
        v1::SliceState::Leased => "leased",
        v1::SliceState::Quarantined => "quarantined",
        v1::SliceState::Offline => "offline",
        v1::SliceState::Unspecified => "unknown",
    }
}
