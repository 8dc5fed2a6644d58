//! A worker daemon's liveness: one TTL'd key per daemon
//! (`daemon.<worker_id>` in the leases bucket) that keeps every slice claim
//! the daemon wrote under its epoch. A daemon with a thousand slices renews
//! one key per period instead of a thousand; its slice claims are written
//! only when they change (taken, pointed at a session, released).
//!
//! The rule readers apply ([`live_claim`]): a claim with a `daemon_epoch`
//! holds while its daemon's key holds a lease of exactly that epoch, and
//! reads with the TTL and times of that lease; a claim without one (a
//! standalone holder's) carries its own TTL and holds while its key lives.
//! So a daemon that dies loses all its slices when its one key lapses, and
//! a daemon that comes back takes its key at a new epoch: the claims of its
//! earlier life stay lapsed until it writes them anew.
//!
//! [`LeaseView`] applies the rule to the two watches (claims and daemon
//! keys) and yields the per-slice [`LeaseEvent`]s watchers have always
//! seen: a daemon's lapse is a lapse of each of its slices.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use mtswarm_proto::v1::{DaemonLease, SliceLease};

use crate::error::BusError;
use crate::kv::Versioned;
use crate::lease_event::LeaseEvent;
use crate::ttl_lease::{Change, Leased, TtlLease, Write, leased_fields};

/// Where daemon keys live in the leases bucket: `daemon.<worker_id>`
/// (slice ids are one token, so the two never meet).
pub(crate) const DAEMON_KEY_PREFIX: &str = "daemon.";

fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(at)
}

/// A daemon holds its liveness key: the key and the holder are its id.
impl Leased for DaemonLease {
    const KIND: &'static str = "daemon lease";

    type Error = BusError;

    leased_fields!(key: worker_id, holder: worker_id, stamps);

    fn is_own_write(&self, stored: &Self) -> bool {
        stored.worker_id == self.worker_id && stored.epoch == self.epoch
    }

    fn held(key: &str, _asked_by: &str, current: Option<Self>) -> BusError {
        let current = current.unwrap_or_default();
        BusError::LeaseHeld {
            slice_id: format!("{DAEMON_KEY_PREFIX}{key}"),
            holder_worker_id: current.worker_id,
            holder_session_id: String::new(),
        }
    }

    async fn lost(_lease: &TtlLease<Self>, held: &Versioned<Self>, write: Write) -> BusError {
        let worker_id = held.value.worker_id.clone();
        BusError::DaemonLeaseLost {
            worker_id,
            action: write.done(),
        }
    }

    fn is_lost(error: &BusError) -> bool {
        matches!(error, BusError::DaemonLeaseLost { .. })
    }
}

/// A new daemon lease of `worker_id` taken at `now` (its epoch is set when
/// it is written).
pub(crate) fn daemon_lease(worker_id: &str, ttl_seconds: u32, now: SystemTime) -> DaemonLease {
    let mut lease = DaemonLease {
        worker_id: worker_id.to_owned(),
        ttl_seconds,
        acquired_at: Some(timestamp(now)),
        ..DaemonLease::default()
    };
    lease.renewed(now);
    lease
}

/// `claim` as readers see it while `daemon` keeps it: with the daemon
/// lease's TTL and times.
pub(crate) fn with_daemon_times(mut claim: SliceLease, daemon: &DaemonLease) -> SliceLease {
    claim.ttl_seconds = daemon.ttl_seconds;
    claim.expires_at = daemon.expires_at;
    claim.renewed_at = daemon.renewed_at;
    claim
}

/// The claim as it holds now, or `None` when it does not: a claim of a
/// daemon holds while `daemon_of(worker)` is a lease of its epoch; a claim
/// with its own TTL holds while it is stored.
pub(crate) fn live_claim<'a>(
    claim: SliceLease,
    daemon_of: impl FnOnce(&str) -> Option<&'a DaemonLease>,
) -> Option<SliceLease> {
    if claim.daemon_epoch == 0 {
        return Some(claim);
    }
    let daemon = daemon_of(&claim.worker_id)?;
    (daemon.epoch == claim.daemon_epoch).then(|| with_daemon_times(claim, daemon))
}

/// One input of a [`LeaseView`].
pub(crate) enum ViewInput {
    /// A change of a slice claim.
    Claim(Change<SliceLease>),
    /// A change of a daemon's liveness key.
    Daemon(Change<DaemonLease>),
}

/// The per-slice lease events of the two watches: claims and daemon keys.
#[derive(Debug, Default)]
pub(crate) struct LeaseView {
    /// The latest lease of each daemon seen live.
    daemons: HashMap<String, DaemonLease>,
    /// Every stored claim (live or waiting for its daemon), by slice.
    claims: HashMap<String, Versioned<SliceLease>>,
    /// Claims known before the watch began (a watch from now on), not
    /// announced when their daemon is first seen.
    known_before: HashSet<String>,
}

impl LeaseView {
    /// A view that knows `claims` already (a watch from now on: their
    /// daemons' lapses still lapse them).
    pub(crate) fn with_claims(claims: Vec<Versioned<SliceLease>>) -> Self {
        Self {
            known_before: claims.iter().map(|c| c.value.slice_id.clone()).collect(),
            daemons: HashMap::new(),
            claims: claims
                .into_iter()
                .map(|c| (c.value.slice_id.clone(), c))
                .collect(),
        }
    }

    /// The events `input` makes (none for a daemon's renewal: its slices
    /// stay held).
    pub(crate) fn apply(&mut self, input: ViewInput) -> Vec<LeaseEvent> {
        match input {
            ViewInput::Claim(change) => self.claim_changed(change),
            ViewInput::Daemon(Change::Held(lease)) => self.daemon_held(lease.value),
            ViewInput::Daemon(Change::Released { key } | Change::Lapsed { key }) => {
                self.daemon_gone(&key)
            }
        }
    }

    fn claim_changed(&mut self, change: Change<SliceLease>) -> Vec<LeaseEvent> {
        if !self.known_before.is_empty() {
            let slice = match &change {
                Change::Held(claim) => &claim.value.slice_id,
                Change::Released { key } | Change::Lapsed { key } => key,
            };
            self.known_before.remove(slice);
        }
        match change {
            Change::Held(claim) => {
                let slice_id = claim.value.slice_id.clone();
                self.claims.insert(slice_id, claim.clone());
                let daemons = &self.daemons;
                let Versioned { value, revision } = claim;
                live_claim(value, |w| daemons.get(w))
                    .map(|value| LeaseEvent::Held(Versioned { value, revision }))
                    .into_iter()
                    .collect()
            }
            Change::Released { key } => {
                self.claims.remove(&key);
                vec![LeaseEvent::Released { slice_id: key }]
            }
            Change::Lapsed { key } => {
                self.claims.remove(&key);
                vec![LeaseEvent::Lapsed {
                    slice_id: key,
                    expired_at: None,
                }]
            }
        }
    }

    /// A daemon's lease written: a renewal changes nothing; a new epoch
    /// (a first sight, or the daemon's next life) makes the claims of its
    /// epoch held (but for those known before a watch from now on began)
    /// and those of the epoch before lapsed.
    fn daemon_held(&mut self, lease: DaemonLease) -> Vec<LeaseEvent> {
        let before = self.daemons.insert(lease.worker_id.clone(), lease.clone());
        if before.as_ref().is_some_and(|b| b.epoch == lease.epoch) {
            return Vec::new();
        }
        let mut events = before.map(|b| self.lapse_claims_of(&b)).unwrap_or_default();
        let known_before = std::mem::take(&mut self.known_before);
        events.extend(
            self.claims
                .values()
                .filter(|c| c.value.worker_id == lease.worker_id)
                .filter(|c| c.value.daemon_epoch == lease.epoch)
                .filter(|c| !known_before.contains(&c.value.slice_id))
                .map(|c| {
                    LeaseEvent::Held(Versioned {
                        value: with_daemon_times(c.value.clone(), &lease),
                        revision: c.revision,
                    })
                }),
        );
        self.known_before = known_before
            .into_iter()
            .filter(|slice| {
                self.claims
                    .get(slice)
                    .is_some_and(|c| c.value.worker_id != lease.worker_id)
            })
            .collect();
        events
    }

    /// A daemon's lease lapsed or was released: every claim of its epoch
    /// lapses (a release leaves no claim of a clean shutdown behind).
    fn daemon_gone(&mut self, worker_id: &str) -> Vec<LeaseEvent> {
        self.daemons
            .remove(worker_id)
            .map(|lease| self.lapse_claims_of(&lease))
            .unwrap_or_default()
    }

    fn lapse_claims_of(&self, lease: &DaemonLease) -> Vec<LeaseEvent> {
        let expired_at = lease.expires_at.and_then(|t| SystemTime::try_from(t).ok());
        let mut slices: Vec<&String> = self
            .claims
            .iter()
            .filter(|(_, c)| c.value.worker_id == lease.worker_id)
            .filter(|(_, c)| c.value.daemon_epoch == lease.epoch)
            .map(|(slice, _)| slice)
            .collect();
        slices.sort();
        slices
            .into_iter()
            .map(|slice_id| LeaseEvent::Lapsed {
                slice_id: slice_id.clone(),
                expired_at,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
