//! Test and benchmark support, behind the `testing` cargo feature (enabled
//! by the crates that use it in their `[dev-dependencies]`): the bench pieces
//! that measure the transport floor, a local nats-server cluster, and the
//! local nats-server under the name tests have always used.

pub mod bench;
pub mod cluster;

pub use crate::local_server::NatsServer;
