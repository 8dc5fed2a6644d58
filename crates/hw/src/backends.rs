//! The backend factory: how a slice of the fleet is opened as a [`Board`],
//! one backend per board kind.
//!
//! The fleet inventory ([`crate::fleet`]) says which boards exist; this
//! module is the only one that knows every backend, so the backends stay
//! peers that never import each other and the inventory stays free of
//! them.

use std::sync::Arc;

use crate::board::{BackendKind, Board, Slice};
use crate::emulator::EmulatorBoard;
use crate::error::HwError;
use crate::fleet::{Fleet, FleetBoard, config_error};
use crate::host::HostBoard;
use crate::sdk::{SdkBoard, SdkConfig};
use crate::simulated::SimulatedBoard;

impl Fleet {
    /// Open the backend for one of this fleet's slices. `sdk` supplies the
    /// command templates for `sdk` boards (its unset host, launch prefix and
    /// SDK root are taken from the fleet entry).
    pub fn open(&self, slice: &Slice, sdk: &SdkConfig) -> Result<Arc<dyn Board>, HwError> {
        let board = self
            .board_of(slice)
            .filter(|b| b.slices.contains(slice))
            .ok_or_else(|| config_error(format!("slice {} is not in the fleet", slice.id())))?;
        Ok(match board.backend {
            BackendKind::Emulator => {
                let mut emulator = EmulatorBoard::new(slice.clone(), board.spec.clone())?;
                if let Some(faults) = board.faults_of(slice) {
                    emulator = emulator.with_faults(faults);
                }
                Arc::new(emulator)
            }
            BackendKind::Host => Arc::new(HostBoard::new(slice.clone(), board.spec.clone())?),
            BackendKind::Sdk => Arc::new(sdk_board(board, slice.clone(), sdk.clone())?),
            BackendKind::Simulated => Arc::new(SimulatedBoard::new(
                slice.clone(),
                board.spec.clone(),
                board.simulated.unwrap_or_default(),
            )?),
        })
    }
}

/// An sdk board for `slice`, with the site's host, launch prefix and SDK
/// root taken from the fleet file where the configuration leaves them unset.
fn sdk_board(board: &FleetBoard, slice: Slice, mut config: SdkConfig) -> Result<SdkBoard, HwError> {
    if config.launch_prefix.is_empty() {
        config.launch_prefix = board.launch_prefix.clone();
    }
    if config.host.is_none() {
        config.host = board.host.clone();
    }
    if config.sdk_root.is_none() {
        config.sdk_root = board.sdk_root.clone();
    }
    SdkBoard::new(slice, board.spec.clone(), config)
}
