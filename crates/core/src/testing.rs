//! A [`ChatModel`] that replays pre-built turns, for tests, benchmarks and
//! replays: text, thinking, tool calls (with raw, possibly malformed
//! argument text), usage, and errors before or during the stream. It can
//! record every request it receives so a test can check what the model saw.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::model::{
    ChatModel, ChatRequest, FinishReason, ModelError, ModelEvent, ModelStream, ToolCall, Usage,
};

/// One scripted turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedTurn {
    /// Returned by `stream()` itself instead of a stream.
    pub error: Option<ModelError>,
    /// The stream items, in order.
    pub items: Vec<Result<ModelEvent, ModelError>>,
}

impl ScriptedTurn {
    /// A turn that answers with `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            error: None,
            items: vec![
                Ok(ModelEvent::TextDelta { text: text.into() }),
                Ok(ModelEvent::Finish {
                    reason: FinishReason::Stop,
                }),
            ],
        }
    }

    /// A turn that requests these calls.
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCall>) -> Self {
        let mut items: Vec<Result<ModelEvent, ModelError>> = calls
            .into_iter()
            .map(|call| Ok(ModelEvent::ToolCall { call }))
            .collect();
        items.push(Ok(ModelEvent::Finish {
            reason: FinishReason::ToolCalls,
        }));
        Self { error: None, items }
    }

    /// A turn with one call (`arguments` is raw JSON text).
    pub fn call(id: &str, name: &str, arguments: &str) -> Self {
        Self::tool_calls([ToolCall {
            id: id.to_owned(),
            name: name.to_owned(),
            arguments: arguments.to_owned(),
        }])
    }

    /// A turn with neither text nor tool calls.
    pub fn empty() -> Self {
        Self {
            error: None,
            items: vec![Ok(ModelEvent::Finish {
                reason: FinishReason::Stop,
            })],
        }
    }

    /// A turn that fails before streaming.
    pub fn error(error: ModelError) -> Self {
        Self {
            error: Some(error),
            items: Vec::new(),
        }
    }

    /// Add reasoning text at the start of the turn.
    pub fn with_thinking(mut self, text: impl Into<String>) -> Self {
        self.items
            .insert(0, Ok(ModelEvent::ThinkingDelta { text: text.into() }));
        self
    }

    /// Report token usage at the end of the turn.
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.items.push(Ok(ModelEvent::Usage {
            usage: Usage {
                input_tokens,
                output_tokens,
            },
        }));
        self
    }

    /// Fail in the middle of the stream.
    pub fn then_fail(mut self, error: ModelError) -> Self {
        self.items.push(Err(error));
        self
    }
}

/// Replays a queue of turns; fails with `ModelError::Other` once the script
/// is exhausted (a test that needs more turns than it scripted is wrong).
pub struct ScriptedModel {
    name: String,
    turns: Mutex<VecDeque<ScriptedTurn>>,
    record: bool,
    requests: Mutex<Vec<ChatRequest>>,
    context_window: Option<u64>,
    whole_conversation: bool,
}

impl ScriptedModel {
    /// A model that replays `turns`, one per request, in order.
    pub fn new(turns: impl IntoIterator<Item = ScriptedTurn>) -> Self {
        Self {
            name: "scripted".to_owned(),
            turns: Mutex::new(turns.into_iter().collect()),
            record: true,
            requests: Mutex::new(Vec::new()),
            context_window: None,
            whole_conversation: false,
        }
    }

    /// Report a context window of `tokens` (as a small local server would).
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Say that the model reads its whole conversation, as the builtin
    /// policies do ([`ChatModel::reads_whole_conversation`]).
    pub fn reading_whole_conversation(mut self) -> Self {
        self.whole_conversation = true;
        self
    }

    /// Report `name` as the model name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Do not keep the requests (benchmarks).
    pub fn without_recording(mut self) -> Self {
        self.record = false;
        self
    }

    /// Append a turn to the script.
    pub fn push(&self, turn: ScriptedTurn) {
        self.turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(turn);
    }

    /// Turns not yet played.
    pub fn remaining(&self) -> usize {
        self.turns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<ChatRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The last user message of the `index`-th request (where feedback
    /// to the model goes: a gate's refusal, a protocol error's note); empty
    /// when there is no such request or message.
    pub fn last_user_message(&self, index: usize) -> String {
        self.requests()
            .get(index)
            .and_then(|request| {
                request
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == crate::model::Role::User)
                    .map(|m| m.content.clone())
            })
            .unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl ChatModel for ScriptedModel {
    fn model_name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> Option<u64> {
        self.context_window
    }

    fn reads_whole_conversation(&self) -> bool {
        self.whole_conversation
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        if self.record {
            self.requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(request);
        }
        self.play()
    }

    async fn stream_shared(
        &self,
        request: std::sync::Arc<ChatRequest>,
    ) -> Result<ModelStream, ModelError> {
        if self.record {
            self.requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((*request).clone());
        }
        self.play()
    }
}

impl ScriptedModel {
    fn play(&self) -> Result<ModelStream, ModelError> {
        let turn = self
            .turns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .ok_or_else(|| ModelError::Other("scripted model has no turns left".to_owned()))?;
        if let Some(error) = turn.error {
            return Err(error);
        }
        Ok(Box::pin(futures::stream::iter(turn.items)))
    }
}
