//! `cancel_agent`: stop an agent's session (see [`crate::placement::cancel_agent`]).

use std::sync::Arc;

use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{ToolEnv, output, text_arg};
use crate::error::CancelError;
use crate::placement::cancel_agent;

pub(super) struct CancelAgent(pub(super) Arc<ToolEnv>);

#[async_trait::async_trait]
impl Tool for CancelAgent {
    tool_meta!(
        "cancel_agent",
        "Stop an agent's session; its unfinished tasks count as cancelled.",
        Risk::Medium,
        false,
        false
    );
    fn input_schema(&self) -> Value {
        json!({"type":"object","properties":{
            "agent":{"type":"string"},
            "reason":{"type":"string"}
        },"required":["agent"],"additionalProperties":false})
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let agent = text_arg(&args, "agent")
            .ok_or_else(|| ToolError::InvalidArgs("agent is required".into()))?;
        let reason = text_arg(&args, "reason").unwrap_or_else(|| "cancelled by the leader".into());
        let cancelled = cancel_agent(&self.0.shared, &self.0.job, &agent, &reason)
            .await
            .map_err(|error| match error {
                CancelError::UnknownAgent { .. } => ToolError::InvalidArgs(error.to_string()),
                other => ToolError::Failed(other.to_string()),
            })?;
        Ok(output(json!({"agent": agent, "cancelled": cancelled})))
    }
}
