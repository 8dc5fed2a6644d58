//! mtswarm-hw: the MT-3000 hardware as the rest of the system sees it.
//!
//! The chip model ([`spec`]), how a farm is sliced ([`fleet`]), the [`Board`]
//! trait with its backends (the shipped emulator, the real SDK through
//! command templates, the host CPU, and a simulated board for farm-scale
//! tests), measurement statistics and the per-slice
//! hardware lock.

mod backends;
pub mod board;
pub mod device_check;
mod emu;
pub mod emulator;
mod error;
pub mod faults;
pub mod fleet;
pub mod fuzzing;
pub mod harness;
mod harness_line;
pub mod host;
pub mod landscape;
pub mod lock;
pub mod measure;
pub mod plausibility;
pub mod process;
pub mod reference;
pub mod sandbox;
pub mod sdk;
pub mod simulated;
pub mod spec;
pub mod toolchain;
pub mod tune;

pub use board::{
    Artifact, BackendKind, Board, BuildRequest, Counters, RunOutcome, RunRequest, Slice,
};
pub use emulator::EmulatorBoard;
pub use error::{ErrorDetail, HwError};
pub use faults::{Fault, FaultConfig, FaultsError};
pub use fleet::{Fleet, FleetBoard, SliceSelector};
pub use host::HostBoard;
pub use lock::{HwGuard, HwLock, LockStats};
pub use measure::{MeasureConfig, Measurement, measure};
pub use sdk::{SdkBoard, SdkConfig};
pub use simulated::SimulatedBoard;
pub use spec::ChipSpec;
pub use tune::TuneSpace;
