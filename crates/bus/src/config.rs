//! Connection settings for NATS, shared by the leader, worker daemons and the
//! CLI. Security (nkeys/creds, TLS) is configurable on every client because
//! server permissions confine each identity to its subjects.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// TLS settings (rustls, aws-lc-rs provider).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// Refuse to connect without TLS.
    pub require_tls: bool,
    /// PEM file with the CA certificate(s) that signed the server certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that verify clients.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// How to reach and authenticate to NATS.
#[derive(Clone, PartialEq, Eq)]
pub struct BusConfig {
    /// Server URLs (`nats://host:4222`, `tls://host:4222`); at least one.
    pub servers: Vec<String>,
    /// Connection name shown by the server (`nats server report connections`).
    pub name: String,
    /// `.creds` file (JWT + nkey seed) for decentralized auth.
    pub credentials_file: Option<PathBuf>,
    /// Nkey seed (`SU...`) for nkey auth. Secret: never logged.
    pub nkey_seed: Option<String>,
    /// TLS settings: CA to trust, client certificate, whether TLS is required.
    pub tls: TlsConfig,
    /// Prefix of this client's reply subjects (default `_INBOX`). An
    /// identity confined to its own prefix (`_INBOX_<worker>`) cannot read
    /// the replies other clients get (KV reads, stream acks).
    pub inbox_prefix: Option<String>,
    /// Timeout of one TCP/TLS connection attempt.
    pub connect_timeout: Duration,
    /// Timeout of requests, JetStream API calls and publish acks.
    pub request_timeout: Duration,
    /// Keep retrying when the server is not up yet at start (instead of failing).
    pub retry_on_initial_connect: bool,
    /// First reconnect delay; doubles per failed attempt up to `reconnect_max_delay`.
    pub reconnect_base_delay: Duration,
    /// Upper bound of the reconnect delay.
    pub reconnect_max_delay: Duration,
    /// Unacknowledged JetStream publishes allowed in flight per connection
    /// (pipelined publishes wait for a slot beyond this).
    pub max_ack_inflight: usize,
}

impl BusConfig {
    /// Defaults for one server URL: reconnect forever with 100 ms .. 2 s backoff,
    /// retry on initial connect, 5 s connect and 10 s request timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            servers: vec![url.into()],
            name: "mtswarm".to_string(),
            credentials_file: None,
            nkey_seed: None,
            tls: TlsConfig::default(),
            inbox_prefix: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_on_initial_connect: true,
            reconnect_base_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_secs(2),
            max_ack_inflight: 16_384,
        }
    }

    /// Sets the connection name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Delay before reconnect attempt number `attempt` (0-based): exponential
    /// from `reconnect_base_delay`, capped at `reconnect_max_delay`.
    pub fn reconnect_delay(&self, attempt: usize) -> Duration {
        let factor = 1u32 << attempt.min(16);
        self.reconnect_base_delay
            .saturating_mul(factor)
            .min(self.reconnect_max_delay)
    }
}

impl fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BusConfig")
            .field("servers", &self.servers)
            .field("name", &self.name)
            .field("credentials_file", &self.credentials_file)
            .field("nkey_seed", &self.nkey_seed.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry_on_initial_connect", &self.retry_on_initial_connect)
            .field("reconnect_base_delay", &self.reconnect_base_delay)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("max_ack_inflight", &self.max_ack_inflight)
            .finish()
    }
}

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
    pub storage: async_nats::jetstream::stream::StorageType,
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
            storage: async_nats::jetstream::stream::StorageType::File,
            measurements_max_bytes: MEASUREMENTS_MAX_BYTES,
            measurement_max_record_bytes: MEASUREMENT_MAX_RECORD_BYTES,
            max_record_bytes: None,
        }
    }
}

impl TopologyConfig {
    /// The default shape with small size limits (64 MiB per stream), for a
    /// stack that lives for one job or one test: the demo, tests and
    /// benchmarks. JetStream reserves a stream's `max_bytes` on disk when
    /// it creates it, so the production limits (GiBs) fail with
    /// "insufficient storage" (error 10047) on a machine with little free
    /// disk.
    pub fn small() -> Self {
        Self {
            event_max_bytes: SMALL_STREAM_BYTES,
            measurements_max_bytes: SMALL_STREAM_BYTES,
            ..Self::default()
        }
    }

    /// Bytes of JetStream storage this topology reserves on each server
    /// that holds a replica: the events stream and the leader's job
    /// journal (`event_max_bytes` each) and the measurements stream. The
    /// other streams and buckets have no size limit and reserve nothing.
    pub fn reserved_bytes(&self) -> i64 {
        self.event_max_bytes
            .saturating_mul(2)
            .saturating_add(self.measurements_max_bytes)
    }

    /// This topology with its size limits scaled down, in proportion, so
    /// that its reservation takes at most half of what JetStream grants a
    /// store with `free_bytes` of free disk (three quarters of it: the
    /// server's rule when `max_file_store` is not set). The other half is
    /// left to the streams and buckets without a limit. No limit goes
    /// below [`MIN_STREAM_BYTES`]; limits that already fit are kept.
    pub fn fitted_to_store(self, free_bytes: u64) -> Self {
        let granted = free_bytes / 4 * 3;
        let budget = i64::try_from(granted / 2).unwrap_or(i64::MAX);
        let reserved = self.reserved_bytes();
        if reserved <= budget || reserved <= 0 {
            return self;
        }
        let scale = |limit: i64| -> i64 {
            let scaled = i128::from(limit) * i128::from(budget) / i128::from(reserved);
            i64::try_from(scaled)
                .unwrap_or(limit)
                .max(MIN_STREAM_BYTES)
                .min(limit)
        };
        Self {
            event_max_bytes: scale(self.event_max_bytes),
            measurements_max_bytes: scale(self.measurements_max_bytes),
            ..self
        }
    }
}

/// Size limit of each stream in [`TopologyConfig::small`].
pub const SMALL_STREAM_BYTES: i64 = 64 << 20;
/// Smallest size limit [`TopologyConfig::fitted_to_store`] gives a stream.
pub const MIN_STREAM_BYTES: i64 = 8 << 20;

/// Default size cap of the measurements stream
/// ([`TopologyConfig::measurements_max_bytes`]); the oldest records go first.
pub const MEASUREMENTS_MAX_BYTES: i64 = 4 << 30;
/// Default largest single measurement record
/// ([`TopologyConfig::measurement_max_record_bytes`]; a record with 10,000
/// raw samples is ~250 KB).
pub const MEASUREMENT_MAX_RECORD_BYTES: i32 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_that_fits_the_store_is_kept() {
        let topology = TopologyConfig::default();
        let plenty = 100 << 30;
        assert_eq!(topology.clone().fitted_to_store(plenty), topology);
    }

    #[test]
    fn a_topology_too_big_for_the_store_shrinks_in_proportion_to_half_the_grant() {
        let topology = TopologyConfig::default();
        assert_eq!(topology.reserved_bytes(), 6 << 30);
        // 4 GiB free: JetStream grants 3 GiB, half of it is 1.5 GiB.
        let fitted = topology.fitted_to_store(4 << 30);
        assert!(fitted.reserved_bytes() <= 3 << 29, "{fitted:?}");
        assert!(fitted.reserved_bytes() > (3 << 29) - 16, "{fitted:?}");
        assert_eq!(fitted.event_max_bytes, 256 << 20);
        assert_eq!(fitted.measurements_max_bytes, 1 << 30);
        assert_eq!(fitted.replicas, 1);
    }

    #[test]
    fn no_stream_limit_goes_below_the_floor() {
        let fitted = TopologyConfig::default().fitted_to_store(10 << 20);
        assert_eq!(fitted.event_max_bytes, MIN_STREAM_BYTES);
        assert_eq!(fitted.measurements_max_bytes, MIN_STREAM_BYTES);
        // A limit already under the floor is not raised to it.
        let tiny = TopologyConfig {
            event_max_bytes: 1 << 20,
            ..TopologyConfig::small()
        };
        assert_eq!(tiny.fitted_to_store(1 << 20).event_max_bytes, 1 << 20);
    }

    #[test]
    fn reconnect_delay_grows_and_is_capped() {
        let config = BusConfig::new("nats://127.0.0.1:4222");
        assert_eq!(config.reconnect_delay(0), Duration::from_millis(100));
        assert_eq!(config.reconnect_delay(1), Duration::from_millis(200));
        assert_eq!(config.reconnect_delay(3), Duration::from_millis(800));
        assert_eq!(config.reconnect_delay(10), Duration::from_secs(2));
        assert_eq!(config.reconnect_delay(usize::MAX), Duration::from_secs(2));
    }

    #[test]
    fn debug_output_redacts_the_nkey_seed() {
        let mut config = BusConfig::new("nats://127.0.0.1:4222");
        config.nkey_seed = Some("SUAEXAMPLESEEDSECRET".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("SUAEXAMPLESEEDSECRET"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
