//! The JetStream streams and KV buckets mtswarm needs, created idempotently
//! at start by every process (create-or-update: the same call on a running
//! system changes nothing). Names come from [`crate::subjects`].
//!
//! A stream or bucket can also vanish while the system runs (an operator's
//! mistake, a hostile client with too wide permissions). The bus remembers
//! the topology it created and re-creates it when an operation finds a
//! stream missing ([`Bus::recover_topology`]), so a job waits out the gap
//! instead of hanging for good.

use std::time::Instant;

use async_nats::jetstream::{self, kv, stream};

use crate::config::TopologyConfig;
use crate::connection::Bus;
use crate::error::BusError;
use crate::subjects;

/// What [`Bus::ensure_topology`] found about the server's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopologyInfo {
    /// True when lease/worker buckets use per-key TTLs; false when they fall
    /// back to a bucket-wide max age.
    pub per_key_ttl: bool,
}

/// Most replicas JetStream keeps of a stream.
const MAX_REPLICAS: usize = 5;

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
    /// The error for a stream or bucket of `config` the server would not
    /// create: a clear one when it is short of replicas or of storage.
    /// Public so that a daemon creating a stream of its own (the leader's
    /// job journal) explains a refusal the same way.
    pub fn creation_error(
        &self,
        what: String,
        config: &TopologyConfig,
        source: impl Into<crate::error::NatsSource>,
    ) -> BusError {
        let source = source.into();
        let (servers, _) = self.jetstream_servers();
        let text = source.to_string();
        if text.contains("insufficient storage") || text.contains("10047") {
            return BusError::StoreFull {
                what,
                reserved: config.reserved_bytes(),
                events: config.event_max_bytes,
                measurements: config.measurements_max_bytes,
                refusal: text,
            };
        }
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
