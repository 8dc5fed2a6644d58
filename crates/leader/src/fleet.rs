//! The fleet as the leader sees it: the slices registered by live worker
//! daemons (workers KV), combined with the leases (who runs on a slice) and
//! the quarantine records, and filtered by the hw crate's slice selector.

use std::collections::HashMap;

use mtswarm_bus::{BusError, Leases, Quarantine, Workers, v1};
use mtswarm_hw::SliceSelector;
use mtswarm_hw::board::Slice;
use mtswarm_hw::fleet::parse_backend;

/// Workers and their slices with a state each.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    pub slices: Vec<v1::FleetSlice>,
    pub workers: Vec<v1::WorkerRecord>,
}

/// The hw crate's view of a slice descriptor, for selector matching; `None`
/// when the descriptor names a backend the hw crate does not know.
pub fn hw_slice(descriptor: &v1::SliceDescriptor) -> Option<Slice> {
    Some(Slice {
        board: descriptor.board.clone(),
        cluster: u32::try_from(descriptor.cluster).ok(),
        cores: descriptor.cores,
        backend: parse_backend(&descriptor.backend).ok()?,
    })
}

/// True when `selector` (None = all) matches the slice.
pub fn selector_matches(selector: Option<&SliceSelector>, slice: &v1::FleetSlice) -> bool {
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
pub fn parse_selector(text: &str) -> Result<Option<SliceSelector>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    SliceSelector::parse(text)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Reads workers, leases and quarantine records and joins them.
pub async fn read_fleet(
    workers: &Workers,
    leases: &Leases,
    quarantine: &Quarantine,
    selector: Option<&SliceSelector>,
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
    for worker in worker_records {
        let worker = worker.value;
        for descriptor in &worker.slices {
            let lease = leases.get(&descriptor.slice_id).cloned();
            let quarantine = quarantined.get(&descriptor.slice_id).cloned();
            let state = if quarantine.is_some() {
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
pub fn state_name(state: v1::SliceState) -> &'static str {
    match state {
        v1::SliceState::Free => "free",
        v1::SliceState::Leased => "leased",
        v1::SliceState::Quarantined => "quarantined",
        v1::SliceState::Offline => "offline",
        v1::SliceState::Unspecified => "unknown",
    }
}
