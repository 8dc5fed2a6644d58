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
//! backend = "emulator"          # emulator | sdk | host
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
//! ```
//!
//! Rules (checked by [`Fleet::from_toml_str`], errors name the board):
//! board ids are unique and non-empty; the backend is one of the three; a
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
//! This module says what exists; how a slice's backend is opened
//! (`Fleet::open`) is in [`crate::backends`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::HwError;
use crate::board::{BackendKind, Slice};
use crate::faults::FaultConfig;
use crate::spec::ChipSpec;

/// One board of the fleet, validated, with its slices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetBoard {
    pub id: String,
    pub backend: BackendKind,
    pub spec: ChipSpec,
    /// Host the board is attached to (for `sdk` launch prefixes).
    pub host: Option<String>,
    /// Argument vector put in front of the harness when launching (`sdk`).
    pub launch_prefix: Vec<String>,
    /// Root of the MT-3000 toolchain installation (`sdk`).
    pub sdk_root: Option<PathBuf>,
    pub slices: Vec<Slice>,
    /// Fault injection per slice id (`board0/c1`); slices without faults
    /// are absent.
    pub faults: BTreeMap<String, FaultConfig>,
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
    HwError::Config(format!("fleet: {msg}"))
}

/// A backend name that is none of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (expected emulator, sdk or host)")]
pub struct UnknownBackend(pub String);

/// Parse a backend name the way the fleet file and selectors spell it.
pub fn parse_backend(name: &str) -> Result<BackendKind, UnknownBackend> {
    match name.trim() {
        "emulator" => Ok(BackendKind::Emulator),
        "sdk" => Ok(BackendKind::Sdk),
        "host" => Ok(BackendKind::Host),
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
            boards.push(FleetBoard {
                id: rb.id.clone(),
                backend,
                spec,
                host: rb.host.clone(),
                launch_prefix: rb.launch_prefix.clone(),
                sdk_root: rb.sdk_root.clone(),
                slices,
                faults,
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

    pub fn board(&self, id: &str) -> Option<&FleetBoard> {
        self.boards.iter().find(|b| b.id == id)
    }

    /// The board a slice belongs to (for its spec, host and launch prefix).
    pub fn board_of(&self, slice: &Slice) -> Option<&FleetBoard> {
        self.board(&slice.board)
    }
}

/// Why a selector string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("slice selector `{input}`: {reason}")]
pub struct SelectorError {
    pub input: String,
    pub reason: String,
}

/// A comparison operator of a selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorOp {
    Eq,
    Ne,
    Ge,
    Le,
    Gt,
    Lt,
}

impl SelectorOp {
    fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Ge => ">=",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Lt => "<",
        }
    }

    fn compare(self, left: u32, right: u32) -> bool {
        match self {
            Self::Eq => left == right,
            Self::Ne => left != right,
            Self::Ge => left >= right,
            Self::Le => left <= right,
            Self::Gt => left > right,
            Self::Lt => left < right,
        }
    }
}

/// One `key op value` condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectorTerm {
    Backend {
        op: SelectorOp,
        backend: BackendKind,
    },
    /// `board=` / `id=` take a pattern where `*` matches any run of characters.
    Board {
        op: SelectorOp,
        pattern: String,
    },
    Id {
        op: SelectorOp,
        pattern: String,
    },
    /// `cluster=whole` matches whole-board slices.
    Cluster {
        op: SelectorOp,
        cluster: Option<u32>,
    },
    Cores {
        op: SelectorOp,
        cores: u32,
    },
}

/// Picks slices: `*` (all) or comma-separated terms that must all hold, e.g.
/// `backend=emulator,cores>=8,board=board0`. Keys: `backend`, `board`,
/// `id` (the slice id, `board0/c1`), `cluster` (a number or `whole`),
/// `cores`. Operators: `=`, `!=`, and for `cluster`/`cores` also `>=`, `<=`,
/// `>`, `<`. `board`/`id` values may use `*` wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SliceSelector {
    terms: Vec<SelectorTerm>,
}

fn wildcard_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            let Some(r) = rest.strip_prefix(part) else {
                return false;
            };
            rest = r;
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
}

impl SliceSelector {
    /// The selector that matches every slice.
    pub fn all() -> Self {
        Self { terms: Vec::new() }
    }

    pub fn terms(&self) -> &[SelectorTerm] {
        &self.terms
    }

    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let fail = |reason: String| SelectorError {
            input: input.to_owned(),
            reason,
        };
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Err(fail("empty selector (use `*` for every slice)".into()));
        }
        if trimmed == "*" {
            return Ok(Self::all());
        }
        let mut terms = Vec::new();
        for raw_term in trimmed.split(',') {
            let term = raw_term.trim();
            if term.is_empty() {
                return Err(fail(
                    "empty term (two commas in a row or a trailing comma)".into(),
                ));
            }
            let Some(op_start) = term.find(['=', '!', '<', '>']) else {
                return Err(fail(format!(
                    "term `{term}` has no operator (expected key=value, key!=value, key>=n, ...)"
                )));
            };
            let key = term[..op_start].trim();
            let after = &term[op_start..];
            let (op, value) = [
                ("!=", SelectorOp::Ne),
                (">=", SelectorOp::Ge),
                ("<=", SelectorOp::Le),
                ("=", SelectorOp::Eq),
                (">", SelectorOp::Gt),
                ("<", SelectorOp::Lt),
            ]
            .iter()
            .find_map(|(sym, op)| after.strip_prefix(sym).map(|v| (*op, v.trim())))
            .ok_or_else(|| fail(format!("term `{term}`: unknown operator")))?;
            if value.is_empty() {
                return Err(fail(format!("term `{term}` has no value")));
            }
            if value.contains(['=', '<', '>', '!']) {
                return Err(fail(format!(
                    "term `{term}`: unexpected operator in the value"
                )));
            }
            let equality_only = |what: &str| -> Result<(), SelectorError> {
                if matches!(op, SelectorOp::Eq | SelectorOp::Ne) {
                    Ok(())
                } else {
                    Err(fail(format!(
                        "term `{term}`: `{what}` supports only = and != (got {})",
                        op.symbol()
                    )))
                }
            };
            let number = |what: &str| -> Result<u32, SelectorError> {
                value.parse::<u32>().map_err(|_| {
                    fail(format!(
                        "term `{term}`: `{what}` needs a non-negative integer, got `{value}`"
                    ))
                })
            };
            let parsed = match key {
                "backend" => {
                    equality_only("backend")?;
                    let backend =
                        parse_backend(value).map_err(|e| fail(format!("term `{term}`: {e}")))?;
                    SelectorTerm::Backend { op, backend }
                }
                "board" => {
                    equality_only("board")?;
                    SelectorTerm::Board {
                        op,
                        pattern: value.to_owned(),
                    }
                }
                "id" | "slice" => {
                    equality_only("id")?;
                    SelectorTerm::Id {
                        op,
                        pattern: value.to_owned(),
                    }
                }
                "cluster" => {
                    if value == "whole" {
                        equality_only("cluster=whole")?;
                        SelectorTerm::Cluster { op, cluster: None }
                    } else {
                        SelectorTerm::Cluster {
                            op,
                            cluster: Some(number("cluster")?),
                        }
                    }
                }
                "cores" => SelectorTerm::Cores {
                    op,
                    cores: number("cores")?,
                },
                "" => return Err(fail(format!("term `{term}` has no key"))),
                other => {
                    return Err(fail(format!(
                        "unknown key `{other}` (expected backend, board, id, cluster or cores)"
                    )));
                }
            };
            terms.push(parsed);
        }
        Ok(Self { terms })
    }

    /// True when every term holds for `slice`.
    pub fn matches(&self, slice: &Slice) -> bool {
        self.terms.iter().all(|term| match term {
            SelectorTerm::Backend { op, backend } => {
                (slice.backend == *backend) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Board { op, pattern } => {
                wildcard_match(pattern, &slice.board) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Id { op, pattern } => {
                wildcard_match(pattern, &slice.id()) == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Cluster { op, cluster: None } => {
                slice.cluster.is_none() == (*op == SelectorOp::Eq)
            }
            SelectorTerm::Cluster {
                op,
                cluster: Some(want),
            } => match slice.cluster {
                Some(have) => op.compare(have, *want),
                // A whole board is "not cluster n", and has no order.
                None => *op == SelectorOp::Ne,
            },
            SelectorTerm::Cores { op, cores } => op.compare(slice.cores, *cores),
        })
    }
}

impl fmt::Display for SliceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("*");
        }
        let parts: Vec<String> = self
            .terms
            .iter()
            .map(|t| match t {
                SelectorTerm::Backend { op, backend } => format!("backend{}{backend}", op.symbol()),
                SelectorTerm::Board { op, pattern } => format!("board{}{pattern}", op.symbol()),
                SelectorTerm::Id { op, pattern } => format!("id{}{pattern}", op.symbol()),
                SelectorTerm::Cluster { op, cluster: None } => {
                    format!("cluster{}whole", op.symbol())
                }
                SelectorTerm::Cluster {
                    op,
                    cluster: Some(c),
                } => format!("cluster{}{c}", op.symbol()),
                SelectorTerm::Cores { op, cores } => format!("cores{}{cores}", op.symbol()),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl FromStr for SliceSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for SliceSelector {
    type Error = SelectorError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl From<SliceSelector> for String {
    fn from(s: SliceSelector) -> Self {
        s.to_string()
    }
}
