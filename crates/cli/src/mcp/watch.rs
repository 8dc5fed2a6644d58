//! Tool `watch_job`: follows a job's event stream until the job ends or a
//! timeout passes, then answers with the events and the job's record. A
//! client that timed out calls again with `from_sequence` = the answer's
//! `next_sequence` and misses nothing.

use std::collections::VecDeque;
use std::time::Duration;

use mtswarm_proto::v1;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use super::reply::{ToolError, reply};
use super::server::FarmServer;
use crate::render;

/// Longest a single call follows a job.
const MAX_TIMEOUT_SECONDS: u64 = 3600;
/// Events an answer carries at most (the latest ones).
const MAX_EVENTS: usize = 200;

/// The job to follow and for how long.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct WatchJob {
    /// The job's id (from submit_job or list_jobs).
    job_id: String,
    /// Seconds to follow the job before answering if it has not ended
    /// (default 300, at most 3600).
    #[serde(default)]
    timeout_seconds: Option<u64>,
    /// First event to read (the `next_sequence` of an earlier answer; 0:
    /// from the start).
    #[serde(default)]
    from_sequence: u64,
    /// Include every agent event (tool calls, model turns); by default
    /// only state changes, task results and approvals.
    #[serde(default)]
    agent_events: bool,
}

#[tool_router(router = watch_router, vis = "pub(super)")]
impl FarmServer {
    /// Follows a job to its end (or the timeout).
    #[tool(
        description = "Follow a job until it ends or timeout_seconds pass. Returns {finished, job, events, next_sequence}: the job's record (with its outcome once it ended) and its events (state changes, task results, approvals; agent events on request). Call again with from_sequence = next_sequence to go on."
    )]
    async fn watch_job(&self, Parameters(request): Parameters<WatchJob>) -> CallToolResult {
        reply(self.watch(request).await)
    }
}

impl WatchJob {
    /// How long the call follows the job (default 300 s, 1 s to an hour).
    pub(super) fn timeout(&self) -> Duration {
        Duration::from_secs(
            self.timeout_seconds
                .unwrap_or(300)
                .clamp(1, MAX_TIMEOUT_SECONDS),
        )
    }
}

impl FarmServer {
    async fn watch(&self, request: WatchJob) -> Result<Value, ToolError> {
        let timeout = request.timeout();
        let mut stream = self
            .control()
            .await?
            .watch_job(v1::WatchJobRequest {
                job_id: request.job_id.clone(),
                from_sequence: request.from_sequence,
            })
            .await
            .map_err(ToolError::leader("watching the job"))?
            .into_inner();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut events = VecDeque::new();
        let mut dropped = 0usize;
        let mut next_sequence = request.from_sequence;
        loop {
            let item = match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => break,
                // The stream of a job ends after its final state change.
                Ok(None) => break,
                Ok(Some(item)) => item.map_err(ToolError::leader("watching the job"))?,
            };
            next_sequence = next_sequence.max(item.sequence + 1);
            if !request.agent_events
                && matches!(item.event, Some(v1::job_event::Event::AgentEvent(_)))
            {
                continue;
            }
            events.push_back(render::job_event(&item));
            if events.len() > MAX_EVENTS {
                events.pop_front();
                dropped += 1;
            }
        }
        let job = self.job_record(&request.job_id).await?;
        let finished = matches!(
            job.state(),
            v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
        );
        Ok(json!({
            "finished": finished,
            "state": render::job_state(job.state()),
            "job": render::job(&job),
            "events": events,
            "events_left_out": dropped,
            "next_sequence": next_sequence,
        }))
    }
}
