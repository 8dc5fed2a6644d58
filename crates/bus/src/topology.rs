//! The JetStream streams and KV buckets mtswarm needs, created idempotently
//! at start by every process (create-or-update: the same call on a running
//! system changes nothing). Names come from [`crate::subjects`].
//!
//! A stream or bucket can also vanish while the system runs (an operator's
//! mistake, a hostile client with too wide permissions). The bus remembers
//! the topology it created and re-creates it when an operation finds a
//! stream missing ([`Bus::recover_topology`]), so a job waits out the gap
//! instead of hanging for good.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};

use crate::subjects;
use crate::{Bus, BusError};

/// Sizes, ages and TTLs of the streams and buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct TopologyConfig {
    /// Replicas of every stream and bucket (1 for a single server, 3 in a cluster).
    pub replicas: usize,
    /// Window in which a re-publish with the same `Nats-Msg-Id` is dropped
    /// (tasks and results).
    pub duplicate_window: Duration,
    /// How long unconsumed tasks and results are kept.
    pub task_max_age: Duration,
    /// How long results are kept in the measurements stream.
    pub result_max_age: Duration,
    /// Replay window and size limit of the events stream (oldest dropped first).
    pub event_max_age: Duration,
    /// Size limit of the events stream, bytes.
    pub event_max_bytes: i64,
    /// Lifetime of the delete marker a lapsed lease or worker record leaves,
    /// so watchers see the lapse (server ≥ 2.11 per-key TTL).
    pub lease_marker_ttl: Duration,
    /// Bucket-wide max age for leases and worker records, used only when the
    /// server lacks per-key TTLs (then this is the effective lease TTL).
    pub fallback_lease_ttl: Duration,
    /// History kept per key in the jobs and approvals buckets.
    pub record_history: i64,
    /// File storage (survives server restarts) or memory (tests, benchmarks).
    pub storage: stream::StorageType,
    /// Size limit of the measurements stream, bytes (the oldest records go
    /// first). JetStream reserves it on every replica's disk up front.
    pub measurements_max_bytes: i64,
    /// Largest single record the measurements stream accepts, bytes.
    pub measurement_max_record_bytes: i32,
    /// Largest record this client stores in any stream or bucket, bytes
    /// (`None`: the server's `max_payload` alone). The effective limit is
    /// the smaller of this and the connected server's `max_payload`.
    pub max_record_bytes: Option<usize>,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        Self {
            replicas: 1,
            duplicate_window: Duration::from_secs(10 * 60),
            task_max_age: Duration::from_secs(7 * 24 * 3600),
            result_max_age: Duration::from_secs(7 * 24 * 3600),
            event_max_age: Duration::from_secs(24 * 3600),
            event_max_bytes: 1 << 30,
            lease_marker_ttl: Duration::from_secs(60),
            fallback_lease_ttl: Duration::from_secs(15),
            record_history: 5,
            storage: stream::StorageType::File,
            measurements_max_bytes: MEASUREMENTS_MAX_BYTES,
            measurement_max_record_bytes: MEASUREMENT_MAX_RECORD_BYTES,
            max_record_bytes: None,
        }
    }
}

impl TopologyConfig {
    /// The default shape with small size limits, for tests and benchmarks:
    /// JetStream reserves a stream's `max_bytes` on disk when it creates
    /// it, so the production limits (GiBs) fail with "insufficient storage"
    /// (error 10047) on a machine with little free disk.
    pub fn for_tests() -> Self {
        Self {
            event_max_bytes: 64 << 20,
            measurements_max_bytes: 64 << 20,
            ..Self::default()
        }
    }
}

/// What [`Bus::ensure_topology`] found about the server's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopologyInfo {
    /// True when lease/worker buckets use per-key TTLs; false when they fall
    /// back to a bucket-wide max age.
    pub per_key_ttl: bool,
}

/// Most replicas JetStream keeps of a stream.
const MAX_REPLICAS: usize = 5;

/// The topology a [`Bus`] created, and when its last re-creation started.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    config: std::sync::Mutex<Option<TopologyConfig>>,
    /// The shape this client works with (record limits, the measurements
    /// stream): the one ensured or adopted last.
    in_use: std::sync::Mutex<Option<TopologyConfig>>,
    last_recovery: tokio::sync::Mutex<Option<Instant>>,
}

impl Bus {
    /// Re-creates the topology last ensured through this connection after
    /// `what` found a stream or bucket missing, and returns whether the
    /// operation is worth retrying: false when this connection never ensured
    /// a topology. A loss noticed by many operations at once is repaired
    /// once: calls wait for a re-creation under way, and one that started
    /// after they noticed the loss is not repeated.
    pub async fn recover_topology(&self, what: &str) -> Result<bool, BusError> {
        let Some(config) = self
            .topology
            .config
            .lock()
            .map(|config| config.clone())
            .unwrap_or_default()
        else {
            return Ok(false);
        };
        let noticed_at = Instant::now();
        let mut last = self.topology.last_recovery.lock().await;
        // A re-creation that started after this loss was noticed covers it.
        if last.is_some_and(|started| started >= noticed_at) {
            return Ok(true);
        }
        *last = Some(Instant::now());
        tracing::warn!(%what, "a JetStream stream or bucket is missing; re-creating the topology");
        self.create_topology(&config).await?;
        Ok(true)
    }

    /// Creates or updates every stream and bucket. Safe to call from every
    /// process at every start, concurrently. The configuration is
    /// remembered for [`Bus::recover_topology`].
    pub async fn ensure_topology(&self, config: &TopologyConfig) -> Result<TopologyInfo, BusError> {
        let info = self.create_topology(config).await?;
        if let Ok(mut remembered) = self.topology.config.lock() {
            *remembered = Some(config.clone());
        }
        self.adopt_topology(config);
        Ok(info)
    }

    /// Works with `config`'s limits (largest record, the measurements
    /// stream's shape) without creating anything: for an identity that may
    /// not create streams, whose topology another process ensures.
    pub fn adopt_topology(&self, config: &TopologyConfig) {
        if let Ok(mut in_use) = self.topology.in_use.lock() {
            *in_use = Some(config.clone());
        }
    }

    /// The topology ensured or adopted last through this connection, else
    /// the default one.
    pub fn topology_in_use(&self) -> TopologyConfig {
        self.topology
            .in_use
            .lock()
            .ok()
            .and_then(|in_use| in_use.clone())
            .unwrap_or_default()
    }

    /// JetStream servers the connected server knows of: itself alone when
    /// it is not clustered, else every server of its cluster that
    /// advertises a client URL.
    fn jetstream_servers(&self) -> (usize, bool) {
        let info = self.client().server_info();
        match info.cluster {
            None => (1, false),
            Some(_) => (info.connect_urls.len().max(1), true),
        }
    }

    /// Refuses `config` when it asks for no replicas, or for more than one
    /// from a server that is not clustered (before anything is changed).
    fn check_replicas(&self, config: &TopologyConfig) -> Result<(), BusError> {
        if config.replicas == 0 || config.replicas > MAX_REPLICAS {
            return Err(BusError::InvalidConfig(format!(
                "{} replicas asked for the streams and buckets; JetStream keeps 1 to {MAX_REPLICAS}",
                config.replicas
            )));
        }
        let (servers, clustered) = self.jetstream_servers();
        if !clustered && config.replicas > 1 {
            return Err(BusError::Replicas {
                what: format!("stream {}", subjects::TASKS_STREAM),
                replicas: config.replicas,
                servers,
                refusal: "the server is not part of a cluster".into(),
            });
        }
        Ok(())
    }

    /// The error of creating `what` as `config` says: a refusal to place
    /// its replicas becomes [`BusError::Replicas`].
    fn creation_error(
        &self,
        what: String,
        config: &TopologyConfig,
        source: impl Into<crate::error::NatsSource>,
    ) -> BusError {
        let source = source.into();
        let (servers, _) = self.jetstream_servers();
        let text = source.to_string();
        let about_replicas = text.contains("replica")
            || text.contains("insufficient resources")
            || text.contains("no suitable peers");
        if config.replicas > 1 && (config.replicas > servers || about_replicas) {
            return BusError::Replicas {
                what,
                replicas: config.replicas,
                servers,
                refusal: format!("the server said: {text}"),
            };
        }
        BusError::Topology { what, source }
    }

    async fn create_topology(&self, config: &TopologyConfig) -> Result<TopologyInfo, BusError> {
        self.check_replicas(config)?;
        let js = self.jetstream();
        let streams = [
            stream::Config {
                retention: stream::RetentionPolicy::WorkQueue,
                duplicate_window: config.duplicate_window,
                max_age: config.task_max_age,
                discard: stream::DiscardPolicy::New,
                ..stored_stream(
                    config,
                    subjects::TASKS_STREAM,
                    "mtswarm task assignments (work queue)",
                    subjects::ALL_TASKS,
                )
            },
            stream::Config {
                retention: stream::RetentionPolicy::Limits,
                duplicate_window: config.duplicate_window,
                max_age: config.result_max_age,
                discard: stream::DiscardPolicy::New,
                ..stored_stream(
                    config,
                    subjects::RESULTS_STREAM,
                    "mtswarm task results",
                    subjects::ALL_RESULTS,
                )
            },
            stream::Config {
                retention: stream::RetentionPolicy::Limits,
                max_age: config.event_max_age,
                max_bytes: config.event_max_bytes,
                discard: stream::DiscardPolicy::Old,
                ..stored_stream(
                    config,
                    subjects::EVENTS_STREAM,
                    "mtswarm agent events (replay window)",
                    subjects::ALL_EVENTS,
                )
            },
            measurements_stream_config(config),
        ];
        for stream_config in streams {
            let name = stream_config.name.clone();
            js.create_or_update_stream(stream_config)
                .await
                .map_err(|e| self.creation_error(format!("stream {name}"), config, e))?;
        }

        let per_key_ttl = self
            .ensure_ttl_bucket(subjects::LEASES_BUCKET, "slice leases", config)
            .await?;
        self.ensure_ttl_bucket(subjects::WORKERS_BUCKET, "worker membership", config)
            .await?;
        self.ensure_ttl_bucket(subjects::JOB_OWNERS_BUCKET, "job ownership leases", config)
            .await?;

        let plain_buckets = [
            (subjects::JOBS_BUCKET, "job records", config.record_history),
            (
                subjects::CHECKPOINTS_BUCKET,
                "latest session checkpoints",
                1,
            ),
            (
                subjects::APPROVALS_BUCKET,
                "approval records",
                config.record_history,
            ),
            (
                subjects::QUARANTINE_BUCKET,
                "quarantined slices",
                config.record_history,
            ),
        ];
        for (bucket, description, history) in plain_buckets {
            js.create_or_update_key_value(stored_bucket(config, bucket, description, history))
                .await
                .map_err(|e| self.creation_error(format!("KV bucket {bucket}"), config, e))?;
        }
        Ok(TopologyInfo { per_key_ttl })
    }

    /// A bucket whose keys expire unless refreshed. Returns whether per-key
    /// TTLs are in use.
    async fn ensure_ttl_bucket(
        &self,
        bucket: &str,
        description: &str,
        config: &TopologyConfig,
    ) -> Result<bool, BusError> {
        let js = self.jetstream();
        let with_markers = kv::Config {
            limit_markers: Some(config.lease_marker_ttl),
            ..stored_bucket(config, bucket, description, 1)
        };
        match js.create_or_update_key_value(with_markers).await {
            Ok(_) => Ok(true),
            Err(error)
                if error.kind()
                    == jetstream::context::CreateKeyValueErrorKind::LimitMarkersNotSupported =>
            {
                tracing::warn!(
                    bucket,
                    "server lacks per-key TTLs (needs nats-server >= 2.11); using bucket max age"
                );
                js.create_or_update_key_value(kv::Config {
                    max_age: config.fallback_lease_ttl,
                    ..stored_bucket(config, bucket, description, 1)
                })
                .await
                .map_err(|e| self.creation_error(format!("KV bucket {bucket}"), config, e))?;
                Ok(false)
            }
            Err(error) => Err(self.creation_error(format!("KV bucket {bucket}"), config, error)),
        }
    }
}

/// Default size cap of the measurements stream
/// ([`TopologyConfig::measurements_max_bytes`]); the oldest records go first.
pub const MEASUREMENTS_MAX_BYTES: i64 = 4 << 30;
/// Default largest single measurement record
/// ([`TopologyConfig::measurement_max_record_bytes`]; a record with 10,000
/// raw samples is ~250 KB).
pub const MEASUREMENT_MAX_RECORD_BYTES: i32 = 1 << 20;

/// The measurements stream as [`Bus::ensure_topology`] creates it: limits
/// retention without an age limit (the history is what later jobs learn
/// from), capped in size with the oldest records dropped first, and
/// deduplicated by record id within the topology's duplicate window.
pub fn measurements_stream_config(config: &TopologyConfig) -> stream::Config {
    stream::Config {
        retention: stream::RetentionPolicy::Limits,
        duplicate_window: config.duplicate_window,
        max_bytes: config.measurements_max_bytes,
        max_message_size: config.measurement_max_record_bytes,
        discard: stream::DiscardPolicy::Old,
        ..stored_stream(
            config,
            subjects::MEASUREMENTS_STREAM,
            "mtswarm measured candidates (results store)",
            subjects::ALL_MEASUREMENTS,
        )
    }
}

/// The stream `name` over `subject`, stored and replicated as `config`
/// says; the caller sets its retention and limits.
fn stored_stream(
    config: &TopologyConfig,
    name: &str,
    description: &str,
    subject: &str,
) -> stream::Config {
    stream::Config {
        name: name.to_string(),
        description: Some(description.to_string()),
        subjects: vec![subject.to_string()],
        storage: config.storage,
        num_replicas: config.replicas,
        ..Default::default()
    }
}

/// The bucket `bucket` keeping `history` values per key, stored and
/// replicated as `config` says.
fn stored_bucket(
    config: &TopologyConfig,
    bucket: &str,
    description: &str,
    history: i64,
) -> kv::Config {
    kv::Config {
        bucket: bucket.to_string(),
        description: description.to_string(),
        history,
        storage: config.storage,
        num_replicas: config.replicas,
        ..Default::default()
    }
}
