//! A typed view of one JetStream KV bucket: values are protobuf messages,
//! every read returns the revision, and conditional writes (create, update at
//! a revision) report conflicts as [`BusError::CasConflict`] /
//! [`BusError::AlreadyExists`] so callers can re-read and retry. Buckets with
//! per-key TTLs (leases, worker membership) also get TTL writes.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::message::PublishMessage;
use futures::{Stream, StreamExt as _, TryStreamExt as _};

use crate::codec::{self, BusMessage};
use crate::connection::Bus;
use crate::error::BusError;
use crate::subjects;

/// Reads [`TypedKv::list`] keeps in flight: enough to hide the round trip
/// of each, few enough not to crowd out other requests on the connection.
pub(crate) const LIST_READS_IN_FLIGHT: usize = 64;

/// A value with the KV revision it was read or written at (the CAS token).
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The decoded value.
    pub value: T,
    /// KV revision (the bucket stream's sequence) of this write; pass it to
    /// an update to write only if nothing changed since.
    pub revision: u64,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq)]
pub enum KvChange<T> {
    /// A value was written.
    Put {
        /// Key written.
        key: String,
        /// The new value and its revision.
        value: Versioned<T>,
    },
    /// The key was deleted by a client.
    Deleted {
        /// Key deleted.
        key: String,
        /// Revision of the delete marker.
        revision: u64,
    },
    /// The key was purged or its TTL lapsed (server-placed marker).
    Expired {
        /// Key that expired.
        key: String,
        /// Revision of the marker.
        revision: u64,
    },
}

impl<T> KvChange<T> {
    /// Key the change is about.
    pub fn key(&self) -> &str {
        match self {
            KvChange::Put { key, .. }
            | KvChange::Deleted { key, .. }
            | KvChange::Expired { key, .. } => key,
        }
    }
}

/// Boxed stream of typed KV changes.
pub type KvWatch<T> = Pin<Box<dyn Stream<Item = Result<KvChange<T>, BusError>> + Send>>;

/// Typed access to one bucket. Cheap to clone.
#[derive(Debug)]
pub struct TypedKv<T> {
    /// Shared: async-nats's store carries the stream's whole info, and a
    /// clone per owner write was a measurable share of the leader's CPU.
    store: Arc<kv::Store>,
    bucket: Arc<str>,
    per_key_ttl: bool,
    /// Keys are dot-separated ids (`<job>.agent.<agent>`) rather than one id.
    nested: bool,
    bus: Arc<Bus>,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for TypedKv<T> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            bucket: self.bucket.clone(),
            per_key_ttl: self.per_key_ttl,
            nested: self.nested,
            bus: self.bus.clone(),
            _value: PhantomData,
        }
    }
}

fn kv_error(
    op: &'static str,
    bucket: &str,
    key: &str,
    source: impl Into<crate::error::NatsSource>,
) -> BusError {
    BusError::Kv {
        op,
        bucket: bucket.to_string(),
        key: key.to_string(),
        source: source.into(),
    }
}

impl<T: BusMessage> TypedKv<T> {
    /// Opens an existing bucket (created by [`Bus::ensure_topology`]).
    pub async fn open(bus: &Bus, bucket: &str) -> Result<Self, BusError> {
        let store = bus
            .jetstream()
            .get_key_value(bucket)
            .await
            .map_err(|e| kv_error("open", bucket, "", e))?;
        let per_key_ttl = store.stream.cached_info().config.allow_message_ttl;
        Ok(Self {
            store: Arc::new(store),
            bucket: Arc::from(bucket),
            per_key_ttl,
            nested: false,
            bus: Arc::new(bus.clone()),
            _value: PhantomData,
        })
    }

    /// A view of the same bucket holding values of type `U` under nested
    /// keys: dot-separated ids such as `<job>.agent.<agent>`, each token
    /// following the id rules (one bucket can keep a record's parts next to
    /// it). Listings and watches of a view cover only the keys its filter
    /// names ([`TypedKv::list_matching`], [`TypedKv::watch_matching`]).
    pub fn nested_view<U: BusMessage>(&self) -> TypedKv<U> {
        TypedKv {
            store: self.store.clone(),
            bucket: self.bucket.clone(),
            per_key_ttl: self.per_key_ttl,
            nested: true,
            bus: self.bus.clone(),
            _value: PhantomData,
        }
    }

    /// Name of the bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// True when keys can carry their own TTL (server ≥ 2.11 and a bucket
    /// created with limit markers).
    pub fn per_key_ttl(&self) -> bool {
        self.per_key_ttl
    }

    /// A conditional write `op` of `key` that failed: a conflict when the
    /// key had moved past `expected_revision`.
    fn update_error(
        &self,
        op: &'static str,
        key: &str,
        expected_revision: u64,
        error: kv::UpdateError,
    ) -> BusError {
        match error.kind() {
            kv::UpdateErrorKind::WrongLastRevision => BusError::CasConflict {
                bucket: self.bucket.to_string(),
                key: key.to_string(),
                expected_revision,
            },
            _ => kv_error(op, &self.bucket, key, error),
        }
    }

    fn check_key(&self, key: &str) -> Result<(), BusError> {
        if !self.nested {
            return subjects::validate_id("KV key", key);
        }
        key.split('.')
            .try_for_each(|token| subjects::validate_id("KV key", token))
            .map_err(|error| match error {
                BusError::InvalidId { kind, reason, .. } => BusError::InvalidId {
                    kind,
                    value: key.chars().take(4 * subjects::MAX_ID_LEN).collect(),
                    reason,
                },
                other => other,
            })
    }

    fn subject(&self, key: &str) -> String {
        format!("$KV.{}.{}", self.bucket, key)
    }

    /// `value` encoded, refused with [`BusError::RecordTooLarge`] when it
    /// is over the record limit ([`Bus::max_record_bytes`]).
    fn encode_checked(&self, key: &str, value: &T) -> Result<bytes::Bytes, BusError> {
        let payload = codec::encode(value);
        self.bus.check_record_size(
            || format!("{} record {}/{key}", T::TYPE_NAME, self.bucket),
            payload.len(),
            crate::limits::KV_HEADER_ALLOWANCE,
        )?;
        Ok(payload)
    }

    fn decode(&self, key: &str, payload: &[u8]) -> Result<T, BusError> {
        codec::decode::<T>(&self.subject(key), None, payload)
    }

    /// Runs `op`; when it fails because the bucket's stream is gone, the
    /// topology is re-created ([`Bus::recover_topology`]) and `op` runs once
    /// more.
    async fn with_recovery<R, Fut>(&self, key: &str, op: impl Fn() -> Fut) -> Result<R, BusError>
    where
        Fut: std::future::Future<Output = Result<R, BusError>>,
    {
        match op().await {
            Err(BusError::Kv { source, .. })
                if crate::error::is_missing_stream(source.as_ref())
                    && self
                        .bus
                        .recover_topology(&format!("KV {}/{key}", self.bucket))
                        .await? =>
            {
                op().await
            }
            other => other,
        }
    }

    /// Latest value of `key`, or `None` when absent, deleted or expired.
    pub async fn get(&self, key: &str) -> Result<Option<Versioned<T>>, BusError> {
        self.check_key(key)?;
        let entry = self
            .with_recovery(key, || async {
                self.store
                    .entry(key)
                    .await
                    .map_err(|e| kv_error("get", &self.bucket, key, e))
            })
            .await?;
        match entry {
            Some(entry) if entry.operation == Operation::Put => Ok(Some(Versioned {
                value: self.decode(key, &entry.value)?,
                revision: entry.revision,
            })),
            _ => Ok(None),
        }
    }

    /// One write of `value` to `key`: the key and the encoded value are
    /// checked, then `op` stores the payload (again after a recovered
    /// topology); the new revision.
    async fn write<Fut>(
        &self,
        key: &str,
        value: &T,
        op: impl Fn(bytes::Bytes) -> Fut,
    ) -> Result<u64, BusError>
    where
        Fut: std::future::Future<Output = Result<u64, BusError>>,
    {
        self.check_key(key)?;
        let payload = self.encode_checked(key, value)?;
        self.with_recovery(key, || op(payload.clone())).await
    }

    /// Writes `value` unconditionally; returns the new revision.
    pub async fn put(&self, key: &str, value: &T) -> Result<u64, BusError> {
        self.write(key, value, |payload| async move {
            let put = self.store.put(key, payload).await;
            put.map_err(|e| kv_error("put", &self.bucket, key, e))
        })
        .await
    }

    /// Writes `value` only if `key` has no live value.
    pub async fn create(&self, key: &str, value: &T) -> Result<u64, BusError> {
        self.write(key, value, |payload| async move {
            let created = self.store.create(key, payload).await;
            created.map_err(|e| match e.kind() {
                kv::CreateErrorKind::AlreadyExists => BusError::AlreadyExists {
                    bucket: self.bucket.to_string(),
                    key: key.to_string(),
                },
                _ => kv_error("create", &self.bucket, key, e),
            })
        })
        .await
    }

    /// Writes `value` only if the key's latest revision is `expected_revision`.
    pub async fn update(
        &self,
        key: &str,
        value: &T,
        expected_revision: u64,
    ) -> Result<u64, BusError> {
        self.write(key, value, |payload| async move {
            let updated = self.store.update(key, payload, expected_revision).await;
            updated.map_err(|e| self.update_error("update", key, expected_revision, e))
        })
        .await
    }

    /// Deletes `key` (a delete marker; watchers see [`KvChange::Deleted`]).
    /// With `expected_revision`, only if the key is still at that revision.
    pub async fn delete(&self, key: &str, expected_revision: Option<u64>) -> Result<(), BusError> {
        self.check_key(key)?;
        self.store
            .delete_expect_revision(key, expected_revision)
            .await
            .map_err(|e| self.update_error("delete", key, expected_revision.unwrap_or(0), e))
    }

    /// Deletes every key matching `filter` (a key pattern, as in
    /// [`TypedKv::list_matching`]) that has a message in the bucket, without
    /// reading the values; how many keys were deleted.
    pub async fn delete_matching(&self, filter: &str) -> Result<usize, BusError> {
        let keys = self.stored_keys(filter).await?;
        for key in &keys {
            self.delete(key, None).await?;
        }
        Ok(keys.len())
    }

    /// Keys with a live value, each once, sorted.
    pub async fn keys(&self) -> Result<Vec<String>, BusError> {
        Ok(self.list().await?.into_iter().map(|(key, _)| key).collect())
    }

    /// The key filter of listings and watches of the whole view: one token
    /// (`*`) for a plain view, so the nested keys kept next to its values
    /// in the same bucket are neither read nor decoded as its type.
    fn all_keys(&self) -> &'static str {
        if self.nested { ">" } else { "*" }
    }

    /// Every key matching `filter` (a key pattern: `*` one token, `>` the
    /// rest) that has a message in the bucket's stream (live, deleted or
    /// expired), each once, sorted. Read from the stream's per-subject
    /// message counts: one snapshot taken by the server, so a key updated
    /// while the listing runs is neither missed nor repeated (a consumer
    /// over the last value per key can end early when a not yet delivered
    /// key is rewritten meanwhile).
    async fn stored_keys(&self, filter: &str) -> Result<Vec<String>, BusError> {
        let prefix = format!("$KV.{}.", self.bucket);
        let subjects: Vec<(String, usize)> = self
            .with_recovery(filter, || async {
                self.store
                    .stream
                    .info_with_subjects(format!("{prefix}{filter}"))
                    .await
                    .map_err(|e| kv_error("keys", &self.bucket, filter, e))?
                    .try_collect()
                    .await
                    .map_err(|e| kv_error("keys", &self.bucket, filter, e))
            })
            .await?;
        let keys: std::collections::BTreeSet<String> = subjects
            .into_iter()
            .filter_map(|(subject, _)| subject.strip_prefix(&prefix).map(str::to_string))
            // Keys this crate could not have written are not ours to list.
            .filter(|key| self.check_key(key).is_ok())
            .collect();
        Ok(keys.into_iter().collect())
    }

    /// Every live value with its key, sorted by key. One read per key, up
    /// to [`LIST_READS_IN_FLIGHT`] at once (a fleet of a thousand slices is
    /// listed in a few dozen round trips, not a thousand): for buckets
    /// read often prefer [`TypedKv::watch_with_current`] and keep a cache.
    ///
    /// A value that does not decode as `T` is skipped with a warning naming
    /// its key: one bad record (written by a buggy or hostile client) must
    /// not hide every good one, nor stop a process that lists at start-up.
    pub async fn list(&self) -> Result<Vec<(String, Versioned<T>)>, BusError> {
        self.list_matching(self.all_keys()).await
    }

    /// [`TypedKv::list`] of the keys matching `filter` (e.g. `job1.agent.*`):
    /// the server picks the keys, so values under other keys are not read.
    pub async fn list_matching(
        &self,
        filter: &str,
    ) -> Result<Vec<(String, Versioned<T>)>, BusError> {
        let keys = self.stored_keys(filter).await?;
        // `buffered` keeps the keys' order while the reads overlap.
        let mut reads = futures::stream::iter(keys)
            .map(|key| async move {
                let read = self.get(&key).await;
                (key, read)
            })
            .buffered(LIST_READS_IN_FLIGHT);
        let mut values = Vec::new();
        while let Some((key, read)) = reads.next().await {
            // Deleted and expired keys read as absent.
            match read {
                Ok(Some(value)) => values.push((key, value)),
                Ok(None) => {}
                Err(error) if error.is_undecodable() => self.warn_undecodable(&key, &error),
                Err(error) => return Err(error),
            }
        }
        Ok(values)
    }

    fn warn_undecodable(&self, key: &str, error: &BusError) {
        tracing::warn!(
            bucket = %self.bucket,
            key,
            %error,
            "skipping a KV value that is not a valid {}",
            T::TYPE_NAME
        );
    }

    /// Changes from now on.
    pub async fn watch(&self) -> Result<KvWatch<T>, BusError> {
        self.watch_matching(self.all_keys()).await
    }

    /// Changes from now on of the keys matching `filter` (e.g. `*.loop`).
    pub async fn watch_matching(&self, filter: &str) -> Result<KvWatch<T>, BusError> {
        let watch = self.store.watch(filter).await;
        self.typed_watch(filter, watch)
    }

    /// The current value of every key first (as `Put`), then changes.
    pub async fn watch_with_current(&self) -> Result<KvWatch<T>, BusError> {
        self.watch_with_current_matching(self.all_keys()).await
    }

    /// [`TypedKv::watch_with_current`] of the keys matching `filter`.
    pub async fn watch_with_current_matching(&self, filter: &str) -> Result<KvWatch<T>, BusError> {
        let watch = self.store.watch_with_history(filter).await;
        self.typed_watch(filter, watch)
    }

    /// Typed changes of `watch`, the watch of `filter` (or why it could
    /// not start). A value that does not decode is skipped with a warning
    /// (as in [`TypedKv::list`]): yielding it as an error would make every
    /// watcher re-create its watch, meet the same value again and never get
    /// past it.
    fn typed_watch(
        &self,
        filter: &str,
        watch: Result<kv::Watch, kv::WatchError>,
    ) -> Result<KvWatch<T>, BusError> {
        let watch = watch.map_err(|e| kv_error("watch", &self.bucket, filter, e))?;
        let this = self.clone();
        Ok(Box::pin(watch.filter_map(move |entry| {
            let change = this.typed_change(entry);
            async move { change }
        })))
    }

    fn typed_change(
        &self,
        entry: Result<kv::Entry, kv::WatcherError>,
    ) -> Option<Result<KvChange<T>, BusError>> {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => return Some(Err(kv_error("watch", &self.bucket, ">", e))),
        };
        Some(Ok(match entry.operation {
            Operation::Put => match self.decode(&entry.key, &entry.value) {
                Ok(value) => KvChange::Put {
                    value: Versioned {
                        value,
                        revision: entry.revision,
                    },
                    key: entry.key,
                },
                Err(error) => {
                    self.warn_undecodable(&entry.key, &error);
                    return None;
                }
            },
            Operation::Delete => KvChange::Deleted {
                key: entry.key,
                revision: entry.revision,
            },
            Operation::Purge => KvChange::Expired {
                key: entry.key,
                revision: entry.revision,
            },
        }))
    }

    /// Creates `key` with a TTL; fails with [`BusError::AlreadyExists`] when
    /// it has a live value. A deleted or lapsed key can be created again.
    pub async fn create_with_ttl(
        &self,
        key: &str,
        value: &T,
        ttl: Duration,
    ) -> Result<u64, BusError> {
        match self.update_with_ttl(key, value, 0, ttl).await {
            Err(BusError::CasConflict { .. }) => {}
            other => return other,
        }
        // The key has history: allowed only if its last entry is a delete or
        // expiry marker.
        let entry = self
            .store
            .entry(key)
            .await
            .map_err(|e| kv_error("create", &self.bucket, key, e))?;
        match entry {
            Some(entry) if entry.operation != Operation::Put => {
                self.update_with_ttl(key, value, entry.revision, ttl).await
            }
            Some(_) => Err(BusError::AlreadyExists {
                bucket: self.bucket.to_string(),
                key: key.to_string(),
            }),
            // The marker itself expired in between: try as a fresh key once more.
            None => self.update_with_ttl(key, value, 0, ttl).await,
        }
    }

    /// Replaces `key`'s value at `expected_revision` (0: the key must have
    /// no message at all) and restarts its TTL. Without per-key TTL
    /// support the TTL is left to the bucket's max age.
    pub async fn update_with_ttl(
        &self,
        key: &str,
        value: &T,
        expected_revision: u64,
        ttl: Duration,
    ) -> Result<u64, BusError> {
        self.check_key(key)?;
        check_ttl(ttl)?;
        let mut publish = PublishMessage::build()
            .payload(self.encode_checked(key, value)?)
            .expected_last_subject_sequence(expected_revision);
        if self.per_key_ttl {
            publish = publish.ttl(ttl);
        }
        let ack = self
            .bus
            .jetstream()
            .send_publish(self.subject(key), publish)
            .await
            .map_err(|e| kv_error("write", &self.bucket, key, e))?
            .await;
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                Err(BusError::CasConflict {
                    bucket: self.bucket.to_string(),
                    key: key.to_string(),
                    expected_revision,
                })
            }
            Err(e) => Err(kv_error("write", &self.bucket, key, e)),
        }
    }
}

/// Per-key TTLs have whole-second granularity and must be at least 1 s.
fn check_ttl(ttl: Duration) -> Result<(), BusError> {
    if ttl < Duration::from_secs(1) {
        return Err(BusError::InvalidConfig(format!(
            "TTL {ttl:?} is below the 1 s minimum of per-key TTLs"
        )));
    }
    Ok(())
}

impl<T: BusMessage> TypedKv<T> {
    /// Last sequence of the bucket's stream (every write raises it).
    pub(crate) async fn last_sequence(&self) -> Result<u64, BusError> {
        let info = self
            .store
            .stream
            .get_info()
            .await
            .map_err(|e| kv_error("info", &self.bucket, "", e))?;
        Ok(info.state.last_sequence)
    }
}
