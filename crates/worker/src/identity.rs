//! Who this daemon is to the rest of the system: its worker id, the
//! endpoint its record advertises, the key it signs its records with (its
//! public half is in the record, [`crate::provenance`]) and when it
//! started; and the worker record built from them.

use mtswarm_auth::WorkerKey;
use mtswarm_bus::v1;

use crate::events::now_timestamp;
use crate::slices::{SliceEntry, Slices};

/// The daemon's identity.
pub(crate) struct WorkerIdentity {
    pub(crate) worker_id: String,
    pub(crate) endpoint: String,
    pub(crate) record_key: WorkerKey,
    pub(crate) started_at: prost_types::Timestamp,
}

impl WorkerIdentity {
    /// The worker record as of now.
    pub(crate) fn record(&self, slices: &Slices) -> v1::WorkerRecord {
        let active = slices.table().sessions.len();
        v1::WorkerRecord {
            worker_id: self.worker_id.clone(),
            endpoint: self.endpoint.clone(),
            slices: slices.iter().map(SliceEntry::descriptor).collect(),
            draining: slices.is_draining(),
            active_sessions: u32::try_from(active).unwrap_or(u32::MAX),
            started_at: Some(self.started_at),
            heartbeat_at: Some(now_timestamp()),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            record_key: self.record_key.public_key(),
        }
    }
}
