//! The errors of starting and running a worker daemon. Session-level
//! failures never surface here: they end as a failed `TaskResult`.

use mtswarm_bus::BusError;
use mtswarm_hw::HwError;

/// Why a worker daemon could not start (or stop cleanly).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A [`WorkerConfig`](crate::WorkerConfig) field (or a file it names:
    /// nkey seed, API key file) is unusable; checked before anything starts.
    #[error("invalid worker configuration: {field}: {reason}")]
    Config {
        /// The `WorkerConfig` field at fault, e.g. `"lease_ttl"`.
        field: &'static str,
        /// What is wrong with it, for the operator.
        reason: String,
    },
    /// The fleet file could not be read, or a slice's hardware backend
    /// could not be opened.
    #[error("fleet: {0}")]
    Fleet(#[from] HwError),
    /// `WorkerConfig::board` names no board of the fleet file.
    #[error("board `{board}` is not in the fleet file (boards: {known})")]
    UnknownBoard {
        /// The configured board id.
        board: String,
        /// The fleet's board ids, comma-separated.
        known: String,
    },
    /// Connecting to NATS, creating the topology, or a bucket or lease
    /// operation failed.
    #[error("NATS: {0}")]
    Bus(#[from] BusError),
    /// A slice's lease is held by another worker id: a second daemon was
    /// started for this board. The leases taken so far were released.
    #[error("slice {slice_id} is leased by worker `{holder}`; another daemon owns this board")]
    SliceTaken {
        /// Bus id of the slice (`board0-c1`).
        slice_id: String,
        /// Worker id of the daemon holding its lease.
        holder: String,
    },
    /// The gRPC listener could not be bound (or its address not read).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The configured `listen` address.
        addr: std::net::SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The `--ready-file` could not be written.
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile {
        /// The configured ready file.
        path: std::path::PathBuf,
        /// The write error.
        source: std::io::Error,
    },
    /// The gRPC server could not be set up (reflection, TLS), failed while
    /// serving, or did not stop within the shutdown timeout.
    #[error("gRPC server: {0}")]
    Serve(String),
}
