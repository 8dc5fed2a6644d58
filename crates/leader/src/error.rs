//! The leader's error type: what can go wrong starting or running the
//! daemon, each variant naming the part involved.

use std::net::SocketAddr;

/// Errors of [`crate::LeaderDaemon`].
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader configuration: {0}")]
    InvalidConfig(String),
    #[error("NATS: {0}")]
    Bus(#[from] mtswarm_bus::BusError),
    #[error("cannot bind the gRPC listener on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC reflection service: {0}")]
    Reflection(String),
    #[error("job event stream: {0}")]
    JobEvents(String),
    #[error("gRPC server failed: {0}")]
    Server(String),
}
