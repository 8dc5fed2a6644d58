//! `spawn_agent`: start a worker agent on a free slice, recorded before the
//! worker is called; a re-executed call answers as the first did. The calls
//! of one turn run concurrently (see [`super::spawning`]).

use std::sync::Arc;

use mtswarm_bus::{subjects, v1};
use mtswarm_core::{Risk, Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_hw::SliceSelector;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::Instrument;

use super::{ToolEnv, given, output, parse_args};
use crate::error::SpawnError;
use crate::fleet::FleetView;
use crate::fleet::parse_selector;
use crate::ids::call_key;
use crate::job::{AgentEntry, JobContext};
use crate::placement::Placement;

pub(super) struct SpawnAgent(pub(super) Arc<ToolEnv>);

fn agent_name_ok(name: &str) -> Result<(), ToolError> {
    subjects::validate_id("agent name", name).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
    if name == crate::ids::LEADER_AGENT_ID {
        return Err(ToolError::InvalidArgs(format!(
            "agent name {name:?} is reserved for the leader"
        )));
    }
    Ok(())
}

/// Arguments of `spawn_agent`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpawnAgentArgs {
    /// slice selector; empty = the job's selector
    #[serde(default)]
    selector: Option<String>,
    /// agent role, e.g. tuner
    #[serde(default)]
    role: Option<String>,
    /// standing instructions for the agent
    #[serde(default)]
    instructions: Option<String>,
    /// agent id to use ([A-Za-z0-9_-], unique in the job)
    #[serde(default)]
    name: Option<String>,
    /// run on exactly this slice
    #[serde(default)]
    slice_id: Option<String>,
}

/// What `spawn_agent` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "spawn_agent",
    "Start a worker agent on a free slice matching the selector (default: the job's). Returns the agent id (the optional name) used by assign_task, collect_result and cancel_agent.",
    schema_of::<SpawnAgentArgs>,
)
.risk(Risk::Medium)
.writes()
.concurrent();

#[async_trait::async_trait]
impl Tool for SpawnAgent {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, mut args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        selector_by_its_prompt_name(&mut args);
        Ok(args)
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let job = &self.0.job;
        let placement = self.0.placement();
        let mut args: SpawnAgentArgs = parse_args(args)?;
        let key = call_key(ctx);
        let known = job
            .agents()
            .values()
            .find(|a| a.spawn_call_id == key)
            .cloned();
        if let Some(agent) = known {
            return Ok(output(respawned(placement, job, &agent).await));
        }
        let wanted = given(args.name.take());
        if let Some(name) = &wanted {
            agent_name_ok(name)?;
        }
        let spawning = &self.0.spawning;
        let reservation = spawning.reserve_name(job, wanted).map_err(|taken| {
            ToolError::InvalidArgs(format!(
                "an agent named {taken:?} already exists in this job: assign_task with agent \
{taken:?} gives it candidates; spawn_agent with another name starts one more agent"
            ))
        })?;
        let agent_id = reservation.name().to_string();
        agent_name_ok(&agent_id)?;
        let mut request = SpawnRequest::read(args, job, agent_id, key)?;
        let _permit = spawning.permit().await;
        let mut view = read_fleet(&self.0, &request).await?;
        // A slice_id that names no slice of the fleet at all (a small model
        // fills the field with "1") asks for nothing the fleet has: any
        // free slice is meant, and the answer says which it got.
        let ignored = request
            .wanted_slice
            .take_if(|wanted| !names_a_slice(&view, wanted));
        if ignored.is_some() {
            view = read_fleet(&self.0, &request).await?;
        }
        let mut refusals = Vec::new();
        for (descriptor, worker) in free_slices(&view, request.wanted_slice.as_deref()) {
            // Claim locally first: a concurrent spawn skips this slice.
            if !placement
                .claims
                .claim(&descriptor.slice_id, &request.session_id)
            {
                continue;
            }
            let entry = request.entry(descriptor, worker);
            place(&self.0, &entry).await?;
            // The claim lasts as long as the agent (released by cancel_agent,
            // which every job end calls), so this leader never places two
            // sessions on one slice whatever the lease shows meanwhile.
            let started = tokio::spawn(
                start_session(
                    self.0.clone(),
                    entry,
                    descriptor.slice_id.clone(),
                    worker.worker_id.clone(),
                )
                // The span carries the trace context SpawnSession propagates.
                .instrument(tracing::Span::current()),
            )
            .await
            .map_err(|e| ToolError::Failed(format!("spawning the session failed: {e}")))?;
            match started {
                Started::Placed(entry) => {
                    ctx.progress(
                        format!("agent {} runs on {}", request.agent_id, entry.slice_id),
                        Some(1.0),
                    );
                    let mut answer = json!({
                        "agent": request.agent_id, "session_id": request.session_id,
                        "worker_id": entry.worker_id, "slice_id": entry.slice_id, "role": request.role,
                        "next": format!("assign_task with agent {:?} gives it candidates", request.agent_id),
                    });
                    if let Some(ignored) = &ignored {
                        answer["note"] = json!(format!(
                            "slice_id {ignored:?} names no slice of the fleet; the agent took a free one"
                        ));
                    }
                    return Ok(output(answer));
                }
                Started::Cancelled => return Err(cancelled_while_spawning(&request.agent_id)),
                Started::Refused(refusal) => {
                    placement.claims.release(&descriptor.slice_id);
                    refusals.push(format!("{}: {refusal}", descriptor.slice_id));
                }
            }
        }
        if job.agents().contains_key(&request.agent_id) {
            job.forget_placement(&request.agent_id).await;
        }
        let detail = if refusals.is_empty() {
            String::new()
        } else {
            format!(" (refused: {})", refusals.join("; "))
        };
        if let Some(wanted) = &request.wanted_slice {
            let others: Vec<&str> = free_slices(&view, None)
                .map(|(descriptor, _)| descriptor.slice_id.as_str())
                .filter(|id| id != wanted)
                .collect();
            if !others.is_empty() {
                return Err(ToolError::InvalidArgs(format!(
                    "no free slice has slice_id {wanted:?} for this job{detail}: omit slice_id to \
take any free slice, or give one of {}",
                    others.join(", ")
                )));
            }
        }
        Err(ToolError::Failed(format!(
            "no free slice matches selector {:?}{detail}: every matching slice is busy; \
collect_result from the agents you have, or cancel_agent one to free its slice",
            request.selector_text
        )))
    }
}

/// What a new `spawn_agent` call asks for, read from its arguments.
struct SpawnRequest {
    agent_id: String,
    /// `<job id>-<agent id>`, cut to an id's length.
    session_id: String,
    role: String,
    instructions: String,
    /// The selector as given (the job's when none was).
    selector_text: String,
    selector: Option<SliceSelector>,
    /// Run on exactly this slice.
    wanted_slice: Option<String>,
    /// The call's key: a re-executed call finds its agent by it.
    spawn_call_id: String,
}

impl SpawnRequest {
    fn read(
        args: SpawnAgentArgs,
        job: &JobContext,
        agent_id: String,
        spawn_call_id: String,
    ) -> Result<Self, ToolError> {
        let selector_text = given(args.selector).unwrap_or_else(|| job.spec.slice_selector.clone());
        let selector =
            parse_selector(&selector_text).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let session_id = format!(
            "{}-{}",
            job.job_id.chars().take(36).collect::<String>(),
            agent_id
        )
        .chars()
        .take(subjects::MAX_ID_LEN)
        .collect::<String>();
        Ok(Self {
            session_id,
            role: given(args.role).unwrap_or_else(|| "tuner".to_string()),
            instructions: given(args.instructions).unwrap_or_default(),
            selector_text,
            selector,
            wanted_slice: given(args.slice_id),
            agent_id,
            spawn_call_id,
        })
    }

    /// The agent's entry on `slice` of `worker`, while its session starts.
    fn entry(&self, slice: &v1::SliceDescriptor, worker: &v1::WorkerRecord) -> AgentEntry {
        AgentEntry {
            agent_id: self.agent_id.clone(),
            session_id: self.session_id.clone(),
            worker_id: worker.worker_id.clone(),
            slice_id: slice.slice_id.clone(),
            endpoint: worker.endpoint.clone(),
            worker_key: worker.record_key.clone(),
            role: self.role.clone(),
            instructions: self.instructions.clone(),
            cancelled: false,
            spawn_call_id: self.spawn_call_id.clone(),
            moves: 0,
            spawning: true,
        }
    }
}

/// The fleet for the request's selector: the job's shared view, read again
/// when it shows no free slice (it may predate a slice freed meanwhile).
async fn read_fleet(env: &ToolEnv, request: &SpawnRequest) -> Result<Arc<FleetView>, ToolError> {
    let read = |fresh: bool| async move {
        env.spawning
            .view(
                env.placement(),
                &request.selector_text,
                request.selector.as_ref(),
                fresh,
            )
            .await
            .map_err(|e| ToolError::Failed(format!("cannot read the fleet: {e}")))
    };
    let (view, cached) = read(false).await?;
    if cached && !has_free_slice(&view, request.wanted_slice.as_deref(), env.placement()) {
        return Ok(read(true).await?.0);
    }
    Ok(view)
}

/// The FREE slices of `view` (only `wanted`, when given) with their worker,
/// when it is known and not draining.
fn free_slices<'a>(
    view: &'a FleetView,
    wanted: Option<&'a str>,
) -> impl Iterator<Item = (&'a v1::SliceDescriptor, &'a v1::WorkerRecord)> + 'a {
    view.slices.iter().filter_map(move |slice| {
        let descriptor = slice.slice.as_ref()?;
        if wanted.is_some_and(|w| w != descriptor.slice_id) || slice.state() != v1::SliceState::Free
        {
            return None;
        }
        let worker = view
            .workers
            .iter()
            .find(|w| w.worker_id == slice.worker_id)?;
        (!worker.draining).then_some((descriptor, worker))
    })
}

/// Whether `slice_id` is a slice of `view`, whatever its state.
fn names_a_slice(view: &FleetView, slice_id: &str) -> bool {
    view.slices
        .iter()
        .filter_map(|slice| slice.slice.as_ref())
        .any(|descriptor| descriptor.slice_id == slice_id)
}

/// Places the agent on its claimed slice and records the placement before
/// the worker is called (a leader that crashes in between finds the agent
/// when it re-executes the call); the claim is released on failure.
async fn place(env: &ToolEnv, entry: &AgentEntry) -> Result<(), ToolError> {
    let (job, placement) = (&env.job, env.placement());
    // A later slice after a refusal: the agent exists already and a job
    // cancellation may have marked it meanwhile.
    let placed = if job.agents().contains_key(&entry.agent_id) {
        job.place_agent(entry)
    } else {
        job.agents().insert(entry.agent_id.clone(), entry.clone());
        true
    };
    if !placed {
        placement.claims.release(&entry.slice_id);
        return Err(cancelled_while_spawning(&entry.agent_id));
    }
    if let Err(error) = job.store_placement(entry).await {
        placement.claims.release(&entry.slice_id);
        job.agents().remove(&entry.agent_id);
        return Err(ToolError::Failed(format!(
            "agent placement not stored in the job record: {error}"
        )));
    }
    Ok(())
}

/// Whether `view` shows a free, unclaimed slice (`wanted`, when given) on a
/// worker that is not draining.
fn has_free_slice(view: &FleetView, wanted: Option<&str>, placement: &Placement) -> bool {
    view.slices.iter().any(|slice| {
        slice.slice.as_ref().is_some_and(|d| {
            wanted.is_none_or(|w| w == d.slice_id)
                && slice.state() == v1::SliceState::Free
                && !placement.claims.is_claimed(&d.slice_id)
                && view
                    .workers
                    .iter()
                    .any(|w| w.worker_id == slice.worker_id && !w.draining)
        })
    })
}

/// How [`start_session`] ended.
enum Started {
    /// The session runs; the agent's entry as placed.
    Placed(AgentEntry),
    /// The agent was cancelled meanwhile; its session is stopped.
    Cancelled,
    /// The worker refused the session.
    Refused(SpawnError),
}

/// Calls `SpawnSession` and places the agent. Spawned as a task of its own
/// so that it runs to the end even when the tool call is dropped (the
/// job's loop was cancelled): a spawn cut off between the worker starting
/// the session and the leader placing it would leave a session that no
/// cancellation reaches. An agent cancelled meanwhile (the worker may have
/// been told before the session existed) has the new session stopped here.
async fn start_session(
    env: Arc<ToolEnv>,
    mut entry: AgentEntry,
    slice_id: String,
    worker_id: String,
) -> Started {
    let (placement, job) = (env.placement(), &env.job);
    let response = match placement.spawn_on(job, &entry, &slice_id, false).await {
        Ok(response) => response,
        Err(refusal) => return Started::Refused(refusal),
    };
    if !response.slice_id.is_empty() {
        entry.slice_id = response.slice_id.clone();
    }
    if !response.worker_id.is_empty() {
        entry.worker_id = response.worker_id.clone();
    }
    entry.spawning = false;
    if !job.place_agent(&entry) {
        if let Err(error) = placement
            .stop_session(&entry, "agent cancelled while spawning")
            .await
        {
            tracing::warn!(%error, job_id = %job.job_id, agent_id = %entry.agent_id, "session of an agent cancelled while spawning not stopped");
        }
        for slice in [&entry.slice_id, &slice_id] {
            placement.claims.release_of(slice, &entry.session_id);
        }
        return Started::Cancelled;
    }
    if (entry.slice_id.as_str(), entry.worker_id.as_str())
        != (slice_id.as_str(), worker_id.as_str())
        && let Err(error) = job.store_placement(&entry).await
    {
        tracing::warn!(%error, job_id = %job.job_id, "agent placement not updated");
    }
    Started::Placed(entry)
}

fn cancelled_while_spawning(agent_id: &str) -> ToolError {
    ToolError::Failed(format!(
        "agent {agent_id:?} was cancelled while its session started"
    ))
}

/// A re-executed `spawn_agent` call: the agent exists; make sure its session
/// runs (SpawnSession is idempotent by session id; `resume` picks up its
/// checkpoint if the session had to be started again) and answer as the
/// first execution did. A session that cannot be confirmed is left to the
/// reassigner, which moves an agent with pending tasks whose lease does not
/// name its session.
async fn respawned(placement: &Placement, job: &JobContext, agent: &AgentEntry) -> Value {
    let mut answer = json!({
        "agent": agent.agent_id, "session_id": agent.session_id,
        "worker_id": agent.worker_id, "slice_id": agent.slice_id, "role": agent.role,
    });
    if agent.cancelled {
        answer["cancelled"] = json!(true);
        return answer;
    }
    answer["next"] = json!(format!(
        "assign_task with agent {:?} gives it candidates",
        agent.agent_id
    ));
    // Its own claim, kept (a claim by another session is not taken).
    placement.claims.claim(&agent.slice_id, &agent.session_id);
    if let Err(error) = placement.spawn_on(job, agent, &agent.slice_id, true).await {
        tracing::warn!(job_id = %job.job_id, agent_id = %agent.agent_id, %error, "session of a re-executed spawn not confirmed");
        answer["note"] = json!(format!("session not confirmed yet: {error}"));
    }
    answer
}

/// The prompt calls the job's selector its "slice selector": a model that
/// names the argument so (a small one did, nine times in a row, whatever
/// the schema error said) means `selector`.
fn selector_by_its_prompt_name(args: &mut Value) {
    if let Some(map) = args.as_object_mut()
        && !map.contains_key("selector")
        && let Some(selector) = map.remove("slice_selector")
    {
        map.insert("selector".into(), selector);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_selector_is_read_as_selector_unless_both_are_given() {
        let mut named = json!({"name": "a1", "slice_selector": "cores>=8"});
        selector_by_its_prompt_name(&mut named);
        assert_eq!(named, json!({"name": "a1", "selector": "cores>=8"}));
        let mut both = json!({"selector": "a", "slice_selector": "b"});
        selector_by_its_prompt_name(&mut both);
        assert_eq!(both, json!({"selector": "a", "slice_selector": "b"}));
    }
}
