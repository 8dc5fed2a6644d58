//! estimate: the roofline bound of a kernel on the session's slice, from the
//! chip spec alone. Lets a tuner order candidates and know when to stop
//! (a kernel at 90 % of its bound has little left), and tells whether the
//! kernel is compute- or memory-bound, which is what the optimization should
//! go after (recorded as the working state's `optimization_mode`).
//!
//! The work and traffic come from the caller (`flops`, `bytes`) or, for a
//! kernel whose `tune.toml` has a `[model]` table, from `kernel_dir` and the
//! build's `defines`: that lets a tuner rank every configuration of a space
//! by its bound without knowing the kernel's formulas.

use std::sync::Arc;

use mtswarm_core::{
    Effect, EffectKind, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of,
};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

/// Arguments of estimate.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EstimateArgs {
    /// Floating-point operations of one execution (e.g. 2*M*N*K for GEMM);
    /// default: from the kernel's tune.toml `[model]`.
    #[serde(default)]
    pub flops: Option<f64>,
    /// Bytes moved between DDR and the chip in one execution; default: from
    /// the kernel's tune.toml `[model]`.
    #[serde(default)]
    pub bytes: Option<f64>,
    /// Kernel directory (relative to the workspace) whose tune.toml
    /// `[model]` gives flops and bytes for `defines`.
    #[serde(default)]
    pub kernel_dir: Option<String>,
    /// `-D` values of the configuration to estimate (with `kernel_dir`).
    #[serde(default)]
    pub defines: Option<std::collections::BTreeMap<String, String>>,
    /// DSP cores (default: all cores of the slice).
    #[serde(default)]
    pub cores: Option<u32>,
    /// A measured time to compare with the bound, seconds.
    #[serde(default)]
    pub measured_seconds: Option<f64>,
}

const ESTIMATE_SHAPE: Shape = Shape {
    integers: &["cores"],
    numbers: &["flops", "bytes", "measured_seconds"],
    maps: &["defines"],
    aliases: &[
        ("dir", "kernel_dir"),
        ("params", "defines"),
        ("flop", "flops"),
        ("bytes_moved", "bytes"),
        ("seconds", "measured_seconds"),
    ],
    ..Shape::NONE
};

/// A roofline bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Roofline {
    /// DSP cores the bound is for.
    pub cores: u32,
    /// Modeled peak of those cores, GFLOPS.
    pub peak_gflops: f64,
    /// DDR bandwidth of the clusters they span, GB/s.
    pub bandwidth_gbs: f64,
    /// flops per byte.
    pub arithmetic_intensity: f64,
    /// Intensity above which the kernel is compute-bound.
    pub ridge_point: f64,
    /// Time the flops take at peak.
    pub compute_seconds: f64,
    /// Time the bytes take at full bandwidth.
    pub memory_seconds: f64,
    /// The larger of the two: no run can be faster.
    pub bound_seconds: f64,
    /// GFLOPS at `bound_seconds` (0 when that is 0).
    pub bound_gflops: f64,
    /// `compute-bound` or `memory-bound`.
    pub bound_by: String,
    /// `bound_seconds` over the measured time (1 = at the bound); `None`
    /// without a positive measured time.
    pub fraction_of_bound: Option<f64>,
}

/// The roofline bound of `flops`/`bytes` on `cores` cores. A cluster slice
/// gets its cluster's share of the DDR bandwidth; more cores than one
/// cluster has span clusters and get their shares.
pub fn roofline(
    spec: &ChipSpec,
    flops: f64,
    bytes: f64,
    cores: u32,
    measured: Option<f64>,
) -> Roofline {
    let peak = spec.peak_flops(cores);
    let clusters_used = cores
        .div_ceil(spec.cores_per_cluster.max(1))
        .clamp(1, spec.clusters.max(1));
    let bandwidth = spec.cluster_bandwidth() * f64::from(clusters_used);
    let compute_seconds = flops / peak;
    let memory_seconds = bytes / bandwidth;
    let bound_seconds = compute_seconds.max(memory_seconds);
    let bound_by = if compute_seconds >= memory_seconds {
        "compute-bound"
    } else {
        "memory-bound"
    };
    Roofline {
        cores,
        peak_gflops: peak / 1e9,
        bandwidth_gbs: bandwidth / 1e9,
        arithmetic_intensity: if bytes > 0.0 {
            flops / bytes
        } else {
            f64::INFINITY
        },
        ridge_point: peak / bandwidth,
        compute_seconds,
        memory_seconds,
        bound_seconds,
        bound_gflops: if bound_seconds > 0.0 {
            flops / bound_seconds / 1e9
        } else {
            0.0
        },
        bound_by: bound_by.into(),
        fraction_of_bound: measured.filter(|m| *m > 0.0).map(|m| bound_seconds / m),
    }
}

/// Roofline estimate from the chip spec.
pub struct Estimate(pub(crate) Arc<ToolEnv>);

impl Estimate {
    /// Flops and bytes of `defines` from `<kernel_dir>/tune.toml`'s `[model]`.
    fn model_figures(
        &self,
        kernel_dir: &str,
        defines: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<(f64, f64), ToolError> {
        let dir = self.0.workspace.resolve(kernel_dir)?;
        let space = TuneSpace::load(&dir).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let empty = std::collections::BTreeMap::new();
        space
            .model_figures(defines.unwrap_or(&empty), &self.0.spec)
            .map_err(|e| ToolError::InvalidArgs(e.to_string()))?
            .ok_or_else(|| {
                ToolError::InvalidArgs(format!(
                    "{kernel_dir}/tune.toml has no [model] table: give flops and bytes"
                ))
            })
    }
}

/// What `estimate` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "estimate",
    "Roofline bound of a kernel on this slice from the MT-3000 spec: give flops and DDR bytes per execution, or kernel_dir and the configuration's defines when its tune.toml has a [model] table; returns the bound in seconds and GFLOPS and whether it is compute- or memory-bound.",
    schema_of::<EstimateArgs>,
)
.concurrent()
.effects(&[EffectKind::State]);

#[async_trait::async_trait]
impl Tool for Estimate {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &ESTIMATE_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: EstimateArgs = parse_args(args)?;
        // Without flops and bytes, the figures come from the tune.toml of
        // the kernel directory given, else of the workspace's only one.
        let modeled = match args.flops.zip(args.bytes) {
            Some(_) => None,
            None => match self.0.kernel_dir_or_only(args.kernel_dir.as_deref()) {
                Ok(dir) => Some(self.model_figures(&dir, args.defines.as_ref())?),
                Err(_) if args.kernel_dir.is_none() => None,
                Err(error) => return Err(error),
            },
        };
        let (flops, bytes) = match (modeled, args.flops, args.bytes) {
            (Some((f, b)), flops, bytes) => (flops.unwrap_or(f), bytes.unwrap_or(b)),
            (None, Some(f), Some(b)) => (f, b),
            (None, _, _) => {
                return Err(ToolError::InvalidArgs(format!(
                    "give flops and bytes, or kernel_dir (whose tune.toml has a [model] table) and defines; {}",
                    self.0.kernel_dirs_hint()
                )));
            }
        };
        if !(flops.is_finite() && flops > 0.0) {
            return Err(ToolError::InvalidArgs(format!(
                "flops must be positive, got {flops}"
            )));
        }
        if !(bytes.is_finite() && bytes >= 0.0) {
            return Err(ToolError::InvalidArgs(format!(
                "bytes must be >= 0, got {bytes}"
            )));
        }
        let slice_cores = self.0.board.slice().cores;
        let cores = args.cores.unwrap_or(slice_cores);
        if cores == 0 || cores > slice_cores {
            return Err(ToolError::InvalidArgs(format!(
                "cores must be in 1..={slice_cores} (the slice's cores), got {cores}"
            )));
        }
        let r = roofline(&self.0.spec, flops, bytes, cores, args.measured_seconds);
        let mut text = format!(
            "{} on {} cores: bound {:.3e} s = {:.1} GFLOPS (peak {:.1} GFLOPS, {:.1} GB/s; intensity {:.2} flop/B vs ridge {:.2})",
            r.bound_by,
            r.cores,
            r.bound_seconds,
            r.bound_gflops,
            r.peak_gflops,
            r.bandwidth_gbs,
            r.arithmetic_intensity,
            r.ridge_point
        );
        if let Some(f) = r.fraction_of_bound {
            text.push_str(&format!(
                "; measured time reaches {:.1}% of the bound",
                f * 100.0
            ));
        }
        Ok(ToolOutput::text(text)
            .with_data(serde_json::to_value(&r).unwrap_or(Value::Null))
            .with_effect(Effect::State {
                key: "optimization_mode".into(),
                value: json!(r.bound_by),
                append: false,
            }))
    }
}
