//! `cancel_agent`: stop an agent's session (see [`crate::placement::cancel_agent`]).

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ToolEnv, given, output, parse_args};
use crate::error::CancelError;

pub(super) struct CancelAgent(pub(super) Arc<ToolEnv>);

/// Arguments of `cancel_agent`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelAgentArgs {
    /// the agent to stop
    agent: String,
    /// why, for the record
    #[serde(default)]
    reason: Option<String>,
}

/// What `cancel_agent` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "cancel_agent",
    "Stop an agent's session; its unfinished tasks count as cancelled.",
    schema_of::<CancelAgentArgs>,
)
.risk(Risk::Medium)
.writes();

#[async_trait::async_trait]
impl Tool for CancelAgent {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: CancelAgentArgs = parse_args(args)?;
        let agent = given(Some(args.agent))
            .ok_or_else(|| ToolError::InvalidArgs("agent is required".into()))?;
        let reason = given(args.reason).unwrap_or_else(|| "cancelled by the leader".into());
        let cancelled = (self.0.placement())
            .cancel_agent(&self.0.job, &agent, &reason)
            .await
            .map_err(|error| match error {
                CancelError::UnknownAgent { .. } => ToolError::InvalidArgs(error.to_string()),
                other => ToolError::Failed(other.to_string()),
            })?;
        Ok(output(json!({"agent": agent, "cancelled": cancelled})))
    }
}
