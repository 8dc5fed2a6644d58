//! The failures of the core's extension points (tools, checkpoint sinks,
//! middlewares around compaction), typed so implementors in other crates and
//! the engine agree on what went wrong and name what was involved. None of
//! them ends a run: the engine turns each into an observation or an `Error`
//! event and goes on.
//!
//! Errors of the engine's own API ([`crate::EngineError`]), of models
//! ([`crate::ModelError`]), of tool calls ([`crate::ToolError`]) and of the
//! registry ([`crate::RegistryError`]) live with their modules.

use crate::model::ModelError;

/// Why [`crate::Tool::normalize`] could not repair a call's arguments. The
/// message becomes part of the observation the model sees, so it should name
/// the field and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NormalizeError {
    /// The arguments cannot be made to fit the tool's input.
    #[error("{reason}")]
    InvalidArguments {
        /// What is wrong, naming the field (e.g. "`limit` must be an integer").
        reason: String,
    },
}

impl NormalizeError {
    /// [`NormalizeError::InvalidArguments`] with `reason`.
    pub fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidArguments {
            reason: reason.into(),
        }
    }
}

/// Why a [`crate::CheckpointSink`] did not save a state (reported as an
/// `Error` event "checkpoint could not be saved: ..."; the run goes on).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The state could not be serialized; `what` names the state.
    #[error("{what} not serializable: {source}")]
    Serialize {
        /// The state, as the message names it (e.g. "leader state").
        what: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// The store did not take the checkpoint.
    #[error("{reason}")]
    Store {
        /// The store's account of the failure, naming the store.
        reason: String,
    },
}

/// Why a context compaction did not happen (the view stays as it was).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompactionError {
    /// The view holds no turn older than the ones it keeps.
    #[error("nothing old enough to summarize ({turns} turns in view, {kept} kept)")]
    NothingToSummarize {
        /// Turns in the compactable part of the view.
        turns: usize,
        /// Recent turns that are kept verbatim.
        kept: usize,
    },
    /// The model call that writes the summary failed.
    #[error("the summarization request failed: {0}")]
    Summarization(#[source] ModelError),
    /// The model answered the summarization request without text.
    #[error("the summarization request returned no text")]
    EmptySummary,
    /// A [`crate::Middleware`] around the compaction refused it.
    #[error("compaction refused by a middleware: {reason}")]
    Refused {
        /// The middleware's reason.
        reason: String,
    },
}
