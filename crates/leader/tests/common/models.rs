//! Models the leader's integration tests script: one that holds a turn
//! until the test opens its gate, and one that answers by the position in
//! the conversation (so a resumed leader gets the turn it is at).

use std::sync::Arc;

use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{ChatModel, ChatRequest, ModelError, ModelStream};
use tokio::sync::Semaphore;

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
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ModelError::Other("gate closed".into()))?;
        }
        self.inner.stream(request).await
    }
}

/// The leader conversation most tests need: spawn agent `a1` on
/// `slice_id`, give it one task with one candidate, collect it, and answer
/// with a best result of `gflops`.
pub(crate) fn one_task_script(slice_id: &str, gflops: f64) -> Arc<ConversationScript> {
    let spawn = serde_json::json!({"name": "a1", "slice_id": slice_id, "instructions": "tune"});
    Arc::new(ConversationScript::new(
        vec![
            ScriptedTurn::call("c1", "spawn_agent", &spawn.to_string()),
            ScriptedTurn::call(
                "c2",
                "assign_task",
                r#"{"agent":"a1","instructions":"try","parameters":{"candidates":[{"A":1}]}}"#,
            ),
            ScriptedTurn::call(
                "c3",
                "collect_result",
                r#"{"mode":"all","timeout_seconds":60}"#,
            ),
            ScriptedTurn::text(format!(
                "Done.\n```json\n{{\"best\":{{\"gflops\":{gflops:?}}}}}\n```"
            )),
        ],
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
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ModelError::Other("gate closed".into()))?;
        }
        let turn = self
            .turns
            .get(index)
            .cloned()
            .ok_or_else(|| ModelError::Other(format!("no scripted turn {index}")))?;
        ScriptedModel::new([turn]).stream(request).await
    }
}
