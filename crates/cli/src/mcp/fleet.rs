//! Tool `list_fleet`: the fleet's slices and worker daemons.

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;

/// Which slices to list.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ListFleet {
    /// Only slices matching this selector, e.g. "backend=emulator,cores>=8"
    /// (empty: all).
    #[serde(default)]
    selector: String,
}

#[tool_router(router = fleet_router, vis = "pub(super)")]
impl FarmServer {
    /// The slices with their state, lease or quarantine, and the workers.
    #[tool(
        description = "List the fleet: every board slice (cores, backend, state, lease or quarantine, lock utilization) and every worker daemon. Needs the admin role."
    )]
    async fn list_fleet(&self, Parameters(request): Parameters<ListFleet>) -> CallToolResult {
        reply(self.fleet(request).await)
    }
}

impl FarmServer {
    async fn fleet(&self, request: ListFleet) -> Result<Value, ToolError> {
        let fleet = self
            .control()
            .await?
            .list_fleet(v1::ListFleetRequest {
                slice_selector: request.selector,
            })
            .await
            .map_err(ToolError::leader("listing the fleet"))?
            .into_inner();
        Ok(json!({
            "slices": fleet.slices.iter().map(render::fleet_slice).collect::<Vec<_>>(),
            "workers": fleet.workers.iter().map(render::worker).collect::<Vec<_>>(),
        }))
    }
}
