//! `list_fleet`: the slices matching a selector with their state.
//!
//! With `compact: true` it answers only the ids of the free slices (at most
//! `limit` of them) and the counts: a fleet of a thousand slices listed in
//! full is far more than a tool result the model is shown (the leader cuts
//! each at 16,000 characters), and the free ids are what spawning needs.

use std::sync::Arc;

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, given, output, parse_args};
use crate::fleet::{parse_selector, state_name};

pub(super) struct ListFleet(pub(super) Arc<ToolEnv>);

/// Free slice ids a compact listing gives when the call sets no `limit`:
/// a thousand ids of a dozen characters fit one tool result as shown.
pub(crate) const DEFAULT_COMPACT_LIMIT: usize = 1024;

/// Arguments of `list_fleet`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListFleetArgs {
    /// slice selector, e.g. backend=emulator,cores>=8; empty = the job's selector
    #[serde(default)]
    selector: Option<String>,
    /// answer only the free slice ids (free_slices) and the counts, for large fleets
    #[serde(default)]
    compact: Option<bool>,
    /// with compact: list at most this many free slice ids (default 1024)
    #[serde(default)]
    #[schemars(range(min = 1))]
    limit: Option<u64>,
}

/// What `list_fleet` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "list_fleet",
    "List the slices of the fleet that match a selector (default: the job's), with their state (free, leased, quarantined) and the worker that owns each.",
    schema_of::<ListFleetArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for ListFleet {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ListFleetArgs = parse_args(args)?;
        let job = &self.0.job;
        let selector_text = given(args.selector).unwrap_or_else(|| job.spec.slice_selector.clone());
        let selector =
            parse_selector(&selector_text).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let placement = self.0.placement();
        let view = placement
            .fleet_view(selector.as_ref())
            .await
            .map_err(|e| ToolError::Failed(format!("cannot read the fleet: {e}")))?;
        let draining: Vec<&str> = view
            .workers
            .iter()
            .filter(|w| w.draining)
            .map(|w| w.worker_id.as_str())
            .collect();
        let compact = args.compact == Some(true);
        let limit = match args.limit {
            None => DEFAULT_COMPACT_LIMIT,
            Some(0) => {
                return Err(ToolError::InvalidArgs(
                    "limit must be a whole number of slices >= 1, got 0".into(),
                ));
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let mut free = 0;
        let mut free_slices: Vec<String> = Vec::new();
        let slices: Vec<Value> = view
            .slices
            .iter()
            .map(|s| {
                let d = s.slice.clone().unwrap_or_default();
                let mut state = state_name(s.state());
                if state == "free" && draining.contains(&s.worker_id.as_str()) {
                    state = "draining";
                }
                if state == "free" && placement.claims.is_claimed(&d.slice_id) {
                    state = "leased";
                }
                if state == "free" {
                    free += 1;
                    if free_slices.len() < limit {
                        free_slices.push(d.slice_id.clone());
                    }
                }
                let mut entry = json!({
                    "slice_id": d.slice_id, "worker_id": s.worker_id, "board": d.board,
                    "cluster": d.cluster, "cores": d.cores, "backend": d.backend, "state": state,
                });
                if let Some(lease) = &s.lease {
                    entry["session_id"] = json!(lease.session_id);
                }
                entry
            })
            .collect();
        if compact {
            return Ok(output(json!({
                "selector": selector_text,
                "free": free,
                "free_slices": free_slices,
                "slices_total": slices.len(),
                "workers": view.workers.len(),
            })));
        }
        Ok(output(json!({
            "selector": selector_text,
            "slices": slices,
            "free": free,
            "workers": view.workers.len(),
        })))
    }
}
