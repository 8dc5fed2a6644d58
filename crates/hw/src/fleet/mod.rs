//! The fleet inventory: which boards exist, which backend drives each, which
//! chip spec applies, and how each board is cut into slices for worker agents.
//! Worker daemons load it to know what they own; the leader's selectors
//! ([`SliceSelector`]) pick slices from it.
//!
//! # `fleet.toml`
//!
//! ```toml
//! # One [[board]] table per board.
//! [[board]]
//! id = "board0"
//! backend = "emulator"          # emulator | sdk | host | simulated
//! slicing = "per-cluster"       # one slice per cluster, all its cores
//!
//! [[board]]
//! id = "board1"
//! backend = "emulator"
//! spec_file = "mt3000.toml"     # relative to the fleet file; default: built-in spec
//! spec = { cores_per_cluster = 16 }   # inline overrides, applied over the file
//! slices = [{ cluster = 0, cores = 8 }, { cluster = 1, cores = 16 }]
//!
//! [[board]]
//! id = "node17"
//! backend = "sdk"
//! host = "node17"               # the board's host, for ssh/srun launch prefixes
//! launch_prefix = ["yhrun", "-p", "thcp1", "-w", "node17"]
//! sdk_root = "/opt/mt3000"
//! slicing = "whole"             # the default: the whole board is one slice
//!
//! [[board]]
//! id = "flaky0"
//! backend = "emulator"
//! # Fault injection (emulator only, off unless given): probabilities per
//! # launch in 0..=1, and the seed of the per-launch draws.
//! faults = { hang = 0.2, crash = 0.1, wrong = 0.1, seed = 7 }
//! # A slice's own `faults` replaces the board's for that slice.
//! slices = [{ cluster = 0 }, { cluster = 1, cores = 16, faults = { crash = 1.0 } }]
//!
//! [[board]]
//! id = "sim0"
//! backend = "simulated"         # no compiler, no process: a timer per run
//! spec = { clusters = 64, cores_per_cluster = 1 }   # 64 single-core slices
//! slicing = "per-cluster"
//! run_ms = [5, 20]              # per execution: a fixed number or [low, high]
//! incorrect_fraction = 0.1      # share of configurations with wrong answers
//! noise = 0.005                 # relative spread of the measured times
//! ```
//!
//! Rules (checked by [`Fleet::from_toml_str`], errors name the board):
//! board ids are unique and non-empty; the backend is one of the four; a
//! board uses either `slicing` or `slices`, not both; `slicing` is `whole`
//! or `per-cluster` (with an optional `cores` per cluster); every listed
//! cluster is `< spec.clusters`, appears once, and has `1..=cores_per_cluster`
//! cores. Unknown keys are errors, so a typo never falls back to a default.
//!
//! `faults` (see [`crate::faults`]): keys `hang`, `crash`, `wrong` (numbers
//! in `0..=1`, default 0) and `seed` (non-negative integer, default 0); only
//! on `emulator` boards; errors name the board, the slice and the key. A
//! launch draws hang, then crash, then wrong, deterministically per (seed,
//! slice, launch number): a hang is killed by the run timeout and reported as
//! a timeout, a crash is a SIGSEGV death of the harness, a wrong answer fails
//! the harness's own check.
//!
//! `run_ms` (default `[5, 20]`, whole milliseconds up to 600000),
//! `incorrect_fraction` (default 0, in `0..=1`) and `noise` (default 0.005,
//! in `0..=0.1`) belong to `simulated` boards only (see
//! [`crate::simulated`]); on another backend they are errors naming the
//! board and the key.
//!
//! This module says what exists; how a slice's backend is opened
//! (`Fleet::open`) is in `backends.rs`.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::board::{BackendKind, Slice};
use crate::error::HwError;
use crate::faults::FaultConfig;
use crate::spec::ChipSpec;

mod selector;
mod simulated;

pub use selector::{SelectorError, SelectorOp, SelectorTerm, SliceSelector};
pub use simulated::{DEFAULT_NOISE, DEFAULT_RUN_MS, SimulatedSettings};

/// One board of the fleet, validated, with its slices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetBoard {
    /// Board id, unique in the fleet, without '/', ',' or whitespace (the
    /// prefix of its slice ids).
    pub id: String,
    /// The backend of every slice of the board.
    pub backend: BackendKind,
    /// The chip model: the built-in spec or `spec_file`, with the inline `spec`
    /// overrides applied.
    pub spec: ChipSpec,
    /// Host the board is attached to (for `sdk` launch prefixes).
    pub host: Option<String>,
    /// Argument vector put in front of the harness when launching (`sdk`).
    pub launch_prefix: Vec<String>,
    /// Root of the MT-3000 toolchain installation (`sdk`).
    pub sdk_root: Option<PathBuf>,
    /// The board's slices as `slicing` or `slices` cut it, never empty.
    pub slices: Vec<Slice>,
    /// Fault injection per slice id (`board0/c1`); slices without faults
    /// are absent.
    pub faults: BTreeMap<String, FaultConfig>,
    /// Run times, wrong answers and noise of a `simulated` board (`None` on
    /// every other backend).
    pub simulated: Option<SimulatedSettings>,
}

impl FleetBoard {
    /// The fault rates of one of this board's slices (`None` = no faults).
    pub fn faults_of(&self, slice: &Slice) -> Option<FaultConfig> {
        self.faults.get(&slice.id()).copied()
    }
}

/// A validated fleet inventory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fleet {
    /// The boards, in file order (at least one).
    pub boards: Vec<FleetBoard>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    #[serde(default)]
    board: Vec<RawBoard>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBoard {
    id: String,
    backend: String,
    #[serde(default)]
    spec_file: Option<PathBuf>,
    #[serde(default)]
    spec: Option<toml::Table>,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    launch_prefix: Vec<String>,
    #[serde(default)]
    sdk_root: Option<PathBuf>,
    #[serde(default)]
    slicing: Option<String>,
    /// Cores per cluster slice with `slicing = "per-cluster"`.
    #[serde(default)]
    cores: Option<u32>,
    #[serde(default)]
    slices: Option<Vec<RawSlice>>,
    /// Fault injection for every slice of the board.
    #[serde(default)]
    faults: Option<toml::Value>,
    /// Simulated boards: milliseconds per execution, fixed or `[low, high]`.
    #[serde(default)]
    run_ms: Option<toml::Value>,
    /// Simulated boards: share of configurations that answer wrongly.
    #[serde(default)]
    incorrect_fraction: Option<toml::Value>,
    /// Simulated boards: relative spread of the measured times.
    #[serde(default)]
    noise: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlice {
    cluster: u32,
    #[serde(default)]
    cores: Option<u32>,
    #[serde(default)]
    faults: Option<toml::Value>,
}

pub(crate) fn config_error(msg: String) -> HwError {
    HwError::Config(format!("fleet: {}", crate::process::excerpt(&msg)))
}

/// A backend name that is none of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (expected emulator, sdk, host or simulated)")]
pub struct UnknownBackend(pub String);

/// Parse a backend name the way the fleet file and selectors spell it.
pub fn parse_backend(name: &str) -> Result<BackendKind, UnknownBackend> {
    match name.trim() {
        "emulator" => Ok(BackendKind::Emulator),
        "sdk" => Ok(BackendKind::Sdk),
        "host" => Ok(BackendKind::Host),
        "simulated" => Ok(BackendKind::Simulated),
        other => Err(UnknownBackend(other.to_owned())),
    }
}

/// Apply `overrides` key by key over `base` (nested tables merge).
fn merge_table(base: &mut toml::Table, overrides: &toml::Table) {
    for (key, value) in overrides {
        match (base.get_mut(key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(over)) => merge_table(inner, over),
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

fn board_spec(raw: &RawBoard, base_dir: &Path) -> Result<ChipSpec, HwError> {
    let base = match &raw.spec_file {
        Some(file) => {
            let path = base_dir.join(file);
            ChipSpec::load(&path).map_err(|e| config_error(format!("board `{}`: {e}", raw.id)))?
        }
        None => ChipSpec::default(),
    };
    let Some(overrides) = &raw.spec else {
        return Ok(base);
    };
    let mut table = toml::Table::try_from(&base)
        .map_err(|e| config_error(format!("board `{}`: spec: {e}", raw.id)))?;
    merge_table(&mut table, overrides);
    let spec: ChipSpec = toml::Value::Table(table)
        .try_into()
        .map_err(|e| config_error(format!("board `{}`: spec override: {e}", raw.id)))?;
    spec.validate()
        .map_err(|e| config_error(format!("board `{}`: {e}", raw.id)))?;
    Ok(spec)
}

fn board_slices(
    raw: &RawBoard,
    backend: BackendKind,
    spec: &ChipSpec,
) -> Result<Vec<Slice>, HwError> {
    let id = &raw.id;
    let check_cores = |cluster: u32, cores: u32| -> Result<(), HwError> {
        if cores == 0 || cores > spec.cores_per_cluster {
            return Err(config_error(format!(
                "board `{id}`: cluster {cluster}: cores = {cores} is out of range 1..={} (spec.cores_per_cluster)",
                spec.cores_per_cluster
            )));
        }
        Ok(())
    };
    match (&raw.slicing, &raw.slices) {
        (Some(_), Some(_)) => Err(config_error(format!(
            "board `{id}`: give either `slicing` or `slices`, not both"
        ))),
        (None, Some(list)) => {
            if list.is_empty() {
                return Err(config_error(format!("board `{id}`: `slices` is empty")));
            }
            if raw.cores.is_some() {
                return Err(config_error(format!(
                    "board `{id}`: `cores` belongs to `slicing = \"per-cluster\"`; with `slices` give cores per slice"
                )));
            }
            let mut seen = BTreeSet::new();
            let mut slices = Vec::with_capacity(list.len());
            for item in list {
                if item.cluster >= spec.clusters {
                    return Err(config_error(format!(
                        "board `{id}`: cluster {} is out of range 0..{} (spec.clusters)",
                        item.cluster, spec.clusters
                    )));
                }
                if !seen.insert(item.cluster) {
                    return Err(config_error(format!(
                        "board `{id}`: cluster {} is listed twice in `slices`",
                        item.cluster
                    )));
                }
                let cores = item.cores.unwrap_or(spec.cores_per_cluster);
                check_cores(item.cluster, cores)?;
                slices.push(Slice {
                    board: id.clone(),
                    cluster: Some(item.cluster),
                    cores,
                    backend,
                });
            }
            Ok(slices)
        }
        (slicing, None) => match slicing.as_deref().unwrap_or("whole") {
            "whole" => {
                if raw.cores.is_some() {
                    return Err(config_error(format!(
                        "board `{id}`: `cores` only applies to `slicing = \"per-cluster\"`"
                    )));
                }
                Ok(vec![Slice {
                    board: id.clone(),
                    cluster: None,
                    cores: spec.clusters * spec.cores_per_cluster,
                    backend,
                }])
            }
            "per-cluster" => {
                let cores = raw.cores.unwrap_or(spec.cores_per_cluster);
                (0..spec.clusters)
                    .map(|cluster| {
                        check_cores(cluster, cores)?;
                        Ok(Slice {
                            board: id.clone(),
                            cluster: Some(cluster),
                            cores,
                            backend,
                        })
                    })
                    .collect()
            }
            other => Err(config_error(format!(
                "board `{id}`: unknown slicing `{other}` (expected \"whole\" or \"per-cluster\")"
            ))),
        },
    }
}

/// Fault rates per slice id: the slice's own table, else the board's.
fn board_faults(
    raw: &RawBoard,
    backend: BackendKind,
    slices: &[Slice],
) -> Result<BTreeMap<String, FaultConfig>, HwError> {
    let id = &raw.id;
    let listed = raw.slices.as_deref().unwrap_or_default();
    let any = raw.faults.is_some() || listed.iter().any(|s| s.faults.is_some());
    if any && backend != BackendKind::Emulator {
        return Err(config_error(format!(
            "board `{id}`: `faults` is only supported on emulator boards (backend is {backend})"
        )));
    }
    let board_level = raw
        .faults
        .as_ref()
        .map(|value| FaultConfig::from_toml(value, &format!("board `{id}`")))
        .transpose()
        .map_err(|e| config_error(e.to_string()))?;
    let mut faults = BTreeMap::new();
    for slice in slices {
        let own = listed
            .iter()
            .find(|item| Some(item.cluster) == slice.cluster)
            .and_then(|item| item.faults.as_ref());
        let config = match own {
            Some(value) => Some(
                FaultConfig::from_toml(
                    value,
                    &format!("board `{id}`, slice cluster {}", slice.cluster.unwrap_or(0)),
                )
                .map_err(|e| config_error(e.to_string()))?,
            ),
            None => board_level,
        };
        if let Some(config) = config.filter(|c| !c.is_off()) {
            faults.insert(slice.id(), config);
        }
    }
    Ok(faults)
}

impl Fleet {
    /// Load and validate a fleet file; `spec_file` paths are relative to it.
    pub fn load(path: &Path) -> Result<Self, HwError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| config_error(format!("{}: {e}", path.display())))?;
        let base_dir = path.parent().unwrap_or(Path::new("."));
        Self::from_toml_str(&text, base_dir).map_err(|e| match e {
            HwError::Config(msg) => HwError::Config(format!("{} ({})", msg, path.display())),
            other => other,
        })
    }

    /// Parse and validate fleet TOML; `base_dir` anchors relative spec files.
    pub fn from_toml_str(text: &str, base_dir: &Path) -> Result<Self, HwError> {
        let raw: RawFleet = toml::from_str(text).map_err(|e| config_error(e.to_string()))?;
        if raw.board.is_empty() {
            return Err(config_error("no [[board]] entries".into()));
        }
        let mut ids = HashSet::new();
        let mut boards = Vec::with_capacity(raw.board.len());
        for rb in &raw.board {
            if rb.id.trim().is_empty() {
                return Err(config_error("a board has an empty `id`".into()));
            }
            if rb.id.contains('/') || rb.id.contains(',') || rb.id.chars().any(char::is_whitespace)
            {
                return Err(config_error(format!(
                    "board id `{}` may not contain '/', ',' or whitespace",
                    rb.id
                )));
            }
            if !ids.insert(rb.id.clone()) {
                return Err(config_error(format!("duplicate board id `{}`", rb.id)));
            }
            let backend = parse_backend(&rb.backend)
                .map_err(|e| config_error(format!("board `{}`: {e}", rb.id)))?;
            let spec = board_spec(rb, base_dir)?;
            let slices = board_slices(rb, backend, &spec)?;
            let faults = board_faults(rb, backend, &slices)?;
            let simulated = simulated::RawSimulated {
                run_ms: rb.run_ms.as_ref(),
                incorrect_fraction: rb.incorrect_fraction.as_ref(),
                noise: rb.noise.as_ref(),
            }
            .settings(&rb.id, backend == BackendKind::Simulated)?;
            boards.push(FleetBoard {
                id: rb.id.clone(),
                backend,
                spec,
                host: rb.host.clone(),
                launch_prefix: rb.launch_prefix.clone(),
                sdk_root: rb.sdk_root.clone(),
                slices,
                faults,
                simulated,
            });
        }
        Ok(Self { boards })
    }

    /// Every slice of every board, in file order.
    pub fn slices(&self) -> Vec<Slice> {
        self.boards
            .iter()
            .flat_map(|b| b.slices.iter().cloned())
            .collect()
    }

    /// Slices matching a selector.
    pub fn select(&self, selector: &SliceSelector) -> Vec<Slice> {
        self.slices()
            .into_iter()
            .filter(|s| selector.matches(s))
            .collect()
    }

    /// The board with this id, if the fleet has it.
    pub fn board(&self, id: &str) -> Option<&FleetBoard> {
        self.boards.iter().find(|b| b.id == id)
    }

    /// The board a slice belongs to (for its spec, host and launch prefix).
    pub fn board_of(&self, slice: &Slice) -> Option<&FleetBoard> {
        self.board(&slice.board)
    }
}
