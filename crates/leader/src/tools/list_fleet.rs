//! `list_fleet`: the slices matching a selector with their state.

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{ToolEnv, output, text_arg};
use crate::fleet::{parse_selector, state_name};
use crate::placement::fleet_view;

pub(super) struct ListFleet(pub(super) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for ListFleet {
    tool_meta!(
        "list_fleet",
        "List the slices of the fleet that match a selector (default: the job's), with their state (free, leased, quarantined) and the worker that owns each.",
        Risk::Low,
        true,
        true
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "selector":{"type":"string","description":"slice selector, e.g. backend=emulator,cores>=8; empty = the job's selector"}
        },"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0.job;
        let selector_text =
            text_arg(&args, "selector").unwrap_or_else(|| job.spec.slice_selector.clone());
        let selector =
            parse_selector(&selector_text).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let shared = &self.0.shared;
        let view = fleet_view(shared, selector.as_ref())
            .await
            .map_err(|e| ToolError::Failed(format!("cannot read the fleet: {e}")))?;
        let draining: Vec<&str> = view
            .workers
            .iter()
            .filter(|w| w.draining)
            .map(|w| w.worker_id.as_str())
            .collect();
        let mut free = 0;
        let slices: Vec<Value> = view
            .slices
            .iter()
            .map(|s| {
                let d = s.slice.clone().unwrap_or_default();
                let mut state = state_name(s.state());
                if state == "free" && draining.contains(&s.worker_id.as_str()) {
                    state = "draining";
                }
                if state == "free" && shared.claimed_slices.contains_key(&d.slice_id) {
                    state = "leased";
                }
                if state == "free" {
                    free += 1;
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
        Ok(output(json!({
            "selector": selector_text,
            "slices": slices,
            "free": free,
            "workers": view.workers.len(),
        })))
    }
}
