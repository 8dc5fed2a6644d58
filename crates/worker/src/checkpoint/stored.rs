//! What of a session's loop state goes into its checkpoint. The engine's
//! state keeps everything the run ever saw: every turn a compaction
//! already replaced by its summary, every tool result in full although the
//! model only sees its first `max_tool_result_chars`, every transition,
//! every compile and benchmark summary and every piece of evidence. Stored
//! as it is, a long session's checkpoint grows with its steps until the
//! checkpoints bucket refuses it (the server's message size limit) and the
//! session can no longer be resumed.
//!
//! The checkpoint is the state as far as a resume needs it, and no more:
//!
//! - the history as the model is shown it: the pinned task, the summary and
//!   the turns after the last compaction, each tool result (and each
//!   finished call's observation of the current step) cut where the view
//!   cuts it, so a resumed run sends the model the same request and the
//!   stored history is bounded by the context budget (window and per-result
//!   limit), not by the session;
//! - the latest [`KEPT_TRANSITIONS`] transitions (the engine reads only the
//!   latest one and, for a paused run, the pause of the current step);
//! - the latest [`KEPT_LIST_ITEMS`] entries of the working state's compile
//!   and benchmark summaries (which the model is shown every turn, and a
//!   result lists);
//! - per evidence kind, the records the completion gate and the injected
//!   session context decide on: the latest passing record after the latest
//!   change, the latest passing record it voided, and the latest record;
//! - everything else (step, node, calls of the step, counters, usage,
//!   groups, event numbering), which does not grow with the session.
//!
//! Format 2 stored all of it in one record, so every write repeated the
//! whole shown history and the bytes per write grew with the steps until
//! the first compaction. Format 3 (written now) stores the history message
//! by message under keys of their own (`history`) and the head, the rest
//! of the state, under the session's key: a write stores the messages not
//! stored yet and the head, whose size does not grow with the steps.
//!
//! A checkpoint written whole (format 1) or bounded in one record
//! (format 2) is still read: both are a `LoopState` in JSON.

use std::collections::{BTreeMap, BTreeSet};

use mtswarm_core::working::{EvidenceLedger, EvidenceRecord};
use mtswarm_core::{ContextConfig, LoopState, Message, Role, truncate_for_model};
use serde_json::Value;

/// Version of the `state_json` format: the core's `LoopState` JSON, since
/// version 2 bounded to what a resume needs, since version 3 without the
/// history, whose messages are records of their own (`history`). Versions
/// 1 (the whole state) and 2 are still read.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 3;

/// Transitions a checkpoint keeps (the latest ones). A step makes about
/// five; the latest step's, including an approval pause, always fit.
pub(crate) const KEPT_TRANSITIONS: usize = 16;

/// Entries of each working-state list a checkpoint keeps (the latest).
pub(crate) const KEPT_LIST_ITEMS: usize = 16;

/// How the model is shown a state: what bounds its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShownLimits {
    /// Chars of a tool result the model sees (the engine's
    /// `ContextConfig::max_tool_result_chars`).
    pub(crate) max_tool_result_chars: usize,
}

impl ShownLimits {
    /// The limits of an engine run with `context`.
    pub(crate) fn of(context: &ContextConfig) -> Self {
        Self {
            max_tool_result_chars: context.max_tool_result_chars,
        }
    }
}

impl Default for ShownLimits {
    fn default() -> Self {
        Self::of(&ContextConfig::default())
    }
}

/// `state` as a format 2 checkpoint stores it (see the module docs), in
/// JSON: the bounded state with its shown history in it.
#[cfg(test)]
pub(crate) fn checkpoint_json(
    state: &LoopState,
    limits: ShownLimits,
) -> Result<String, serde_json::Error> {
    let mut value = serde_json::to_value(state)?;
    let Some(fields) = value.as_object_mut() else {
        return serde_json::to_string(state);
    };
    let history = shown_history(state, limits);
    if history.dropped > 0 || history.cut {
        fields.insert("history".into(), serde_json::to_value(&history.messages)?);
    }
    let transitions = state.transitions();
    if transitions.len() > KEPT_TRANSITIONS {
        let kept = &transitions[transitions.len() - KEPT_TRANSITIONS..];
        fields.insert("transitions".into(), serde_json::to_value(kept)?);
    }
    bound_the_rest(fields, state, limits, history.dropped)?;
    serde_json::to_string(&value)
}

/// `state` as the head of a format 3 checkpoint stores it, but for where
/// its history is: the bounded state without its history, which is stored
/// message by message (`history`). Serializes neither the history nor the
/// older transitions, so its cost does not grow with the run either.
pub(crate) fn head_fields(
    state: &LoopState,
    limits: ShownLimits,
) -> Result<serde_json::Map<String, Value>, serde_json::Error> {
    let mut fields = match serde_json::to_value(state.without_history(KEPT_TRANSITIONS))? {
        Value::Object(fields) => fields,
        _ => serde_json::Map::new(),
    };
    fields.remove("history");
    bound_the_rest(&mut fields, state, limits, shown_range(state).dropped())?;
    Ok(fields)
}

/// What both formats bound alike in `fields` (the JSON of `state`): the
/// view start past `dropped` summarized messages, the observations of the
/// step's calls, the working lists and the evidence.
fn bound_the_rest(
    fields: &mut serde_json::Map<String, Value>,
    state: &LoopState,
    limits: ShownLimits,
    dropped: usize,
) -> Result<(), serde_json::Error> {
    if dropped > 0 {
        fields.insert(
            "projection".into(),
            serde_json::to_value(mtswarm_core::state::ContextProjection {
                summary: state.projection().summary.clone(),
                view_start: state.projection().view_start - dropped,
            })?,
        );
    }
    if let Some(Value::Array(calls)) = fields.get_mut("calls") {
        for call in calls {
            if call["status"]["status"] == "finished"
                && let Some(Value::String(observation)) = call["status"].get_mut("observation")
                && let Some(cut) = cut_to_view(observation, limits.max_tool_result_chars)
            {
                *observation = cut;
            }
        }
    }
    if let Some(Value::Object(working)) = fields.get_mut("working") {
        for list in ["compile_results", "benchmark_results"] {
            if let Some(Value::Array(items)) = working.get_mut(list)
                && items.len() > KEPT_LIST_ITEMS
            {
                items.drain(..items.len() - KEPT_LIST_ITEMS);
            }
        }
    }
    if let Some(ledger) = decisive_evidence(state.evidence()) {
        fields.insert("evidence".into(), serde_json::to_value(ledger)?);
    }
    Ok(())
}

/// Where the history a checkpoint keeps lies in the state's: the pinned
/// task (index 0) and `first..len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShownRange {
    /// First message shown after the pinned one (at least 1).
    pub(crate) first: usize,
    /// Messages in the state's history.
    pub(crate) len: usize,
}

impl ShownRange {
    /// Summarized messages left out (after the pinned task).
    fn dropped(self) -> usize {
        self.first - 1
    }
}

/// The part of `state`'s history the model is shown. The engine's view of
/// a compacted history is the pinned task, the summary, then
/// `history[view_start..]`; what lies between the task and `view_start` is
/// never shown again.
pub(crate) fn shown_range(state: &LoopState) -> ShownRange {
    let history = state.history();
    let view_start = state.projection().view_start;
    let pinned = history.first().is_some_and(|m| m.role == Role::User);
    // Without a pinned task the view still needs `view_start > 0` to show
    // the summary, so only a history that starts with the task is trimmed.
    let first = if pinned && view_start > 1 && view_start <= history.len() {
        view_start
    } else {
        1
    };
    ShownRange {
        first,
        len: history.len(),
    }
}

/// `message` as a checkpoint keeps it: a tool result cut where the view
/// cuts it (`None`: kept as it is).
pub(crate) fn cut_message(message: &Message, limits: ShownLimits) -> Option<Message> {
    (message.role == Role::Tool)
        .then(|| cut_to_view(&message.content, limits.max_tool_result_chars))
        .flatten()
        .map(|content| Message {
            content,
            ..message.clone()
        })
}

/// The history a checkpoint keeps, and how it differs from the state's.
#[cfg(test)]
struct ShownHistory {
    messages: Vec<Message>,
    /// Summarized messages left out (after the pinned task).
    dropped: usize,
    /// Some tool result was cut.
    cut: bool,
}

/// The history as the model is shown it (see [`shown_range`]).
#[cfg(test)]
fn shown_history(state: &LoopState, limits: ShownLimits) -> ShownHistory {
    let history = state.history();
    let range = shown_range(state);
    let kept = history
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || *i >= range.first)
        .map(|(_, m)| m);
    let mut cut = false;
    let messages = kept
        .map(|message| match cut_message(message, limits) {
            Some(shorter) => {
                cut = true;
                shorter
            }
            None => message.clone(),
        })
        .collect();
    ShownHistory {
        messages,
        dropped: range.dropped(),
        cut,
    }
}

/// `text` cut so that it, with the view's note of its original length,
/// fits in `limit` chars: the view then shows the cut text as it is.
/// `None` when the text fits already.
fn cut_to_view(text: &str, limit: usize) -> Option<String> {
    // The byte length bounds the char count: most results are not counted.
    let chars = (text.len() > limit)
        .then(|| text.chars().count())
        .filter(|&chars| chars > limit)?;
    // The note `truncate_for_model` appends names the original length.
    let note = "\n... [truncated, original length  chars]".len() + chars.to_string().len();
    Some(truncate_for_model(text, limit.saturating_sub(note)).into_owned())
}

/// The ledger reduced to the records that decide its answers (`has_valid`,
/// `has_voided`, the kinds present), in their order; `None` when every
/// record decides something.
fn decisive_evidence(ledger: &EvidenceLedger) -> Option<EvidenceLedger> {
    let after_change =
        |r: &EvidenceRecord| ledger.last_mutation.as_ref().is_none_or(|m| r.seq > m.seq);
    // Per kind: latest valid pass, latest voided pass, latest record.
    let mut keep: BTreeMap<&str, [Option<usize>; 3]> = BTreeMap::new();
    for (i, record) in ledger.records.iter().enumerate() {
        let slots = keep.entry(record.kind.as_str()).or_default();
        if record.passed {
            slots[usize::from(!after_change(record))] = Some(i);
        }
        slots[2] = Some(i);
    }
    let kept: BTreeSet<usize> = keep.values().flatten().flatten().copied().collect();
    if kept.len() == ledger.records.len() {
        return None;
    }
    Some(EvidenceLedger {
        records: kept.iter().map(|&i| ledger.records[i].clone()).collect(),
        last_mutation: ledger.last_mutation.clone(),
        next_seq: ledger.next_seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_result_is_shown_as_it_is_and_names_its_original_length() {
        let text = "é".repeat(5000);
        let cut = cut_to_view(&text, 1000).expect("cut");
        assert_eq!(cut.chars().count(), 1000);
        assert!(cut.starts_with("ééé"));
        assert!(
            cut.ends_with("[truncated, original length 5000 chars]"),
            "{cut}"
        );
        assert_eq!(truncate_for_model(&cut, 1000), cut.as_str());
        assert_eq!(cut_to_view(&"é".repeat(1000), 1000), None);
        assert_eq!(cut_to_view("short", 1000), None);
    }
}
