//! mtswarm-hw: the MT-3000 hardware as the rest of the system sees it.
//!
//! The chip model ([`spec`]), how a farm is sliced ([`fleet`]), the [`Board`]
//! trait with its three backends (the shipped emulator, the real SDK through
//! command templates, the host CPU), measurement statistics and the per-slice
//! hardware lock.

pub mod board;
pub mod device_check;
pub mod emulator;
pub mod faults;
pub mod fleet;
pub mod harness;
pub mod host;
pub mod lock;
pub mod measure;
pub mod plausibility;
pub mod sandbox;
pub mod sdk;
pub mod spec;
pub mod tune;

pub use board::{
    Artifact, BackendKind, Board, BuildRequest, Counters, RunOutcome, RunRequest, Slice,
};
pub use emulator::EmulatorBoard;
pub use faults::{Fault, FaultConfig};
pub use fleet::{Fleet, FleetBoard, SliceSelector};
pub use host::HostBoard;
pub use lock::{HwGuard, HwLock, LockStats};
pub use measure::{MeasureConfig, Measurement, measure};
pub use sdk::{SdkBoard, SdkConfig};
pub use spec::ChipSpec;
pub use tune::TuneSpace;

/// Errors of the hardware layer. Messages name the limit or the command that
/// failed, the way the real toolchain or runtime would.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HwError {
    #[error("configuration error: {0}")]
    Config(String),
    #[error("kernel directory {0}")]
    Kernel(String),
    #[error("compile failed: {0}")]
    Compile(String),
    #[error("launch failed: {0}")]
    Launch(String),
    #[error("run timed out after {0:?} (killed)")]
    Timeout(std::time::Duration),
    #[error("{0}")]
    Capacity(String),
    #[error("io error: {0}")]
    Io(String),
}

impl From<std::io::Error> for HwError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}
