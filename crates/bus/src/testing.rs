//! Test and benchmark support, behind the `testing` cargo feature (enabled
//! by the crates that use it in their `[dev-dependencies]`): the bench pieces
//! that measure the transport floor, and the local nats-server under the
//! name tests have always used.

pub mod bench;

pub use crate::local_server::NatsServer;
