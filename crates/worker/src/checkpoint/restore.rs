//! Reading a stored checkpoint back into a loop state, whichever format
//! wrote it: 1 (the whole state), 2 (bounded, in one record) or 3 (bounded,
//! its history in records of its own, checked against the head's chain).

use mtswarm_bus::Checkpoints;
use mtswarm_core::LoopState;
use serde_json::Value;

use super::history::{HISTORY_ENTRIES_FIELD, HistoryEntries, HistoryFault, restore_history};
use super::stored::CHECKPOINT_FORMAT_VERSION;

/// Why a stored checkpoint could not be turned back into a loop state.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A format this worker does not know (written by a newer one).
    #[error("checkpoint of session {session} has format {found}, this worker reads up to {known}")]
    UnknownFormat {
        /// The session whose checkpoint it is.
        session: String,
        /// The format it has.
        found: u32,
        /// The newest format this worker reads.
        known: u32,
    },
    /// The history of a format 3 checkpoint could not be read back whole
    /// and as its head names it (a message missing, altered or foreign).
    #[error("checkpoint of session {session}: {fault}")]
    History {
        /// The session whose checkpoint it is.
        session: String,
        /// What is wrong with its history.
        #[source]
        fault: HistoryFault,
    },
    /// The state is not a `LoopState` in JSON.
    #[error("checkpoint of session {session} does not decode: {source}")]
    Decode {
        /// The session whose checkpoint it is.
        session: String,
        /// What the JSON decoder found wrong.
        #[source]
        source: serde_json::Error,
    },
}

/// The loop state a stored checkpoint holds: format 1 (the whole state,
/// as earlier workers wrote it; 0 when the field was not set) and format 2
/// (bounded) are both a `LoopState` in JSON; format 3 is one without its
/// history, whose messages are read from `store` and checked against the
/// head's hash chain.
pub(crate) async fn restored_state(
    store: &Checkpoints,
    checkpoint: &mtswarm_bus::v1::SessionCheckpoint,
) -> Result<LoopState, RestoreError> {
    let known = CHECKPOINT_FORMAT_VERSION;
    let session = || checkpoint.session_id.clone();
    if checkpoint.format_version > known {
        return Err(RestoreError::UnknownFormat {
            session: session(),
            found: checkpoint.format_version,
            known,
        });
    }
    let json = String::from_utf8_lossy(&checkpoint.state_json);
    let decode = |source| RestoreError::Decode {
        session: session(),
        source,
    };
    if checkpoint.format_version < 3 {
        return LoopState::from_json(&json).map_err(decode);
    }
    let mut head: serde_json::Map<String, Value> = serde_json::from_str(&json).map_err(decode)?;
    let history = |fault| RestoreError::History {
        session: session(),
        fault,
    };
    let entries = head
        .remove(HISTORY_ENTRIES_FIELD)
        .ok_or(HistoryFault::NoEntries)
        .and_then(|entries| {
            serde_json::from_value::<HistoryEntries>(entries).map_err(HistoryFault::BadEntries)
        })
        .map_err(history)?;
    let messages = restore_history(store, &checkpoint.session_id, &entries)
        .await
        .map_err(history)?;
    head.insert("history".into(), Value::Array(messages));
    serde_json::from_value(Value::Object(head)).map_err(decode)
}
