//! The daemon's slices and what runs on them: each slice's board, chip and
//! health, the session table (which session holds which slice), and
//! whether the daemon is draining. Everything that places, stops or counts
//! sessions goes through it; it knows sessions only as table entries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mtswarm_bus::v1;
use mtswarm_hw::{Board, ChipSpec, Slice};

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

/// The daemon's slices, in fleet order, and their session table. Derefs to
/// the slices.
pub(crate) struct Slices {
    entries: Vec<SliceEntry>,
    /// Slice index by bus id and by hardware id ([`slice_id_index`]).
    ids: HashMap<String, usize>,
    table: Mutex<Table>,
    draining: AtomicBool,
}

impl std::ops::Deref for Slices {
    type Target = [SliceEntry];

    fn deref(&self) -> &[SliceEntry] {
        &self.entries
    }
}

impl Slices {
    /// `entries` with no session yet, not draining.
    pub(crate) fn new(entries: Vec<SliceEntry>) -> Self {
        Self {
            ids: slice_id_index(&entries),
            table: Mutex::new(Table::new(entries.len())),
            entries,
            draining: AtomicBool::new(false),
        }
    }

    pub(crate) fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index of a slice named by its bus id (`board0-c1`) or its
    /// hardware id (`board0/c1`), from the daemon's index of both.
    pub(crate) fn index_of(&self, requested: &str) -> Option<usize> {
        self.ids.get(requested.trim()).copied()
    }

    /// The sessions now (a snapshot: the table is not held).
    pub(crate) fn sessions(&self) -> Vec<Arc<SessionEntry>> {
        self.table().sessions.values().cloned().collect()
    }

    /// Ask every session to stop in `mode`.
    pub(crate) fn stop_sessions(&self, mode: StopMode) {
        for session in self.table().sessions.values() {
            session.stop(mode.clone());
        }
    }

    /// Whether the daemon refuses new sessions.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// From now on the daemon refuses new sessions; true when it already did.
    pub(crate) fn start_draining(&self) -> bool {
        self.draining.swap(true, Ordering::SeqCst)
    }
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
