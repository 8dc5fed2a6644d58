//! Where the state goes after every transition: the sink the worker and
//! the leader plug in to make a run resumable.

use crate::error::CheckpointError;
use crate::state::LoopState;

/// Receives the state after every transition (the worker stores it in KV).
#[async_trait::async_trait]
pub trait CheckpointSink: Send + Sync {
    /// A failure is reported as an `Error` event; the run goes on.
    async fn save(&self, state: &LoopState) -> Result<(), CheckpointError>;
}
