//! Where the state goes after every transition: the sink the worker and
//! the leader plug in to make a run resumable.
//!
//! The engine says, with each state, whether a resume depends on it being
//! stored before the run goes on ([`Durability`]). Only the engine can say
//! so: it alone knows which tools the next batch calls and what each
//! declares about itself (`ToolSpec::read_only`, `needs_hardware`,
//! `effects`), so a sink stores a durable point before it returns and may
//! coalesce the rest.

use crate::error::CheckpointError;
use crate::state::LoopState;

/// Whether a state must be stored before the run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A resume depends on it: the state that enters a tool batch touching
    /// anything outside the process (a hardware call, a write, a call that
    /// declares effects, such as a build reporting its artifact), so the
    /// stored state precedes the first such call and a stale attempt is
    /// fenced off before it; the state right after a batch ran, so a
    /// resume never runs it again; a paused state (the approval may be
    /// decided in another process); the final state.
    Required,
    /// Losing it loses at most the step's model call and read-only calls,
    /// which a resume repeats without effect: it may be written behind and
    /// superseded by the next state.
    Deferrable,
}

/// Receives the state after every transition (the worker stores it in KV).
#[async_trait::async_trait]
pub trait CheckpointSink: Send + Sync {
    /// Store `state`; with [`Durability::Required`], before returning. A
    /// failure is reported as an `Error` event; the run goes on.
    async fn save(&self, state: &LoopState, durability: Durability) -> Result<(), CheckpointError>;
}
