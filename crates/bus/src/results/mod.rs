//! The results store: every measured candidate of every job, kept durably in
//! the JetStream stream `MTSWARM_MEASUREMENTS` so later sessions (and
//! reports) can learn from what was already tried. NATS is the system of
//! record; this module is the only way records enter or leave it.
//!
//! - Subject per record: `mtswarm.measurement.<job_id>.<kernel>.<hash16>.<slice>`
//!   (see [`measurement_subject`]). Job, kernel name, kernel-hash prefix and
//!   slice are subject tokens so [`ResultsStore::query`] lets the server filter
//!   on them; every other filter (full hash, backend, validity, time) is
//!   applied while scanning.
//! - Payload: one [`ResultRecord`] as JSON (serde) with the header
//!   `Content-Type: application/json; schema=mtswarm.ResultRecord.v1`. JSON
//!   rather than protobuf because records are exported as JSONL/CSV, read by
//!   people and scripts, and carry open-ended parameter maps; the bus
//!   messages that drive the system stay protobuf.
//! - `Nats-Msg-Id` = [`ResultRecord::record_id`], so a record published twice
//!   within the duplicate window (a retry after a lost ack, a resumed session)
//!   is stored once.
//! - Queries scan with an ordered consumer on the narrowest subject filter
//!   and keep at most `limit` records in memory.
//!
//! [`to_jsonl`] / [`to_csv`] export records for analysis; CSV flattens the
//! `-D` parameters into `param.<NAME>` columns.

mod export;
mod hex;
mod query;
mod record;
mod store;
mod subject;

pub use crate::config::{MEASUREMENT_MAX_RECORD_BYTES, MEASUREMENTS_MAX_BYTES};
pub use crate::topology::measurements_stream_config;
pub use export::{CSV_COLUMNS, ExportError, read_jsonl, to_csv, to_jsonl};
pub use query::ResultQuery;
pub use record::{
    CandidateStatus, MAX_SOURCE_DIFF_BYTES, Provenance, RecordError, RecordGrant, ResultRecord,
    ResultStats, SOURCE_DIFF_TRUNCATED, unix_millis,
};
pub use store::{
    RECORD_SIGNATURE_HEADER, RecordSigner, ResultsStore, SignedRecord, UndecodableRecord,
    decode_record,
};
pub use subject::{canonical_slice_id, measurement_subject, token};

/// Content type of a stored result record.
pub const RESULT_RECORD_CONTENT_TYPE: &str = "application/json; schema=mtswarm.ResultRecord.v1";
/// Records a query returns when the caller does not say.
pub const DEFAULT_QUERY_LIMIT: usize = 1_000;
/// Largest `limit` a query accepts (the results are held in memory).
pub const MAX_QUERY_LIMIT: usize = 100_000;
/// Longest accepted record id.
pub const MAX_RECORD_ID_LEN: usize = 512;

#[cfg(test)]
mod tests;
