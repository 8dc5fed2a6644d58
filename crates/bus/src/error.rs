//! The one error type of the bus crate, so callers can match on what went
//! wrong (a CAS conflict or a lease held by someone else is an expected
//! outcome, not a failure) while every variant still names the subject,
//! bucket or key involved.

use std::path::PathBuf;

/// Boxed error from the NATS client (its error kinds differ per operation).
pub type NatsSource = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("invalid bus configuration: {0}")]
    InvalidConfig(String),

    #[error("cannot read NATS credentials file {path}: {source}")]
    Credentials {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot connect to NATS at {servers}: {source}")]
    Connect {
        servers: String,
        #[source]
        source: async_nats::ConnectError,
    },

    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidId {
        kind: &'static str,
        value: String,
        reason: &'static str,
    },

    #[error("cannot create or update {what}: {source}")]
    Topology {
        what: String,
        #[source]
        source: NatsSource,
    },

    #[error("publish to {subject} failed: {source}")]
    Publish {
        subject: String,
        #[source]
        source: NatsSource,
    },

    #[error("subscribe to {subject} failed: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: NatsSource,
    },

    #[error("consumer {consumer} on stream {stream}: {source}")]
    Consumer {
        stream: String,
        consumer: String,
        #[source]
        source: NatsSource,
    },

    #[error("acknowledging message on {subject} failed: {source}")]
    Ack {
        subject: String,
        #[source]
        source: NatsSource,
    },

    #[error("message on {subject} is not a valid {type_name}: {source}")]
    Decode {
        subject: String,
        type_name: &'static str,
        #[source]
        source: prost::DecodeError,
    },

    #[error("message on {subject} has content type {found:?}, expected {expected:?}")]
    ContentType {
        subject: String,
        expected: String,
        found: String,
    },

    #[error("KV {op} of {bucket}/{key} failed: {source}")]
    Kv {
        op: &'static str,
        bucket: String,
        key: String,
        #[source]
        source: NatsSource,
    },

    #[error("KV {bucket}/{key} changed concurrently (expected revision {expected_revision})")]
    CasConflict {
        bucket: String,
        key: String,
        expected_revision: u64,
    },

    #[error("KV {bucket}/{key} already exists")]
    AlreadyExists { bucket: String, key: String },

    #[error("KV {bucket}/{key} not found")]
    NotFound { bucket: String, key: String },

    #[error(
        "slice {slice_id} is leased by worker {holder_worker_id} (session {holder_session_id:?})"
    )]
    LeaseHeld {
        slice_id: String,
        holder_worker_id: String,
        holder_session_id: String,
    },

    #[error(
        "lease on slice {slice_id} was lost (lapsed or taken over) before it could be {action}"
    )]
    LeaseLost {
        slice_id: String,
        action: &'static str,
    },

    #[error("approval {approval_id} is already decided ({state})")]
    AlreadyDecided { approval_id: String, state: String },

    #[error("invalid approval decision for {approval_id}: {reason}")]
    InvalidDecision {
        approval_id: String,
        reason: &'static str,
    },

    #[error(
        "checkpoint of session {session_id} is from attempt {stored_attempt}; attempt {attempt} is stale"
    )]
    StaleAttempt {
        session_id: String,
        stored_attempt: u32,
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
}
