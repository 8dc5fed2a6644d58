//! A holder owns a KV key only while it keeps renewing it: the one
//! mechanism behind slice leases ([`crate::Leases`]: a worker daemon and a
//! slice) and job ownership ([`crate::JobOwners`]: a leader and a job).
//!
//! The key carries a per-message TTL. It is taken by a conditional create
//! (or, by its own holder, by a write at the revision it read), renewed by
//! a write conditional on the revision the holder last saw, and released by
//! a delete at that revision; so a holder that lost the key (it lapsed, or
//! another holder took it) finds out on its next write instead of
//! overwriting the new holder. A holder that dies stops renewing, the key
//! lapses, and the server leaves an expiry marker that every watcher sees
//! ([`Change::Lapsed`]), distinct from a release ([`Change::Released`]).
//! Every acquisition carries a fencing epoch above every revision the
//! bucket wrote before, so work done under an older holding can be told
//! from the current one's.
//!
//! What differs between the uses is the value's ([`Leased`]): how it names
//! its key and holder, what it stamps on a renewal, which stored write is
//! its own, and the errors that name what was involved. [`TtlLease::keep`]
//! and [`TtlLease::attempt`] hold the renewal loop both keepers (and the
//! slice lease set) run, timed by [`crate::renewal`].

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
use tokio::time::Instant;

use crate::codec::BusMessage;
use crate::connection::Bus;
use crate::error::BusError;
use crate::kv::{KvChange, TypedKv, Versioned};
use crate::renewal::Renewal;

/// A write of a holder conditional on the revision it last saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Replacing a live value of the same holder (a restarted holder taking
    /// its own key back without waiting for the lapse).
    Retake,
    /// A renewal.
    Renewal,
    /// A release.
    Release,
}

impl Write {
    /// What the holder did, for errors (`"renewed"`, ...).
    pub(crate) fn done(self) -> &'static str {
        match self {
            Write::Retake => "reclaimed",
            Write::Renewal => "renewed",
            Write::Release => "released",
        }
    }
}

/// The [`Leased`] accessors of a record whose key and holder are the named
/// fields and which has `ttl_seconds` and `epoch` fields, as every leased
/// record of the bus does.
/// `, stamps` adds the renewal of a record with `renewed_at` and
/// `expires_at` stamps (the latter one TTL after the former).
macro_rules! leased_fields {
    (key: $key:ident, holder: $holder:ident, stamps) => {
        leased_fields!(key: $key, holder: $holder);

        fn renewed(&mut self, now: SystemTime) {
            self.renewed_at = Some(prost_types::Timestamp::from(now));
            self.expires_at = Some(prost_types::Timestamp::from(now + self.ttl()));
        }
    };
    (key: $key:ident, holder: $holder:ident) => {
        fn key(&self) -> &str {
            &self.$key
        }

        fn holder(&self) -> &str {
            &self.$holder
        }

        fn ttl_seconds(&self) -> u32 {
            self.ttl_seconds
        }

        fn set_epoch(&mut self, epoch: u64) {
            self.epoch = epoch;
        }
    };
}
pub(crate) use leased_fields;

/// The value stored under a TTL'd key, and what differs between its uses.
pub(crate) trait Leased: BusMessage + Clone + PartialEq + fmt::Debug {
    /// What is held, for logs (e.g. `"slice lease"`).
    const KIND: &'static str;

    /// The refusals of this use, naming what was involved.
    type Error: std::error::Error + From<BusError> + Send + 'static;

    /// The key the value is stored under.
    fn key(&self) -> &str;
    /// Who holds it; only it renews or releases it.
    fn holder(&self) -> &str;
    /// The TTL the value declares, in whole seconds.
    fn ttl_seconds(&self) -> u32;
    /// Records the fencing epoch of a new acquisition.
    fn set_epoch(&mut self, epoch: u64);
    /// Stamps a renewal written at `now`.
    fn renewed(&mut self, now: SystemTime);
    /// True when `stored` is a write of the holding `self` describes: a
    /// renewal whose acknowledgement was lost, found in the key.
    fn is_own_write(&self, stored: &Self) -> bool;

    /// `asked_by` found `key` held by `current` (`None`: freed between the
    /// refused write and the read that was to name the holder).
    fn held(key: &str, asked_by: &str, current: Option<Self>) -> Self::Error;
    /// `write`, conditional on `held`'s revision, was refused: the key
    /// lapsed or changed hands since. May read `lease` to name the holder.
    fn lost(
        lease: &TtlLease<Self>,
        held: &Versioned<Self>,
        write: Write,
    ) -> impl Future<Output = Self::Error> + Send;
    /// True for the errors [`Leased::lost`] makes: a kept lease is then
    /// lost, where any other error is retried.
    fn is_lost(error: &Self::Error) -> bool;

    /// Lapse time without renewal (at least 1 s, the server's minimum).
    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.ttl_seconds().max(1)))
    }
}

/// A change of one key's holding, as a watch sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Change<V> {
    /// Acquired or renewed.
    Held(Versioned<V>),
    /// Given up by its holder.
    Released {
        /// The key now free.
        key: String,
    },
    /// Not renewed within its TTL (the server's expiry marker).
    Lapsed {
        /// The key now free.
        key: String,
    },
}

/// What one renewal attempt of a kept lease came to.
#[derive(Debug)]
pub(crate) enum Attempt<V> {
    /// Stored, or an earlier attempt was found stored: the renewal counts
    /// from `from` (see [`Renewal::adopted`]).
    Held {
        /// The latest write.
        lease: Versioned<V>,
        /// The local instant the renewal counts from.
        from: Instant,
    },
    /// Not stored this time (not acknowledged within one period, or the bus
    /// failed): to be tried again soon.
    Retry,
    /// The TTL ran out since the last stored renewal, or the renewal was
    /// refused: the holder must stop.
    Lost {
        /// Why, for logs.
        reason: String,
    },
}

/// One bucket of TTL'd holdings (or those of its keys that start with a
/// prefix). Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct TtlLease<V: Leased> {
    kv: TypedKv<V>,
    /// Put before every [`Leased::key`] (empty: the keys are the bucket's
    /// one-token keys).
    prefix: &'static str,
}

impl<V: Leased> TtlLease<V> {
    /// Opens `bucket` (created by [`Bus::ensure_topology`]).
    pub(crate) async fn open(bus: &Bus, bucket: &str) -> Result<Self, BusError> {
        Ok(Self {
            kv: TypedKv::open(bus, bucket).await?,
            prefix: "",
        })
    }

    /// The holdings of `kv`'s bucket stored under `prefix` + key (e.g.
    /// `daemon.` + worker id), beside other values under other keys.
    pub(crate) fn prefixed<U: crate::codec::BusMessage>(
        kv: &TypedKv<U>,
        prefix: &'static str,
    ) -> Self {
        Self {
            kv: kv.nested_view(),
            prefix,
        }
    }

    /// The bucket key of a holding's key.
    fn stored(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The holding's key of a bucket key.
    fn unstored(&self, key: String) -> String {
        match key.strip_prefix(self.prefix) {
            Some(rest) if !self.prefix.is_empty() => rest.to_owned(),
            _ => key,
        }
    }

    /// The key pattern of this holding's keys.
    fn filter(&self) -> String {
        format!("{}*", self.prefix)
    }

    /// The underlying typed bucket.
    pub(crate) fn kv(&self) -> &TypedKv<V> {
        &self.kv
    }

    /// Takes the key of `value` if nobody holds it (a conditional create
    /// with `ttl`); refused with [`Leased::held`] naming the holder. The
    /// value gets a fencing epoch larger than every earlier one.
    pub(crate) async fn acquire(
        &self,
        mut value: V,
        ttl: Duration,
    ) -> Result<Versioned<V>, V::Error> {
        value.set_epoch(self.next_epoch().await?);
        match self
            .kv
            .create_with_ttl(&self.stored(value.key()), &value, ttl)
            .await
        {
            Ok(revision) => Ok(Versioned { value, revision }),
            Err(BusError::AlreadyExists { .. } | BusError::CasConflict { .. }) => {
                // A lost race; the read names the winner.
                let current = self.kv.get(&self.stored(value.key())).await?;
                Err(V::held(
                    value.key(),
                    value.holder(),
                    current.map(|c| c.value),
                ))
            }
            Err(other) => Err(other.into()),
        }
    }

    /// Takes the key of `value` for its holder: acquires it when free, or
    /// replaces a live value of the same holder with a new epoch (a
    /// restarted holder reclaiming its own key without waiting for the
    /// lapse). [`Leased::held`] when another holder has it.
    pub(crate) async fn take(&self, mut value: V, ttl: Duration) -> Result<Versioned<V>, V::Error> {
        match self.kv.get(&self.stored(value.key())).await? {
            None => self.acquire(value, ttl).await,
            Some(current) if current.value.holder() == value.holder() => {
                value.set_epoch(self.next_epoch().await?);
                match self
                    .kv
                    .update_with_ttl(&self.stored(value.key()), &value, current.revision, ttl)
                    .await
                {
                    Ok(revision) => Ok(Versioned { value, revision }),
                    Err(BusError::CasConflict { .. }) => {
                        Err(V::lost(self, &current, Write::Retake).await)
                    }
                    Err(other) => Err(other.into()),
                }
            }
            Some(current) => Err(V::held(value.key(), value.holder(), Some(current.value))),
        }
    }

    /// Extends the holding by its TTL; [`Leased::lost`] when the key lapsed
    /// or changed hands since `held` was written.
    pub(crate) async fn renew(&self, held: &Versioned<V>) -> Result<Versioned<V>, V::Error> {
        self.renew_as(held, held.value.clone()).await
    }

    /// Renews `held` by writing `value` (the holder's own changes to it),
    /// stamped as renewed now, with the TTL `value` declares.
    pub(crate) async fn renew_as(
        &self,
        held: &Versioned<V>,
        mut value: V,
    ) -> Result<Versioned<V>, V::Error> {
        value.renewed(SystemTime::now());
        match self
            .kv
            .update_with_ttl(
                &self.stored(held.value.key()),
                &value,
                held.revision,
                value.ttl(),
            )
            .await
        {
            Ok(revision) => Ok(Versioned { value, revision }),
            Err(BusError::CasConflict { .. }) => Err(V::lost(self, held, Write::Renewal).await),
            Err(other) => Err(other.into()),
        }
    }

    /// Gives the key up (watchers see a release, not a lapse);
    /// [`Leased::lost`] when it had already lapsed or changed hands.
    pub(crate) async fn release(&self, held: &Versioned<V>) -> Result<(), V::Error> {
        match self
            .kv
            .delete(&self.stored(held.value.key()), Some(held.revision))
            .await
        {
            Ok(()) => Ok(()),
            Err(BusError::CasConflict { .. }) => Err(V::lost(self, held, Write::Release).await),
            Err(other) => Err(other.into()),
        }
    }

    /// The live value under `key`, if any.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Versioned<V>>, BusError> {
        self.kv.get(&self.stored(key)).await
    }

    /// All live values.
    pub(crate) async fn list(&self) -> Result<Vec<Versioned<V>>, BusError> {
        let listed = if self.prefix.is_empty() {
            self.kv.list().await?
        } else {
            self.kv.list_matching(&self.filter()).await?
        };
        Ok(listed.into_iter().map(|(_, v)| v).collect())
    }

    /// Changes from now on.
    pub(crate) async fn watch(
        &self,
    ) -> Result<impl Stream<Item = Result<Change<V>, BusError>> + Send + use<V>, BusError> {
        let watch = if self.prefix.is_empty() {
            self.kv.watch().await?
        } else {
            self.kv.watch_matching(&self.filter()).await?
        };
        let this = self.clone();
        Ok(watch.map(move |change| change.map(|c| this.change(c))))
    }

    /// Current values (as [`Change::Held`]) and then changes.
    pub(crate) async fn watch_with_current(
        &self,
    ) -> Result<impl Stream<Item = Result<Change<V>, BusError>> + Send + use<V>, BusError> {
        let watch = if self.prefix.is_empty() {
            self.kv.watch_with_current().await?
        } else {
            self.kv.watch_with_current_matching(&self.filter()).await?
        };
        let this = self.clone();
        Ok(watch.map(move |change| change.map(|c| this.change(c))))
    }

    fn change(&self, change: KvChange<V>) -> Change<V> {
        match change {
            KvChange::Put { value, .. } => Change::Held(value),
            KvChange::Deleted { key, .. } => Change::Released {
                key: self.unstored(key),
            },
            KvChange::Expired { key, .. } => Change::Lapsed {
                key: self.unstored(key),
            },
        }
    }

    /// A number larger than every revision written to the bucket so far.
    async fn next_epoch(&self) -> Result<u64, BusError> {
        Ok(self.kv.last_sequence().await? + 1)
    }

    /// One renewal attempt of `current`, timed by `renewal`: a loss once
    /// the TTL ran out since the last stored renewal; otherwise a renewal
    /// waited on for one period at most. A refused renewal may be one of
    /// ours whose acknowledgement was lost (the key then holds our own
    /// write, which is adopted); any other failure is retried.
    pub(crate) async fn attempt(
        &self,
        current: &Versioned<V>,
        renewal: &mut Renewal,
    ) -> Attempt<V> {
        let key = current.value.key();
        let attempt_at = Instant::now();
        if renewal.expired(attempt_at) {
            let reason = format!(
                "not renewed within its TTL of {} s (last renewal {:.1} s ago)",
                current.value.ttl().as_secs(),
                renewal.since_renewal(attempt_at).as_secs_f64()
            );
            tracing::warn!(key, %reason, "{} lost", V::KIND);
            return Attempt::Lost { reason };
        }
        // A renewal stuck on a dead connection or a stream without a leader
        // is abandoned after one period and sent again.
        let wait = renewal.begin(attempt_at);
        let Ok(result) = tokio::time::timeout(wait, self.renew(current)).await else {
            tracing::warn!(
                key,
                waited_ms = wait.as_millis(),
                "{} renewal not acknowledged; sending it again",
                V::KIND
            );
            return Attempt::Retry;
        };
        match result {
            Ok(lease) => {
                renewal.stored(attempt_at);
                Attempt::Held {
                    lease,
                    from: attempt_at,
                }
            }
            Err(error) if V::is_lost(&error) => {
                if let Ok(Some(stored)) = self.get(key).await
                    && current.value.is_own_write(&stored.value)
                {
                    tracing::info!(key, "{} renewal had landed; continuing from it", V::KIND);
                    let from = renewal.adopted(attempt_at);
                    return Attempt::Held {
                        lease: stored,
                        from,
                    };
                }
                tracing::warn!(key, %error, "{} lost", V::KIND);
                Attempt::Lost {
                    reason: error.to_string(),
                }
            }
            Err(error) => {
                tracing::warn!(key, %error, "{} renewal failed; retrying", V::KIND);
                Attempt::Retry
            }
        }
    }

    /// Renews `held` every `renew_every`, each renewal counted valid for
    /// `valid_for` (the TTL, less a keeper's margin), until `stop` fires,
    /// the holding is lost, or `wanted` says it no longer is (checked
    /// before each attempt). `renewed` sees each stored renewal and the
    /// instant it counts from. Returns why the holding was lost; `None`
    /// when it was stopped.
    pub(crate) async fn keep(
        &self,
        held: Versioned<V>,
        renew_every: Duration,
        valid_for: Duration,
        mut stop: tokio::sync::oneshot::Receiver<()>,
        wanted: impl Fn() -> bool,
        mut renewed: impl FnMut(Versioned<V>, Instant),
    ) -> Option<String> {
        let mut current = held;
        let mut renewal = Renewal::new(Instant::now(), renew_every, valid_for);
        loop {
            tokio::select! {
                _ = &mut stop => return None,
                _ = tokio::time::sleep(renewal.next_delay()) => {}
            }
            if !wanted() {
                return None;
            }
            match self.attempt(&current, &mut renewal).await {
                Attempt::Held { lease, from } => {
                    current = lease.clone();
                    renewed(lease, from);
                }
                Attempt::Retry => {}
                Attempt::Lost { reason } => return Some(reason),
            }
        }
    }
}
