//! Starting a session on a reserved slice: its workspace (the kernel is
//! checked, and copied by its first task), tools, model, prompt and approval policy, the resume point SpawnSession
//! reports, the slice's lease, then the session's task
//! (see [`super::lifecycle`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mtswarm_bus::{BusError, v1};
use mtswarm_core::{AutoApprove, RegistryError, RiskPolicy, ToolRegistry};
use mtswarm_tools::{ToolSet, ToolsError};
use tracing::{Instrument, Span};

use super::lifecycle::run_session;
use super::model::{ModelChoiceError, session_model};
use super::runtime::SessionRuntime;
use crate::checkpoint::KnownCheckpoint;
use crate::host::SessionHost;
use crate::leases::LeaseError;
use crate::prompt::worker_system_prompt;
use crate::session_entry::{SessionEntry, SessionIds};
use crate::slices::SliceEntry;
use crate::workspace::{KernelDirError, resolve_kernel_dir, session_workspace};

/// Why a session could not be started (SpawnSession maps each to a gRPC
/// status).
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    /// The kernel directory of the request is refused or cannot be copied.
    #[error(transparent)]
    KernelDir(#[from] KernelDirError),
    /// The session's tools could not be built.
    #[error("tools: {0}")]
    Tools(#[from] ToolsError),
    /// The session's tools could not be registered.
    #[error("tool registry: {0}")]
    Registry(#[from] RegistryError),
    /// The session's model could not be set up.
    #[error(transparent)]
    Model(#[from] ModelChoiceError),
    /// The session's checkpoint could not be read for its resume point.
    #[error("checkpoint lookup: {0}")]
    CheckpointLookup(#[source] BusError),
    /// The slice's lease could not be pointed at the session.
    #[error(transparent)]
    Lease(#[from] LeaseError),
}

/// Build the session's runtime on slice `index` (reserved by the caller),
/// point the slice's lease at it, enter it in the table and start its task.
pub(super) async fn start_session(
    shared: &Arc<SessionHost>,
    index: usize,
    request: &v1::SpawnSessionRequest,
) -> Result<Arc<SessionEntry>, StartError> {
    let slice = &shared.slices[index];
    let workspace = session_workspace(&shared.config.workspace_root, &request.session_id);
    // The kernel is only checked here; it is copied into the workspace by
    // the session's first task that needs it (`SessionRuntime::kernel_copy`),
    // so a spawn costs no file copies and an idle session no disk. A moved
    // or resumed session finds its earlier copy there, edits included.
    if !request.kernel_dir.trim().is_empty() {
        resolve_kernel_dir(&shared.config.kernel_root, &request.kernel_dir)?;
    }
    let model = session_model(shared, request)?;
    // The builtin search asks the job's other agents' results; a model's
    // prompt does without the tool (every tool costs its context).
    let observations = model.provider_name() == mtswarm_core::BUILTIN_PROVIDER;
    let (tools, registry) = session_tools(shared, slice, &workspace, request, observations)?;
    let all_tools = tools.tools();
    let system_prompt = worker_system_prompt(
        &request.role,
        &request.instructions,
        &slice.slice,
        &slice.spec,
        &all_tools,
    );
    let hardware_tools = all_tools
        .iter()
        .filter(|t| t.spec().needs_hardware)
        .map(|t| t.spec().name.to_string())
        .collect();
    let (resumed_from_step, known_checkpoint) = resume_point(shared, request).await?;
    let lease_epoch = shared
        .leases
        .set_lease_session(index, &request.session_id, &request.job_id)
        .await?;
    let (entry, stop_rx) = SessionEntry::new(
        SessionIds {
            session_id: &request.session_id,
            job_id: &request.job_id,
            agent_id: &request.agent_id,
            slice_index: index,
        },
        lease_epoch,
        resumed_from_step,
    );
    let entry = Arc::new(entry);
    let runtime = SessionRuntime {
        tools,
        registry,
        model,
        system_prompt,
        workspace,
        policy: approval_policy(request),
        kernel_dir: request.kernel_dir.clone(),
        budgets: request.budgets.unwrap_or_default(),
        hardware_tools,
        // Sampling settings only mean something to a real model.
        temperature: request
            .model
            .as_ref()
            .and_then(|m| m.temperature)
            .map(|t| t as f32),
        max_output_tokens: request
            .model
            .as_ref()
            .map(|m| m.max_output_tokens)
            .filter(|n| *n > 0),
        engine: Mutex::new(None),
        kernel_copies: Mutex::new(HashMap::new()),
        checkpoint: Arc::new(Mutex::new(known_checkpoint)),
    };
    let span = session_span(shared, request, &slice.bus_id);
    shared
        .slices
        .table()
        .sessions
        .insert(request.session_id.clone(), entry.clone());
    let join =
        tokio::spawn(run_session(shared.clone(), entry.clone(), runtime, stop_rx).instrument(span));
    entry.set_join(join);
    tracing::info!(session.id = %request.session_id, slice.id = %slice.bus_id, "session started");
    Ok(entry)
}

/// The session's tools on the slice's board, in its workspace (their
/// results filed under the kernel's name), and their registry; with
/// `observations`, `job_observations` too.
fn session_tools(
    shared: &SessionHost,
    slice: &SliceEntry,
    workspace: &Path,
    request: &v1::SpawnSessionRequest,
    observations: bool,
) -> Result<(ToolSet, ToolRegistry), StartError> {
    let tools = ToolSet::builder(workspace, slice.board.clone())
        .spec(slice.spec.clone())
        .lock(shared.hw_lock.clone())
        .measure_defaults(shared.config.measure.clone())
        .build()?
        .with_results(
            crate::results::BusResults::new(shared.stores.results.clone()),
            kernel_name_of(&request.kernel_dir),
        );
    let mut registry = ToolRegistry::new();
    tools.register_all(&mut registry)?;
    if observations {
        registry.register(Arc::new(crate::observations::JobObservationsTool::new(
            shared.stores.results.clone(),
            &request.job_id,
            &request.session_id,
            &kernel_name_of(&request.kernel_dir).unwrap_or_default(),
            shared.config.leader_key.clone(),
        )))?;
    }
    Ok((tools, registry))
}

/// What the session may run without asking: up to medium risk when the
/// request auto-approves, else low risk only; and the request's rules.
fn approval_policy(request: &v1::SpawnSessionRequest) -> RiskPolicy {
    RiskPolicy::default()
        .with_auto_approve(if request.auto_approve {
            AutoApprove::UpToMedium
        } else {
            AutoApprove::LowOnly
        })
        .with_rules(crate::approval_rules::engine_rules(&request.approval_rules))
}

/// Where a resumed session continues (the step SpawnSession reports, and
/// its checkpoint as known); step 0 and none for a fresh one.
async fn resume_point(
    shared: &SessionHost,
    request: &v1::SpawnSessionRequest,
) -> Result<(u32, Option<KnownCheckpoint>), StartError> {
    if !request.resume {
        return Ok((0, None));
    }
    match shared
        .stores
        .checkpoints
        .get_genuine(&request.session_id)
        .await
    {
        Ok(Some(checkpoint)) => Ok((
            checkpoint.value.step,
            Some(KnownCheckpoint::of_stored(&checkpoint)),
        )),
        Ok(None) => Ok((0, None)),
        // A record that is not a checkpoint never will be one: the
        // session starts afresh rather than refusing every move.
        Err(error) if error.is_undecodable() => {
            tracing::warn!(%error, "stored checkpoint unreadable; the session starts afresh");
            Ok((0, None))
        }
        Err(error) => Err(StartError::CheckpointLookup(error)),
    }
}

/// The session's span, a child of the spawning leader's span when the
/// request carries its trace context.
fn session_span(shared: &SessionHost, request: &v1::SpawnSessionRequest, slice_id: &str) -> Span {
    let span = tracing::info_span!(
        "worker.session",
        session.id = %request.session_id,
        job.id = %request.job_id,
        agent.id = %request.agent_id,
        slice.id = %slice_id,
        worker.id = %shared.identity.worker_id,
    );
    if !request.traceparent.is_empty() {
        let parent =
            mtswarm_telemetry::propagation::context_from_traceparent(&request.traceparent, None);
        if let Err(error) = mtswarm_telemetry::propagation::set_parent(&span, parent) {
            tracing::debug!(%error, "SpawnSession traceparent not applied");
        }
    }
    span
}

/// The kernel's name as results are filed under it: the last component of
/// the kernel directory (`examples/kernels/dgemm` -> `dgemm`).
fn kernel_name_of(kernel_dir: &str) -> Option<String> {
    std::path::Path::new(kernel_dir.trim())
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .filter(|name| !name.is_empty())
}
