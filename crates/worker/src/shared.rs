//! The daemon's shared state: a plain struct of the handles the gRPC
//! service, the sessions and the background tasks all use (configuration,
//! bus stores, slices and their leases, the session table). It sits low in
//! the layering: it knows sessions only as table entries, and the code that
//! acts on it (leases, quarantine, sessions, the service) imports it, never
//! the reverse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtswarm_bus::results::ResultsStore;
use mtswarm_bus::{
    Approvals, Bus, Checkpoints, KeptLease, LeaseSet, Leases, Quarantine, Workers, v1,
};
use mtswarm_hw::{Board, ChipSpec, HwLock, Slice};

use crate::config::WorkerConfig;
use crate::disk::DiskState;
use crate::events::now_timestamp;
use crate::health::SliceHealth;
use crate::session_entry::SessionEntry;
use crate::stop::StopMode;

/// One slice the daemon owns.
pub(crate) struct SliceEntry {
    pub(crate) slice: Slice,
    pub(crate) bus_id: String,
    pub(crate) board: Arc<dyn Board>,
    pub(crate) spec: ChipSpec,
    /// Consecutive failed hardware runs (see [`crate::health`]).
    pub(crate) health: Arc<SliceHealth>,
}

impl SliceEntry {
    pub(crate) fn descriptor(&self) -> v1::SliceDescriptor {
        v1::SliceDescriptor {
            slice_id: self.bus_id.clone(),
            board: self.slice.board.clone(),
            cluster: self
                .slice
                .cluster
                .and_then(|c| i32::try_from(c).ok())
                .unwrap_or(-1),
            cores: self.slice.cores,
            backend: self.slice.backend.to_string(),
        }
    }
}

/// Sessions and which slice each one holds.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) sessions: HashMap<String, Arc<SessionEntry>>,
    /// Session id per slice index (change it through [`Table::reserve`]
    /// and [`Table::free`], which keep `holding` in step).
    pub(crate) slice_owner: Vec<Option<String>>,
    /// Slice index per session id that holds one: the reverse of
    /// `slice_owner`, so SpawnSession finds a session that is still being
    /// started without scanning every slice.
    holding: HashMap<String, usize>,
}

impl Table {
    /// A table of `slices` free slices.
    pub(crate) fn new(slices: usize) -> Self {
        Self {
            sessions: HashMap::new(),
            slice_owner: vec![None; slices],
            holding: HashMap::new(),
        }
    }

    /// True when `session_id` holds a slice (started or being started).
    pub(crate) fn holds_slice(&self, session_id: &str) -> bool {
        self.holding.contains_key(session_id)
    }

    /// Give slice `index` to `session_id` (the caller found it free).
    pub(crate) fn reserve(&mut self, index: usize, session_id: &str) {
        self.slice_owner[index] = Some(session_id.to_owned());
        self.holding.insert(session_id.to_owned(), index);
    }

    /// Free slice `index` if `session_id` still holds it.
    pub(crate) fn free(&mut self, index: usize, session_id: &str) {
        if self.slice_owner[index].as_deref() == Some(session_id) {
            self.slice_owner[index] = None;
            self.holding.remove(session_id);
        }
    }
}

/// State shared by the gRPC service, the sessions and the background tasks.
pub(crate) struct Shared {
    pub(crate) config: WorkerConfig,
    pub(crate) worker_id: String,
    pub(crate) endpoint: String,
    pub(crate) bus: Bus,
    pub(crate) leases: Leases,
    /// Every slice's lease, renewed by one loop for the whole daemon.
    pub(crate) lease_set: LeaseSet,
    pub(crate) workers: Workers,
    pub(crate) quarantine: Quarantine,
    pub(crate) checkpoints: Checkpoints,
    pub(crate) approvals: Approvals,
    pub(crate) results: ResultsStore,
    pub(crate) hw_lock: HwLock,
    /// The key this daemon signs its records with; its public half is in
    /// the worker record ([`crate::provenance`]).
    pub(crate) record_key: mtswarm_auth::WorkerKey,
    pub(crate) slices: Vec<SliceEntry>,
    /// Slice index by bus id and by hardware id ([`slice_id_index`]).
    pub(crate) slice_ids: HashMap<String, usize>,
    pub(crate) table: Mutex<Table>,
    pub(crate) draining: AtomicBool,
    pub(crate) api_key: Option<String>,
    pub(crate) started_at: prost_types::Timestamp,
    /// The workspace root's usage and the janitor's bookkeeping.
    pub(crate) disk: DiskState,
}

impl Shared {
    pub(crate) fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the daemon knows of slice `index`'s lease (`None`: it keeps
    /// none right now).
    pub(crate) fn lease_state(&self, index: usize) -> Option<KeptLease> {
        self.lease_set.state(&self.slices[index].bus_id)
    }

    /// How often a running task tells JetStream it is still being worked on.
    pub(crate) fn progress_interval(&self) -> Duration {
        (self.config.task_ack_wait / 3).max(Duration::from_millis(300))
    }

    /// The index of a slice named by its bus id (`board0-c1`) or its
    /// hardware id (`board0/c1`), from the daemon's index of both.
    pub(crate) fn slice_index(&self, requested: &str) -> Option<usize> {
        self.slice_ids.get(requested.trim()).copied()
    }

    /// The worker record as of now.
    pub(crate) fn record(&self) -> v1::WorkerRecord {
        let active = self.table().sessions.len();
        v1::WorkerRecord {
            worker_id: self.worker_id.clone(),
            endpoint: self.endpoint.clone(),
            slices: self.slices.iter().map(SliceEntry::descriptor).collect(),
            draining: self.draining.load(Ordering::SeqCst),
            active_sessions: u32::try_from(active).unwrap_or(u32::MAX),
            started_at: Some(self.started_at),
            heartbeat_at: Some(now_timestamp()),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            record_key: self.record_key.public_key(),
        }
    }

    /// Ask every session to stop in `mode`.
    pub(crate) fn stop_sessions(&self, mode: StopMode) {
        for session in self.table().sessions.values() {
            session.stop(mode.clone());
        }
    }
}

/// How often the slices' leases are renewed: a third of their TTL.
pub(crate) fn renew_every(lease_ttl: Duration) -> Duration {
    (lease_ttl / 3).max(Duration::from_millis(200))
}

/// Every slice's bus id and hardware id, mapped to its index (the first
/// slice wins a name two slices share, as a scan in order would).
pub(crate) fn slice_id_index(slices: &[SliceEntry]) -> HashMap<String, usize> {
    let mut index = HashMap::with_capacity(slices.len() * 2);
    for (i, slice) in slices.iter().enumerate() {
        index.entry(slice.bus_id.clone()).or_insert(i);
        index.entry(slice.slice.id()).or_insert(i);
    }
    index
}
