//! What lets one job's `spawn_agent` calls run concurrently: a job that
//! spawns a thousand agents in one turn would otherwise start them one at a
//! time, each reading the whole fleet (every worker, lease and quarantine
//! record) again.
//!
//! - The fleet view is shared for [`FLEET_VIEW_TTL`] between the calls of a
//!   job (one read serves a whole turn of spawns). A stale view cannot
//!   double-book a slice: the leader's own claims (`claimed_slices`) cover
//!   its spawns, and a worker refuses a slice another leader took
//!   meanwhile; a call that finds no free slice in a cached view looks
//!   again with a fresh one.
//! - At most [`SPAWN_CONCURRENCY`] SpawnSession calls of a job are in flight.
//! - Agent names are reserved while their spawn runs, so two concurrent
//!   calls never take the same name (a default `agent-N` moves on to the
//!   next free number).
//! - Concurrent `assign_task` calls add to the job record's task count
//!   through one writer ([`Spawning::count_tasks`]): a thousand concurrent
//!   compare-and-set updates of the one record would each retry against
//!   all the others.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mtswarm_bus::BusError;
use mtswarm_hw::SliceSelector;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::fleet::FleetView;
use crate::job::JobContext;
use crate::placement::Placement;

/// How long one read of the fleet serves the job's spawns.
pub(crate) const FLEET_VIEW_TTL: Duration = Duration::from_secs(1);
/// SpawnSession calls of one job in flight at once.
pub(crate) const SPAWN_CONCURRENCY: usize = 32;

/// A fleet view and when it was read, for one selector.
struct CachedView {
    selector: String,
    read_at: Instant,
    view: Arc<FleetView>,
}

/// The spawn state one job's tool calls share (see the module docs).
pub(crate) struct Spawning {
    view: tokio::sync::Mutex<Option<CachedView>>,
    permits: Semaphore,
    names: Mutex<HashSet<String>>,
    /// New tasks not yet added to the job record's count.
    uncounted: Mutex<u32>,
    /// Held by the one call writing the count.
    count_writer: tokio::sync::Mutex<()>,
}

impl Default for Spawning {
    fn default() -> Self {
        Self {
            view: tokio::sync::Mutex::new(None),
            permits: Semaphore::new(SPAWN_CONCURRENCY),
            names: Mutex::new(HashSet::new()),
            uncounted: Mutex::new(0),
            count_writer: tokio::sync::Mutex::new(()),
        }
    }
}

/// A name reserved by [`Spawning::reserve_name`], released on drop.
pub(crate) struct NameReservation<'a> {
    spawning: &'a Spawning,
    name: String,
}

impl NameReservation<'_> {
    /// The reserved agent name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for NameReservation<'_> {
    fn drop(&mut self) {
        self.spawning
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.name);
    }
}

impl Spawning {
    /// The fleet as `selector` sees it: the shared view when it is younger
    /// than [`FLEET_VIEW_TTL`] (and `fresh` is false), else a new read.
    /// Returns whether the view came from the cache.
    pub(crate) async fn view(
        &self,
        placement: &Placement,
        selector_text: &str,
        selector: Option<&SliceSelector>,
        fresh: bool,
    ) -> Result<(Arc<FleetView>, bool), BusError> {
        let mut cached = self.view.lock().await;
        if !fresh
            && let Some(entry) = cached.as_ref()
            && entry.selector == selector_text
            && entry.read_at.elapsed() < FLEET_VIEW_TTL
        {
            return Ok((entry.view.clone(), true));
        }
        let view = Arc::new(placement.fleet_view(selector).await?);
        *cached = Some(CachedView {
            selector: selector_text.to_string(),
            read_at: Instant::now(),
            view: view.clone(),
        });
        Ok((view, false))
    }

    /// Adds `new_tasks` to the job record's task count; returns once a
    /// write that includes them has been made (by this call, or by the one
    /// that held the writer before it and took them along).
    pub(crate) async fn count_tasks(&self, job: &JobContext, new_tasks: u32) {
        *self.uncounted.lock().unwrap_or_else(|e| e.into_inner()) += new_tasks;
        let _writer = self.count_writer.lock().await;
        let pending =
            std::mem::take(&mut *self.uncounted.lock().unwrap_or_else(|e| e.into_inner()));
        if pending > 0 {
            // No task keys: only the count (a failure is logged there).
            let _ = job.store_tasks(&[], pending).await;
        }
    }

    /// A place among the SpawnSession calls in flight.
    pub(crate) async fn permit(&self) -> Option<SemaphorePermit<'_>> {
        self.permits.acquire().await.ok()
    }

    /// Reserves `wanted` (or the first free `agent-N` when `None`) for a
    /// spawn of `job`; `Err` names a taken name.
    pub(crate) fn reserve_name(
        &self,
        job: &JobContext,
        wanted: Option<String>,
    ) -> Result<NameReservation<'_>, String> {
        let agents = job.agents();
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let name = match wanted {
            Some(name) => {
                if agents.contains_key(&name) || names.contains(&name) {
                    return Err(name);
                }
                name
            }
            None => {
                let mut number = agents.len() + names.len() + 1;
                loop {
                    let name = format!("agent-{number}");
                    if !agents.contains_key(&name) && !names.contains(&name) {
                        break name;
                    }
                    number += 1;
                }
            }
        };
        names.insert(name.clone());
        Ok(NameReservation {
            spawning: self,
            name,
        })
    }
}
