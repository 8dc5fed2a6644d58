//! The worker's checkpoint store as the durable-step bench
//! (`benches/durable_step.rs`) drives it: the engine's sink a session's
//! task attempt writes its checkpoints through, and the read a resume
//! starts from. Both are the daemon's own code (`checkpoint`), so the bench
//! measures what a session pays per step, not a stand-in.

use std::sync::Arc;

use mtswarm_bus::{BusError, Checkpoints};
use mtswarm_core::{CheckpointSink, ContextConfig, LoopState};

pub use crate::checkpoint::{HistoryFault, RestoreError};
use crate::checkpoint::{KvCheckpointSink, SessionCheckpointCell, restored_state};

/// Why a session's checkpoint could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// The checkpoints bucket refused or did not answer.
    #[error(transparent)]
    Store(#[from] BusError),
    /// The stored checkpoint is not a state this worker can resume.
    #[error(transparent)]
    Restore(#[from] RestoreError),
}

/// The sink of attempt 1 of task `task_id` of session `session_id`, as a
/// session builds it for a run with `context` (what its checkpoints keep
/// follows how the model is shown the state). No placement grant: the
/// store has no seal.
pub fn checkpoint_sink(
    store: Checkpoints,
    session_id: &str,
    task_id: &str,
    context: &ContextConfig,
) -> Arc<dyn CheckpointSink> {
    Arc::new(KvCheckpointSink::new(
        store,
        session_id,
        "bench-job",
        "bench-agent",
        task_id,
        1,
        SessionCheckpointCell::default(),
        context,
        None,
    ))
}

/// The loop state a resume of `session_id` starts from (`None`: nothing
/// stored), read as a session reads it.
pub async fn resume_state(
    store: &Checkpoints,
    session_id: &str,
) -> Result<Option<LoopState>, ResumeError> {
    let Some(stored) = store.get_genuine(session_id).await? else {
        return Ok(None);
    };
    Ok(Some(restored_state(store, &stored.value).await?))
}
