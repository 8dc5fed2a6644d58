//! The errors of starting and running a worker daemon. Session-level
//! failures never surface here: they end as a failed `TaskResult`.

use mtswarm_bus::BusError;
use mtswarm_hw::HwError;

/// Why a worker daemon could not start (or stop cleanly).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid worker configuration: {field}: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("fleet: {0}")]
    Fleet(#[from] HwError),
    #[error("board `{board}` is not in the fleet file (boards: {known})")]
    UnknownBoard { board: String, known: String },
    #[error("NATS: {0}")]
    Bus(#[from] BusError),
    #[error("slice {slice_id} is leased by worker `{holder}`; another daemon owns this board")]
    SliceTaken { slice_id: String, holder: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("gRPC server: {0}")]
    Serve(String),
}
