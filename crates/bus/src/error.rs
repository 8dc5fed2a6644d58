//! The one error type of the bus crate, so callers can match on what went
//! wrong (a CAS conflict or a lease held by someone else is an expected
//! outcome, not a failure) while every variant still names the subject,
//! bucket or key involved.

use std::path::PathBuf;

/// Boxed error from the NATS client (its error kinds differ per operation).
pub type NatsSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong on the bus; each variant names what was involved.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The [`BusConfig`](crate::BusConfig) or a bucket setting cannot be used
    /// (no server URL, bad URL, bad TLS or credentials setup, closed connection).
    #[error("invalid bus configuration: {0}")]
    InvalidConfig(String),

    /// The NATS credentials (`.creds`) file could not be read.
    #[error("cannot read NATS credentials file {path}: {source}")]
    Credentials {
        /// Path of the credentials file as configured.
        path: PathBuf,
        /// Why reading it failed.
        #[source]
        source: std::io::Error,
    },

    /// The first connection to the NATS servers failed.
    #[error("cannot connect to NATS at {servers}: {source}")]
    Connect {
        /// The configured server URLs, comma-separated.
        servers: String,
        /// The client's connect error.
        #[source]
        source: async_nats::ConnectError,
    },

    /// An id or argument that would end up in a subject, key or query is
    /// malformed (empty, wildcard or separator characters, out of range).
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidId {
        /// What the value was meant to be, e.g. `"slice id"` or `"query limit"`.
        kind: &'static str,
        /// The rejected value as given.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },

    /// Creating or updating a stream, consumer or bucket failed.
    #[error("cannot create or update {what}: {source}")]
    Topology {
        /// The stream or bucket, e.g. `"stream MEASUREMENTS"`.
        what: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// A stream or bucket asks for more replicas than the NATS deployment
    /// can place (JetStream's own error for this is cryptic).
    #[error(
        "cannot create or update {what} with {replicas} replicas: the NATS deployment has {servers} JetStream server(s) ({refusal}); set --nats-replicas (MTSWARM_NATS_REPLICAS) to at most {servers} or add servers"
    )]
    Replicas {
        /// The stream or bucket, e.g. `"stream MTSWARM_TASKS"`.
        what: String,
        /// Replicas the topology asks for.
        replicas: usize,
        /// JetStream servers the connected server knows of (itself and its
        /// cluster peers).
        servers: usize,
        /// What the server said, or why the request was not sent.
        refusal: String,
    },

    /// The server has too little JetStream storage left to reserve the
    /// size limits of the topology's streams (JetStream's error 10047,
    /// "insufficient storage resources available").
    #[error(
        "cannot create or update {what}: nats-server has too little JetStream storage for the stream size limits ({} in all: events {} and the job journal as much, measurements {}); it grants three quarters of its store disk's free space unless jetstream.max_file_store says otherwise. Free disk where nats-server stores, or lower --nats-events-max-bytes (MTSWARM_NATS_EVENTS_MAX_BYTES) and --nats-measurements-max-bytes (MTSWARM_NATS_MEASUREMENTS_MAX_BYTES) [the server said: {refusal}]",
        human_bytes(usize::try_from(*reserved).unwrap_or(usize::MAX)),
        human_bytes(usize::try_from(*events).unwrap_or(usize::MAX)),
        human_bytes(usize::try_from(*measurements).unwrap_or(usize::MAX))
    )]
    StoreFull {
        /// The stream, e.g. `"stream MTSWARM_EVENTS"`.
        what: String,
        /// Bytes the topology reserves on each server ([`crate::TopologyConfig::reserved_bytes`]).
        reserved: i64,
        /// The events stream's and the job journal's limit, bytes.
        events: i64,
        /// The measurements stream's limit, bytes.
        measurements: i64,
        /// What the server said.
        refusal: String,
    },

    /// A record is larger than the server or the deployment lets one
    /// stored message be; it was not sent.
    #[error(
        "{what} is {} ({bytes} bytes), over the {} limit ({limit_from})",
        human_bytes(*bytes),
        human_bytes(*limit)
    )]
    RecordTooLarge {
        /// The record and where it was going: `"<type> record <bucket>/<key>"`
        /// or `"<type> on <subject>"`.
        what: String,
        /// Its encoded size (payload and headers), bytes.
        bytes: usize,
        /// The limit it is over, bytes.
        limit: usize,
        /// Where the limit comes from, e.g. `"max_payload"`.
        limit_from: &'static str,
    },

    /// A publish (core or JetStream, including waiting for the ack) failed.
    #[error("publish to {subject} failed: {source}")]
    Publish {
        /// Subject the message was published to.
        subject: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// A core NATS subscription could not be made.
    #[error("subscribe to {subject} failed: {source}")]
    Subscribe {
        /// Subject (or wildcard) subscribed to.
        subject: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// Creating, opening or reading from a JetStream consumer failed.
    #[error("consumer {consumer} on stream {stream}: {source}")]
    Consumer {
        /// Stream the consumer belongs to.
        stream: String,
        /// Durable name of the consumer (a description such as `"ordered scan"`
        /// for an ephemeral one).
        consumer: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// Acknowledging (ack, nak or term) a JetStream message failed.
    #[error("acknowledging message on {subject} failed: {source}")]
    Ack {
        /// Subject of the message being acknowledged.
        subject: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// A payload did not decode as the protobuf message it should be.
    #[error("message on {subject} is not a valid {type_name}: {source}")]
    Decode {
        /// Subject the payload came from (`$KV.<bucket>.<key>` for a KV value).
        subject: String,
        /// Rust type name of the expected message.
        type_name: &'static str,
        /// prost's decode error.
        #[source]
        source: prost::DecodeError,
    },

    /// Events given to be published as one batch name different jobs or
    /// agents (a batch travels on one agent's subject).
    #[error("an agent event batch for {expected} holds an event of {found}")]
    MixedEventBatch {
        /// Job/agent of the batch's first event.
        expected: String,
        /// Job/agent of the event that does not belong.
        found: String,
    },

    /// A message's `Content-Type` header names another message type.
    #[error("message on {subject} has content type {found:?}, expected {expected:?}")]
    ContentType {
        /// Subject the message came from.
        subject: String,
        /// Content type of the message type the reader asked for.
        expected: String,
        /// Content type the header carried.
        found: String,
    },

    /// A KV operation failed for a reason other than a conflict or a missing key.
    #[error("KV {op} of {bucket}/{key} failed: {source}")]
    Kv {
        /// The operation, e.g. `"get"`, `"create"`, `"update"`, `"watch"`.
        op: &'static str,
        /// KV bucket name.
        bucket: String,
        /// Key within the bucket.
        key: String,
        /// The client's error.
        #[source]
        source: NatsSource,
    },

    /// A compare-and-set write lost: the key is no longer at the expected
    /// revision. Expected under contention: re-read and retry
    /// ([`BusError::is_conflict`]).
    #[error("KV {bucket}/{key} changed concurrently (expected revision {expected_revision})")]
    CasConflict {
        /// KV bucket name.
        bucket: String,
        /// Key within the bucket.
        key: String,
        /// Revision the writer had read and expected to replace.
        expected_revision: u64,
    },

    /// A job owner's write found the record written by a later owner of
    /// the job (a larger fencing epoch, see [`crate::ownership`]): this
    /// writer lost the job and must write nothing more for it.
    #[error(
        "KV {bucket}/{key} belongs to the job's owner at epoch {stored_epoch}; a write at epoch {epoch} is refused"
    )]
    Fenced {
        /// KV bucket name.
        bucket: String,
        /// Key within the bucket.
        key: String,
        /// Epoch of the refused writer.
        epoch: u64,
        /// Epoch stored in the record.
        stored_epoch: u64,
    },

    /// A create-only write found the key already present.
    #[error("KV {bucket}/{key} already exists")]
    AlreadyExists {
        /// KV bucket name.
        bucket: String,
        /// Key within the bucket.
        key: String,
    },

    /// The key does not exist (or was deleted) where the caller required it.
    #[error("KV {bucket}/{key} not found")]
    NotFound {
        /// KV bucket name.
        bucket: String,
        /// Key within the bucket.
        key: String,
    },

    /// Another worker holds a live lease on the slice.
    #[error(
        "slice {slice_id} is leased by worker {holder_worker_id} (session {holder_session_id:?})"
    )]
    LeaseHeld {
        /// The slice asked for.
        slice_id: String,
        /// Worker that holds the lease now.
        holder_worker_id: String,
        /// Session the holder leased it for (empty when it gave none).
        holder_session_id: String,
    },

    /// This holder's lease lapsed or was taken over, so it may no longer act
    /// on the slice.
    #[error(
        "lease on slice {slice_id} was lost (lapsed or taken over) before it could be {action}"
    )]
    LeaseLost {
        /// The slice whose lease was lost.
        slice_id: String,
        /// What the holder was doing, e.g. `"renewed"` or `"released"`.
        action: &'static str,
    },

    /// A worker daemon's lease (the liveness its slice claims live by)
    /// lapsed or was taken by a later life of the daemon: every claim of
    /// its epoch is lost with it.
    #[error(
        "the lease of worker daemon {worker_id} was lost (lapsed or taken again) before it could be {action}"
    )]
    DaemonLeaseLost {
        /// The daemon.
        worker_id: String,
        /// What the holder was doing, e.g. `"renewed"`.
        action: &'static str,
    },

    /// An approval was decided twice; the first decision stands.
    #[error("approval {approval_id} is already decided ({state})")]
    AlreadyDecided {
        /// Approval id.
        approval_id: String,
        /// The stored state, as its protobuf enum name.
        state: String,
    },

    /// A decision on an approval is not one that can be recorded.
    #[error("invalid approval decision for {approval_id}: {reason}")]
    InvalidDecision {
        /// Approval id.
        approval_id: String,
        /// Why the decision was refused.
        reason: &'static str,
    },

    /// A session checkpoint write came from an older attempt of the task than
    /// the one stored (or from the same attempt after it was fenced), so it is
    /// refused.
    #[error(
        "checkpoint of session {session_id} is from attempt {stored_attempt}; attempt {attempt} is stale"
    )]
    StaleAttempt {
        /// Session whose checkpoint was written.
        session_id: String,
        /// Attempt number of the stored checkpoint.
        stored_attempt: u32,
        /// Attempt number of the refused write.
        attempt: u32,
    },
}

impl BusError {
    /// True for outcomes a caller is expected to handle by re-reading and
    /// retrying (CAS conflicts), as opposed to infrastructure failures.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            BusError::CasConflict { .. } | BusError::AlreadyExists { .. }
        )
    }

    /// True when a stored or received payload is not the message it should
    /// be: the record is bad, not the connection, so skipping it is right.
    pub fn is_undecodable(&self) -> bool {
        matches!(self, BusError::Decode { .. } | BusError::ContentType { .. })
    }

    /// True when a consumer could not be created because another consumer
    /// of the work-queue stream already filters an overlapping subject
    /// (JetStream error 10100), e.g. per-slice task consumers of an earlier
    /// version under a worker-wide one.
    pub fn is_overlapping_consumer(&self) -> bool {
        let BusError::Consumer { source, .. } = self else {
            return false;
        };
        chain_mentions(source.as_ref(), &["10100", "filtered consumer not unique"])
    }
}

/// `bytes` for people: `512 bytes`, `1.4 MiB`.
pub(crate) fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    // Display only: the f64 rounding of huge sizes does not matter.
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text} {}", UNITS[unit])
}

/// True when `error` says a JetStream stream (or the stream behind a KV
/// bucket) does not exist. The client reports this through several error
/// types, so the check reads the error chain.
pub(crate) fn is_missing_stream(error: &(dyn std::error::Error + 'static)) -> bool {
    chain_mentions(
        error,
        &[
            "stream not found",
            "no stream found",
            "bucket does not exist",
            "10059",
        ],
    )
}

/// True when some error of `error`'s source chain says one of `needles`.
fn chain_mentions(error: &(dyn std::error::Error + 'static), needles: &[&str]) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        let text = error.to_string();
        if needles.iter().any(|needle| text.contains(needle)) {
            return true;
        }
        next = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1_468_006), "1.4 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }
}
