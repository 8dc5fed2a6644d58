//! board_info: what the slice is and what the session has built on it.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_hw::measure::exact_timing;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::{ToolEnv, parse_args};
use crate::normalize::Shape;

use super::{ARTIFACTS_SHOWN, CANDIDATES_SHOWN};

/// Arguments of board_info (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BoardInfoArgs {}

/// The slice, its chip and its lock statistics.
pub struct BoardInfo(pub(crate) Arc<ToolEnv>);

/// What `board_info` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "board_info",
    "Describe this session's slice: backend, cores, chip spec (peak, memory sizes, bandwidth), slice lock statistics, compiled artifacts and best candidates.",
    schema_of::<BoardInfoArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for BoardInfo {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &Shape::NONE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let _args: BoardInfoArgs = parse_args(args)?;
        let slice = self.0.board.slice().clone();
        let spec = &self.0.spec;
        let lock = self.0.lock.stats(&slice.id());
        let (artifacts, artifacts_total, candidates): (Vec<String>, usize, Vec<Value>) = {
            let session = self.0.session();
            (
                newest_artifacts(session.artifacts.keys(), ARTIFACTS_SHOWN),
                session.artifacts.len(),
                session
                    .candidates
                    .iter()
                    .take(CANDIDATES_SHOWN)
                    .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
                    .collect(),
            )
        };
        let peak = spec.peak_flops(slice.cores);
        let mut text = format!(
            "slice {} ({} backend, {} cores): {} at {:.2} GHz, peak {:.1} GFLOPS for these cores; per core AM {} KiB (max {} buffers), SM {} KiB (max {} buffers); GSM {} KiB per cluster; DDR bandwidth {:.1} GB/s per cluster",
            slice.id(),
            slice.backend,
            slice.cores,
            spec.name,
            spec.clock_hz / 1e9,
            peak / 1e9,
            spec.am_bytes / 1024,
            spec.am_max_buffers,
            spec.sm_bytes / 1024,
            spec.sm_max_buffers,
            spec.gsm_bytes / 1024,
            spec.cluster_bandwidth() / 1e9,
        );
        // How a benchmark measures here: the search plans read this line.
        let exact = self
            .0
            .measure_defaults
            .exact
            .unwrap_or_else(|| exact_timing(slice.backend));
        text.push_str(if exact {
            "\nmeasurement: exact timing (one validated execution is the figure; spot re-runs check it)"
        } else {
            "\nmeasurement: timed (warm-up, repeated timed executions, statistics)"
        });
        match &lock {
            Some(s) => text.push_str(&format!(
                "\nslice lock: {} acquisitions, busy {:.3} s ({:.1}% utilization), mean wait {:.3} s, {} waiting",
                s.acquisitions,
                s.busy.as_secs_f64(),
                s.utilization() * 100.0,
                s.mean_wait().as_secs_f64(),
                s.waiting
            )),
            None => text.push_str("\nslice lock: not used yet"),
        }
        text.push_str(&match artifacts_total {
            0 => "\nartifacts: none".to_string(),
            n if n == artifacts.len() => format!("\nartifacts: {}", artifacts.join(", ")),
            n => format!(
                "\nartifacts: {n}, the {} newest: {} (older ones stay usable by id)",
                artifacts.len(),
                artifacts.join(", ")
            ),
        });
        Ok(ToolOutput::text(text).with_data(json!({
            "slice": slice,
            "slice_id": slice.id(),
            "spec": spec,
            "peak_gflops": peak / 1e9,
            "exact_timing": exact,
            "lock": lock,
            "artifacts": artifacts,
            "artifacts_total": artifacts_total,
            "candidates": candidates,
        })))
    }
}

/// The `limit` newest of build ids `b1`, `b2`, ... in build order (ids that
/// do not parse sort first, as the oldest).
pub(super) fn newest_artifacts<'a>(
    ids: impl Iterator<Item = &'a String>,
    limit: usize,
) -> Vec<String> {
    let mut ids: Vec<(u64, &String)> = ids
        .map(|id| {
            (
                id.strip_prefix('b')
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                id,
            )
        })
        .collect();
    ids.sort();
    let skip = ids.len().saturating_sub(limit);
    ids.into_iter()
        .skip(skip)
        .map(|(_, id)| id.clone())
        .collect()
}
