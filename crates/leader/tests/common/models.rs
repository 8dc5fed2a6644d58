//! Models the leader's integration tests script: one that holds a turn
//! until the test opens its gate, and one that answers by the position in
//! the conversation (so a resumed leader gets the turn it is at).

use std::sync::Arc;

use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{ChatModel, ChatRequest, ModelError, ModelStream, ToolCall};
use serde_json::json;
use tokio::sync::Semaphore;

/// Waits until `gate` has a permit (the permit goes back at once).
async fn pass(gate: &Semaphore) -> Result<(), ModelError> {
    gate.acquire()
        .await
        .map(drop)
        .map_err(|_| ModelError::Other("gate closed".into()))
}

/// A [`ChatModel`] that plays a script and holds turn `gate_turn` (0-based)
/// until [`GatedModel::open`] is called.
pub(crate) struct GatedModel {
    pub inner: ScriptedModel,
    gate_turn: usize,
    turns: std::sync::atomic::AtomicUsize,
    gate: Semaphore,
}

impl GatedModel {
    pub(crate) fn new(inner: ScriptedModel, gate_turn: usize) -> Self {
        Self {
            inner,
            gate_turn,
            turns: Default::default(),
            gate: Semaphore::new(0),
        }
    }
    /// A model whose one turn answers `text`, held until [`GatedModel::open`]
    /// (a job on it stays RUNNING until then).
    pub(crate) fn held_answer(text: &str) -> Self {
        Self::new(ScriptedModel::new([ScriptedTurn::text(text)]), 0)
    }
    pub(crate) fn open(&self) {
        self.gate.add_permits(1);
    }
}

#[async_trait::async_trait]
impl ChatModel for GatedModel {
    fn model_name(&self) -> &str {
        "gated-script"
    }
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let turn = self.turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if turn == self.gate_turn {
            pass(&self.gate).await?;
        }
        self.inner.stream(request).await
    }
}

/// A leader conversation: spawn agent `a1` on `slice_id` (call `c1`), the
/// `assign` turn, collect every result (call `c3`), and answer with a best
/// result of `gflops`.
pub(crate) fn spawn_assign_collect(
    slice_id: &str,
    assign: ScriptedTurn,
    gflops: f64,
) -> Vec<ScriptedTurn> {
    let spawn = json!({"name": "a1", "slice_id": slice_id, "instructions": "tune"});
    vec![
        ScriptedTurn::call("c1", "spawn_agent", &spawn.to_string()),
        assign,
        ScriptedTurn::call(
            "c3",
            "collect_result",
            r#"{"mode":"all","timeout_seconds":60}"#,
        ),
        ScriptedTurn::text(format!(
            "Done.\n```json\n{{\"best\":{{\"gflops\":{gflops:?}}}}}\n```"
        )),
    ]
}

/// An `assign_task` call (id `id`) giving agent `a1` one candidate, `A = a`.
pub(crate) fn assign_call(id: &str, instructions: &str, a: u32) -> ToolCall {
    let arguments = json!({
        "agent": "a1",
        "instructions": instructions,
        "parameters": {"candidates": [{"A": a}]},
    });
    ToolCall {
        id: id.into(),
        name: "assign_task".into(),
        arguments: arguments.to_string(),
    }
}

/// The leader conversation most tests need: [`spawn_assign_collect`] with
/// one task of one candidate (call `c2`).
pub(crate) fn one_task_script(slice_id: &str, gflops: f64) -> Arc<ConversationScript> {
    let assign = ScriptedTurn::tool_calls([assign_call("c2", "try", 1)]);
    Arc::new(ConversationScript::new(
        spawn_assign_collect(slice_id, assign, gflops),
        None,
    ))
}

/// A model that plays `turns` by position in the conversation (turn i =
/// the answer after i assistant messages), so a leader that resumes a job
/// from its checkpoint gets the turn the conversation is at. Turn
/// `hold_at` waits until [`ConversationScript::release`].
pub(crate) struct ConversationScript {
    turns: Vec<ScriptedTurn>,
    hold_at: Option<usize>,
    gate: Semaphore,
}

impl ConversationScript {
    pub(crate) fn new(turns: Vec<ScriptedTurn>, hold_at: Option<usize>) -> Self {
        Self {
            turns,
            hold_at,
            gate: Semaphore::new(0),
        }
    }
    pub(crate) fn release(&self) {
        self.gate.add_permits(1_000);
    }
}

#[async_trait::async_trait]
impl ChatModel for ConversationScript {
    fn model_name(&self) -> &str {
        "conversation-script"
    }
    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let index = request
            .messages
            .iter()
            .filter(|m| m.role == mtswarm_core::Role::Assistant)
            .count();
        if self.hold_at == Some(index) {
            pass(&self.gate).await?;
        }
        let turn = self
            .turns
            .get(index)
            .cloned()
            .ok_or_else(|| ModelError::Other(format!("no scripted turn {index}")))?;
        ScriptedModel::new([turn]).stream(request).await
    }
}
