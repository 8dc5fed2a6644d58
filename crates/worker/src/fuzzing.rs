//! The entry points of the worker's request and task checks for the fuzz
//! targets of `mtswarm-fuzz`: what the `Worker` service checks of a
//! request before it touches the daemon's state ([`crate::requests`],
//! the kernel directory SpawnSession resolves), and what a session checks
//! of a `TaskAssignment` from the bus before it runs it (the placement
//! grant, `crate::provenance`; sizes, deadline, parameters and their
//! candidates, `session/validate.rs`). Each calls the daemon's own code.

use std::path::Path;
use std::time::Duration;

use mtswarm_auth::DecisionVerifier;
use mtswarm_bus::v1;
use mtswarm_hw::ChipSpec;

use crate::config::WorkerConfig;
use crate::requests::{self, InvalidRequest, SliceChoice};
use crate::session::InvalidTask;
use crate::workspace::{KernelDirError, resolve_kernel_dir};

/// Why a request or a task was refused (its message names what is wrong).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Refused(#[from] Why);

#[derive(Debug, thiserror::Error)]
enum Why {
    #[error(transparent)]
    Request(#[from] InvalidRequest),
    #[error(transparent)]
    KernelDir(#[from] KernelDirError),
    #[error(transparent)]
    Task(#[from] InvalidTask),
}

fn refused(why: impl Into<Why>) -> Refused {
    Refused(why.into())
}

/// Checks a SpawnSession request as the service does before it looks at
/// its slices: the ids, the slice choice, and the kernel directory under
/// `kernel_root`. Says where the session would run (`named slice`,
/// `selector`).
pub fn spawn_session(
    request: &v1::SpawnSessionRequest,
    kernel_root: &Path,
) -> Result<&'static str, Refused> {
    requests::check_spawn_ids(request).map_err(refused)?;
    let choice = requests::slice_choice(request).map_err(refused)?;
    if !request.kernel_dir.trim().is_empty() {
        resolve_kernel_dir(kernel_root, &request.kernel_dir).map_err(refused)?;
    }
    Ok(match choice {
        SliceChoice::Named(_) => "named slice",
        SliceChoice::Matching(_) => "selector",
    })
}

/// The reason CancelSession gives the session it stops.
pub fn cancel_reason(request: &v1::CancelSessionRequest) -> String {
    requests::cancel_reason(request)
}

/// How long Drain lets sessions finish, with the daemon's `default`.
pub fn drain_grace(request: &v1::DrainRequest, default: Duration) -> Duration {
    requests::drain_grace(request, default)
}

/// Why `task`'s placement grant does not place it on worker `worker_id`
/// whose record key is `worker_key`, under the leader key `leader` (none:
/// it does).
pub fn grant_problem(
    leader: &DecisionVerifier,
    task: &v1::TaskAssignment,
    worker_id: &str,
    worker_key: &str,
) -> Option<String> {
    crate::provenance::grant_problem(Some(leader), task, worker_id, worker_key)
}

/// Checks `task` as a session does before it runs it, under `config`'s
/// limits, its candidates against the tune.toml of `kernel_dir` on a chip
/// `spec`; the number of candidates its plan names.
pub fn check_task(
    task: &v1::TaskAssignment,
    config: &WorkerConfig,
    kernel_dir: &Path,
    spec: &ChipSpec,
) -> Result<usize, Refused> {
    let checked = crate::session::check_task(
        task,
        config.max_task_parameters_bytes,
        config.max_task_instructions_bytes,
    )
    .map_err(refused)?;
    crate::session::check_task_defines(kernel_dir, &checked.plan, spec).map_err(refused)?;
    Ok(checked.plan.all_candidates().count())
}
