//! What a watch of the leases bucket reports per slice, whichever kind of
//! claim it is (one with its own TTL, or one living by its daemon's lease):
//! a module of its own so both the bucket (`crate::leases`) and the view
//! that joins claims with daemon leases (`crate::daemon_lease`) speak it.

use std::time::SystemTime;

use mtswarm_proto::v1::SliceLease;

use crate::kv::Versioned;

/// A change of a slice's lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseEvent {
    /// Acquired or renewed.
    Held(Versioned<SliceLease>),
    /// Given up by its holder.
    Released {
        /// The slice now free.
        slice_id: String,
    },
    /// Not renewed within its TTL (its own, or its daemon's): the slice is
    /// free and its session lost.
    Lapsed {
        /// The slice now free.
        slice_id: String,
        /// When the lease ran out, when known (its daemon's lease's expiry
        /// time; a key with its own TTL leaves no time in its marker).
        expired_at: Option<SystemTime>,
    },
}
