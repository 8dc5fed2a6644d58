//! NATS and JetStream wiring for mtswarm: the data plane between the leader
//! and the worker daemons.
//!
//! - [`Bus::connect`] opens one self-reconnecting connection ([`BusConfig`]:
//!   servers, name, creds/nkey, TLS, timeouts, backoff).
//! - [`Bus::ensure_topology`] creates the streams and KV buckets idempotently.
//! - Typed messaging: tasks ([`Bus::publish_task`], [`Bus::task_consumer`]),
//!   results ([`Bus::publish_result`], [`Bus::result_consumer`]), events
//!   ([`Bus::publish_event`], [`Bus::publish_events`] for a batch in one
//!   message, [`Bus::subscribe_events`], [`Bus::replay_events`]),
//!   approval notifications ([`Bus::publish_approval_request`],
//!   [`Bus::publish_approval_decision`] and their subscriptions).
//! - Typed KV stores: [`Leases`] (with [`LeaseKeeper`] for background
//!   renewal of one lease and [`LeaseSet`] for many, by one loop), [`Workers`], [`Quarantine`], [`Jobs`], [`Checkpoints`],
//!   [`Approvals`], all over [`TypedKv`].
//! - Every message is protobuf with a content-type header ([`codec`]) and
//!   carries the publisher's W3C trace context ([`trace`]).
//! - [`local_server::NatsServer`] runs a real `nats-server` on a loopback
//!   port for local stacks and tests; `testing` (cargo feature `testing`)
//!   holds the benchmarks' shared pieces.
//!
//! Subjects, streams and buckets are listed in [`subjects`] (and README.md).

pub mod codec;
pub mod config;
mod connection;
mod daemon_lease;
pub mod error;
pub mod jobs;
mod kv;
mod lease_event;
mod lease_set;
mod leases;
mod limits;
pub mod local_server;
mod messaging;
pub mod ownership;
pub mod permissions;
mod renewal;
pub mod reopen;
pub mod results;
mod stores;
pub mod subjects;
#[cfg(any(test, feature = "testing"))]
// Test support: a failed setup step panics, which fails the test or bench.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod testing;
mod topology;
pub mod trace;
mod ttl_lease;

pub use async_nats::HeaderMap;
/// File or memory storage of a stream ([`TopologyConfig::storage`]).
pub use async_nats::jetstream::stream::StorageType;
pub use codec::BusMessage;
pub use config::{BusConfig, TlsConfig, TopologyConfig};
pub use error::BusError;
pub use jobs::{Jobs, OwnerWrites};
pub use kv::{KvChange, KvWatch, TypedKv, Versioned};
pub use lease_set::LeaseSet;
pub use leases::{KeptLease, LeaseEvent, LeaseKeeper, LeaseRequest, LeaseWatch, Leases};
pub use messaging::{
    Delivery, DeliveryInfo, DeliveryStream, PendingPublish, PublishReceipt, Received,
    ReceivedStream, ReplayedEvent, ResultConsumer, ResultConsumerConfig, TaskConsumer,
    TaskConsumerConfig,
};
pub use mtswarm_proto::v1;
pub use ownership::{
    Fence, JobOwner, JobOwners, KeptOwnership, OwnerEvent, OwnerWatch, OwnershipError,
    OwnershipKeeper,
};
pub use reopen::{Backoff, reopen, retry_within};
pub use results::{ResultQuery, ResultRecord, ResultsStore};
pub use stores::{
    Approvals, CheckpointSeal, Checkpoints, Quarantine, STANDING_APPROVAL_PREFIX, Workers,
};
pub use topology::TopologyInfo;

pub use connection::{Bus, ConnectionState};
