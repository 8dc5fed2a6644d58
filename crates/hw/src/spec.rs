//! The MT-3000 chip as numbers. Every figure the emulator, the estimator and
//! the tools use comes from a [`ChipSpec`], never from a literal in code, so a
//! site can correct a number (or model a sibling chip) with a TOML file.
//! Defaults follow the public sources collected in the project docs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::HwError;

/// The chip model. Field names are the TOML keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChipSpec {
    /// Chip name, shown to the model (its prompt and the board-info tool).
    pub name: String,
    /// ARMv8 host cores (the CPU zone).
    pub host_cores: u32,
    /// DSP clusters per chip (ids `0..clusters`).
    pub clusters: u32,
    /// DSP cores per cluster: the most cores a cluster slice can have.
    pub cores_per_cluster: u32,
    /// Vector processing elements (FP64 lanes) per core.
    pub vector_lanes: u32,
    /// FMA units per lane.
    pub fma_per_lane: u32,
    /// 64-bit vector registers per lane, told to the model and usable in
    /// `tune.toml` constraints.
    pub vector_registers: u32,
    /// Scalar VLIW issue slots: the emulator charges a basic block its scalar
    /// instructions over these.
    pub scalar_issue_slots: u32,
    /// Vector VLIW issue slots: `fma_per_lane` for FMAs,
    /// `model.vector_mem_slots` for loads and stores, the rest for broadcasts
    /// and shuffles.
    pub vector_issue_slots: u32,
    /// DSP clock, Hz: turns modeled cycles into seconds.
    pub clock_hz: f64,
    /// Scalar memory per core, bytes.
    pub sm_bytes: u64,
    /// Most `scalar_malloc` buffers a core may hold at once.
    pub sm_max_buffers: u32,
    /// Array (vector) memory per core, bytes.
    pub am_bytes: u64,
    /// Most `vector_malloc` buffers a core may hold at once.
    pub am_max_buffers: u32,
    /// Global shared memory per cluster, bytes.
    pub gsm_bytes: u64,
    /// DDR per cluster, bytes.
    pub ddr_bytes_per_cluster: u64,
    /// Main-memory bandwidth of the whole chip, bytes/s; a cluster gets
    /// `ddr_bandwidth / clusters`, shared by the cores that use it.
    pub ddr_bandwidth: f64,
    /// Fixed cost of starting one DMA transfer, cycles.
    pub dma_startup_cycles: u64,
    /// Instruction latencies, as told to the model.
    pub latency: Latencies,
    /// Costs the emulator's cycle model needs beyond the published numbers.
    pub model: CostModel,
}

/// Instruction latencies in cycles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Latencies {
    /// `SLDW`: scalar load.
    pub sldw: u32,
    /// `SVBCAST`: broadcast of a scalar into a vector.
    pub svbcast: u32,
    /// `VFMULAD`: vector fused multiply-add.
    pub vfmulad: u32,
    /// `VLDDW`: vector load.
    pub vlddw: u32,
    /// `VSTDW`: vector store.
    pub vstdw: u32,
    /// Cost of reading the cycle counter (`get_clk`).
    pub get_clk: u32,
}

impl Default for Latencies {
    fn default() -> Self {
        Self {
            sldw: 7,
            svbcast: 4,
            vfmulad: 6,
            vlddw: 9,
            vstdw: 4,
            get_clk: 21,
        }
    }
}

impl Default for ChipSpec {
    fn default() -> Self {
        Self {
            name: "MT-3000".into(),
            host_cores: 16,
            clusters: 4,
            cores_per_cluster: 24,
            vector_lanes: 16,
            fma_per_lane: 3,
            vector_registers: 64,
            scalar_issue_slots: 5,
            vector_issue_slots: 6,
            clock_hz: 1.2e9,
            sm_bytes: 64 * 1024,
            sm_max_buffers: 32,
            am_bytes: 768 * 1024,
            am_max_buffers: 64,
            gsm_bytes: 6 * 1024 * 1024,
            ddr_bytes_per_cluster: 13 * 1024 * 1024 * 1024,
            ddr_bandwidth: 120e9,
            dma_startup_cycles: 64,
            latency: Latencies::default(),
            model: CostModel::default(),
        }
    }
}

impl ChipSpec {
    /// Load a spec from TOML; missing keys keep their defaults, unknown keys
    /// are an error (a typo must not silently fall back to a default).
    pub fn from_toml_str(text: &str) -> Result<Self, HwError> {
        let spec: Self =
            toml::from_str(text).map_err(|e| HwError::Config(format!("chip spec: {e}")))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Load a spec from a TOML file (see [`ChipSpec::from_toml_str`]).
    pub fn load(path: &Path) -> Result<Self, HwError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| HwError::Config(format!("chip spec {}: {e}", path.display())))?;
        Self::from_toml_str(&text)
    }

    /// Reject specs that would make the models divide by zero or lie.
    pub fn validate(&self) -> Result<(), HwError> {
        let positive = [
            ("clusters", self.clusters as f64),
            ("cores_per_cluster", self.cores_per_cluster as f64),
            ("vector_lanes", self.vector_lanes as f64),
            ("fma_per_lane", self.fma_per_lane as f64),
            ("clock_hz", self.clock_hz),
            ("ddr_bandwidth", self.ddr_bandwidth),
            ("am_bytes", self.am_bytes as f64),
            ("sm_bytes", self.sm_bytes as f64),
            ("gsm_bytes", self.gsm_bytes as f64),
        ];
        for (name, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(HwError::Config(format!(
                    "chip spec: {name} must be positive, got {value}"
                )));
            }
        }
        Ok(())
    }

    /// FP64 flops per cycle of one core: lanes x FMA units x 2.
    pub fn flops_per_cycle_per_core(&self) -> f64 {
        f64::from(self.vector_lanes) * f64::from(self.fma_per_lane) * 2.0
    }

    /// Modeled FP64 peak of `cores` cores, flop/s.
    pub fn peak_flops(&self, cores: u32) -> f64 {
        self.flops_per_cycle_per_core() * f64::from(cores) * self.clock_hz
    }

    /// DDR bandwidth available to one cluster, bytes/s.
    pub fn cluster_bandwidth(&self) -> f64 {
        self.ddr_bandwidth / f64::from(self.clusters)
    }
}

/// Cycle-model costs of the emulator that no public source states directly;
/// estimates, kept here so a site can calibrate them with a TOML file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Vector load/store units per core (vector issue slots not taken by the
    /// FMA units; the remaining slot issues broadcasts and shuffles).
    pub vector_mem_slots: u32,
    /// Cycles charged for one executed basic block of scalar code (the VLIW
    /// packs a short block into about one bundle).
    pub scalar_block_cycles: f64,
    /// Cost of a barrier once the slowest participant arrives, cycles.
    pub barrier_cycles: u64,
    /// GSM bandwidth of one cluster, bytes/s, shared by the cores using it.
    pub gsm_bandwidth: f64,
    /// Stall of one direct (non-DMA) load or store to DDR, cycles; its bytes
    /// also take the core's DDR bandwidth share. Not published: an assumed
    /// uncached round trip.
    pub ddr_latency_cycles: f64,
    /// Stall of one direct load or store to GSM, cycles (assumed).
    pub gsm_latency_cycles: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            vector_mem_slots: 2,
            scalar_block_cycles: 1.0,
            barrier_cycles: 100,
            gsm_bandwidth: 153.6e9,
            ddr_latency_cycles: 100.0,
            gsm_latency_cycles: 20.0,
        }
    }
}
