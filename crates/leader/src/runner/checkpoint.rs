//! The leader loop's checkpoint, stored under the job's loop key after
//! every step, and kept to what the model is shown. The engine's state
//! holds the whole conversation: every turn a compaction already replaced
//! by its summary, and every tool result in full although the model only
//! ever sees its first `max_tool_result_chars`. A job of many agents (a
//! fleet listing of a thousand slices, a spawn and an assignment per agent)
//! would make that state outgrow the server's message size limit and the
//! job stop being resumable. What is stored is the state as the model
//! sees it: the task, the summary, the turns after the last compaction,
//! each tool result cut where the view cuts it. A loop resumed from it
//! sends the model the same request, so the checkpoint is bounded by the
//! context budget (the window and the per-result limit), not by the job.

use mtswarm_bus::v1;
use mtswarm_core::{CheckpointSink, Durability, LoopState, Message, Role};

use super::transition::now;

/// Stores the leader loop's state under the job's loop key after every
/// transition (not in the record: the state grows with the conversation).
pub(super) struct JobCheckpointSink {
    pub(super) jobs: mtswarm_bus::Jobs,
    pub(super) job_id: String,
    /// Chars of a tool result the model sees (the engine's context
    /// setting): what the stored history keeps of each.
    pub(super) max_tool_result_chars: usize,
    /// The job's ownership: a leader that lost the job stores no more
    /// checkpoints of it.
    pub(super) fence: mtswarm_bus::Fence,
}

#[async_trait::async_trait]
impl CheckpointSink for JobCheckpointSink {
    /// Every state is stored before the run goes on: a leader's steps are
    /// few and its tools write (tasks, agents) whatever their batch.
    async fn save(
        &self,
        state: &LoopState,
        _durability: Durability,
    ) -> Result<(), mtswarm_core::CheckpointError> {
        let json = as_shown(state, self.max_tool_result_chars).map_err(|source| {
            mtswarm_core::CheckpointError::Serialize {
                what: "leader state",
                source,
            }
        })?;
        self.fence.check("a leader loop checkpoint").map_err(|e| {
            mtswarm_core::CheckpointError::Store {
                reason: e.to_string(),
            }
        })?;
        let checkpoint = v1::LeaderCheckpoint {
            job_id: self.job_id.clone(),
            state_json: json.into_bytes(),
            updated_at: Some(now()),
            owner_epoch: self.fence.epoch(),
        };
        self.jobs
            .as_owner(self.fence.epoch())
            .put_loop_state(&checkpoint)
            .await
            .map_err(|error| {
                let reason = match self.fence.refused(error) {
                    Ok(lost) => lost.to_string(),
                    Err(other) => other.to_string(),
                };
                mtswarm_core::CheckpointError::Store {
                    reason: format!("leader checkpoint not stored: {reason}"),
                }
            })
    }
}

/// `state` as JSON with the history cut to what the model is shown: the
/// turns a compaction summarized are dropped (the pinned task stays, the
/// view then starts right after it) and each tool result is cut to
/// `max_tool_result_chars`, saying how long it was, as the view says it.
pub(crate) fn as_shown(
    state: &LoopState,
    max_tool_result_chars: usize,
) -> Result<String, serde_json::Error> {
    let history = state.history();
    let view_start = state.projection().view_start;
    let pinned = history.first().is_some_and(|m| m.role == Role::User);
    // Built as messages and written once: a leader's state holds a call
    // and a result per agent, and going through a JSON tree cost more
    // than the writing.
    let (kept, view_start): (Vec<&Message>, usize) =
        if pinned && view_start > 1 && view_start <= history.len() {
            let kept = history[..1].iter().chain(&history[view_start..]).collect();
            (kept, 1)
        } else {
            (history.iter().collect(), view_start)
        };
    let shown = kept
        .into_iter()
        .map(|message| match message.role {
            Role::Tool => match cut_for_view(&message.content, max_tool_result_chars) {
                Some(cut) => Message {
                    content: cut,
                    ..message.clone()
                },
                None => message.clone(),
            },
            _ => message.clone(),
        })
        .collect();
    serde_json::to_string(&state.with_history(shown, view_start))
}

/// `text` cut so that it and the note of its original length fit in
/// `limit` chars (the view then shows it as it is); `None` when it fits.
fn cut_for_view(text: &str, limit: usize) -> Option<String> {
    if text.len() <= limit {
        return None;
    }
    let total = text.chars().count();
    if total <= limit {
        return None;
    }
    let note = format!("\n... [truncated, original length {total} chars]");
    let keep = limit.saturating_sub(note.chars().count());
    let cut = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    Some(format!("{}{note}", &text[..cut]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state_with(history: Vec<Message>, view_start: usize) -> LoopState {
        let mut value = serde_json::to_value(LoopState::new("s", "system", "")).expect("json");
        value["history"] = serde_json::to_value(&history).expect("history");
        value["projection"] =
            serde_json::json!({"summary": "what happened", "view_start": view_start});
        serde_json::from_value(value).expect("a state")
    }

    #[test]
    fn summarized_turns_are_dropped_and_long_results_cut_as_the_view_cuts_them() {
        let long = "r".repeat(5000);
        let result = Message::tool("c2", long);
        let history = vec![
            Message::user("the task"),
            Message::assistant("old", Vec::new()),
            Message::user("old feedback"),
            Message::assistant("recent", Vec::new()),
            result,
        ];
        let state = state_with(history, 3);
        let shown = LoopState::from_json(&as_shown(&state, 1000).expect("json")).expect("state");
        let contents: Vec<&str> = shown.history().iter().map(|m| m.content.as_str()).collect();
        assert_eq!(contents.len(), 3, "{contents:?}");
        assert_eq!(contents[..2], ["the task", "recent"]);
        assert_eq!(shown.projection().view_start, 1);
        assert_eq!(shown.projection().summary.as_deref(), Some("what happened"));
        let cut = &shown.history()[2].content;
        assert_eq!(cut.chars().count(), 1000, "the view shows it as it is");
        assert!(cut.starts_with("rrr"));
        assert!(
            cut.ends_with("[truncated, original length 5000 chars]"),
            "{cut}"
        );
        assert_eq!(shown.history()[2].tool_call_id.as_deref(), Some("c2"));
        // Everything else is the state as it was.
        assert_eq!(shown.step(), state.step());
        assert_eq!(shown.node(), state.node());
    }

    #[test]
    fn a_state_without_a_pinned_task_or_compaction_keeps_its_history() {
        let history = vec![
            Message::assistant("a", Vec::new()),
            Message::user("b"),
            Message::assistant("c", Vec::new()),
        ];
        let state = state_with(history.clone(), 2);
        let shown = LoopState::from_json(&as_shown(&state, 1000).expect("json")).expect("state");
        assert_eq!(shown.history(), &history[..]);
        assert_eq!(shown.projection().view_start, 2);
        let uncompacted = state_with(history.clone(), 0);
        let shown =
            LoopState::from_json(&as_shown(&uncompacted, 1000).expect("json")).expect("state");
        assert_eq!(shown, uncompacted);
    }
}
