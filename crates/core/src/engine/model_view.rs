//! The model view: the request of each model call, kept in step with the
//! history incrementally, with the injected session context, and the
//! streamed model turn.
//!
//! The request has the shape every chat template accepts: one system
//! message, first; no two user or two assistant messages in a row (such
//! neighbours are merged); the per-step session context appended to the
//! last user message or tool result (or a user message of its own), never a
//! trailing system message. Everything before that per-step tail stays
//! byte-identical from one step to the next, so server prefix caches hit.

use std::sync::Arc;

use futures::StreamExt;

use super::Run;
use super::config::InjectionPlacement;
use super::stream::Emitter;
use crate::clock::format_rfc3339;
use crate::context::view_message;
use crate::event::EventKind;
use crate::middleware::{ModelCallInput, ModelTurn, SystemPromptInput, run_chain};
use crate::model::{
    ChatModel, ChatRequest, Message, ModelError, ModelEvent, Role, ToolChoice, push_merged,
};

/// Items of each working-state list the per-step reminder shows (the
/// latest; see [`crate::WorkingState::model_view`]). One: the reminder is
/// the request's tail, read again at every step, and the earlier items are
/// in the tool results above it.
const WORKING_LIST_ITEMS_SHOWN: usize = 1;

/// The model view of `history[covered_from..covered_to]`, built
/// incrementally: each step only converts the messages added since.
pub(super) struct ViewCache {
    /// The request of the last model call, kept and extended in place:
    /// `[system?, task?, summary?, view..., injection?]`. The model gets a
    /// shared reference, so once it is done with it the engine owns it
    /// alone again and appending costs no copy.
    request: Arc<ChatRequest>,
    has_system: bool,
    injected: Injected,
    built_from: usize,
    built_for_compactions: u32,
    covered_to: usize,
    /// Estimated tokens of everything but the injection.
    tokens: u64,
    valid: bool,
    tools_for_groups: Option<Vec<String>>,
    /// The next request asks for a tool call (`tool_choice: required`).
    tool_call_required: bool,
}

impl Default for ViewCache {
    fn default() -> Self {
        Self {
            request: Arc::new(ChatRequest {
                messages: Vec::new(),
                tools: Vec::new(),
                tool_choice: ToolChoice::Auto,
                max_tokens: None,
                temperature: None,
            }),
            has_system: false,
            injected: Injected::Nothing,
            built_from: 0,
            built_for_compactions: 0,
            covered_to: 0,
            tokens: 0,
            valid: false,
            tools_for_groups: None,
            tool_call_required: false,
        }
    }
}

impl ViewCache {
    /// The next request asks for a tool call rather than an answer: the
    /// completion gate refused the answer, and what it asks for is a call
    /// (a small model told so in words often answers the same again).
    pub(super) fn require_tool_call(&mut self) {
        self.tool_call_required = true;
    }
}

/// Where the last request's session context is, so the next step takes it
/// out before extending the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Injected {
    Nothing,
    /// A user message of its own, last.
    Message,
    /// Appended to the last message, whose content was this long before.
    Appended {
        original_len: usize,
    },
}

impl Run {
    /// Bring the kept request up to date with the history: append what was
    /// added since the last call, or rebuild after a compaction.
    pub(super) fn sync_view(&mut self) {
        let history = &self.state.history;
        let projection = &self.state.projection;
        let context = &self.engine.config.context;
        let estimator = &self.engine.estimator;
        let pinned = history.first().filter(|m| m.role == Role::User);
        let cache = &mut self.view;
        let request = Arc::make_mut(&mut cache.request);
        match cache.injected {
            Injected::Nothing => {}
            Injected::Message => {
                request.messages.pop();
            }
            Injected::Appended { original_len } => {
                if let Some(last) = request.messages.last_mut() {
                    last.content.truncate(original_len);
                }
            }
        }
        cache.injected = Injected::Nothing;
        if !cache.valid
            || cache.built_from != projection.view_start
            || cache.built_for_compactions != self.state.recovery.compactions
            || cache.covered_to > history.len()
        {
            request.messages.clear();
            cache.tokens = 0;
            let prompt = &self.state.system_prompt;
            cache.has_system = !prompt.is_empty();
            if cache.has_system {
                request.messages.push(Message::system(prompt.clone()));
            }
            if projection.view_start > 0 {
                if let Some(task) = pinned {
                    request.messages.push(task.clone());
                }
                if let Some(summary) = &projection.summary {
                    push_merged(
                        &mut request.messages,
                        Message::user(format!("Summary of the earlier conversation:\n{summary}")),
                    );
                }
            }
            cache.tokens = request.messages.iter().map(|m| estimator.estimate(m)).sum();
            cache.built_from = projection.view_start;
            cache.covered_to = projection.view_start;
            cache.built_for_compactions = self.state.recovery.compactions;
            cache.valid = true;
        }
        for message in &history[cache.covered_to.min(history.len())..] {
            let shown = view_message(message, context);
            cache.tokens += estimator.estimate(&shown);
            push_merged(&mut request.messages, shown);
        }
        cache.covered_to = history.len();
    }

    /// Estimated tokens of the view without the trailing injection.
    pub(super) fn view_tokens(&self) -> u64 {
        self.view.tokens
    }

    pub(super) fn pinned_task(&self) -> Option<&Message> {
        self.state.history.first().filter(|m| m.role == Role::User)
    }

    /// The request for the next model call (shared with the kept view).
    pub(super) async fn build_request(&mut self) -> Arc<ChatRequest> {
        let middlewares = self.engine.middlewares.clone();
        let prompt = if middlewares.is_empty() {
            None
        } else {
            Some(
                run_chain(
                    &middlewares,
                    SystemPromptInput {
                        session_id: self.session.clone(),
                        step: self.state.step,
                        prompt: self.state.system_prompt.clone(),
                    },
                    |m, i, n| m.on_system_prompt(i, n),
                    Box::new(|input: SystemPromptInput| Box::pin(async move { input.prompt })),
                )
                .await,
            )
        };
        self.sync_view();
        let injection = self.injection();
        let groups_changed = self.view.tools_for_groups.as_ref() != Some(&self.state.active_groups);
        let specs = groups_changed.then(|| self.engine.registry.specs(&self.state.active_groups));
        let config = &self.engine.config;
        let cache = &mut self.view;
        let request = Arc::make_mut(&mut cache.request);
        if let Some(prompt) = prompt {
            match (cache.has_system, prompt.is_empty()) {
                (true, false) => {
                    if let Some(first) = request.messages.first_mut()
                        && first.content != prompt
                    {
                        first.content = prompt;
                    }
                }
                (true, true) => {
                    request.messages.remove(0);
                    cache.has_system = false;
                }
                (false, false) => {
                    request.messages.insert(0, Message::system(prompt));
                    cache.has_system = true;
                }
                (false, true) => {}
            }
        }
        if let Some(injection) = injection {
            let into_last = match (config.injection.placement, request.messages.last()) {
                (_, Some(last)) if last.role == Role::User => true,
                (InjectionPlacement::ToolResult, Some(last)) => last.role == Role::Tool,
                _ => false,
            };
            match request.messages.last_mut().filter(|_| into_last) {
                Some(last) => {
                    cache.injected = Injected::Appended {
                        original_len: last.content.len(),
                    };
                    last.content.push_str("\n\n");
                    last.content.push_str(&injection);
                }
                None => {
                    request.messages.push(Message::user(injection));
                    cache.injected = Injected::Message;
                }
            }
        }
        if let Some(specs) = specs {
            request.tools = specs;
            cache.tools_for_groups = Some(self.state.active_groups.clone());
        }
        request.max_tokens = config.max_output_tokens;
        request.temperature = config.temperature;
        request.tool_choice =
            if std::mem::take(&mut cache.tool_call_required) && !request.tools.is_empty() {
                ToolChoice::Required
            } else {
                ToolChoice::Auto
            };
        cache.request.clone()
    }

    pub(super) fn injection(&self) -> Option<String> {
        use std::fmt::Write as _;
        let config = &self.engine.config;
        let injection = &config.injection;
        if !(injection.time || injection.working_state || injection.context_usage) {
            return None;
        }
        let mut text = String::from("[session context]");
        if injection.time {
            let _ = write!(
                text,
                "\ncurrent time: {}",
                format_rfc3339(self.engine.clock.now_ms())
            );
        }
        if injection.context_usage {
            let used = self.view_tokens();
            let window = config.context.window_tokens.max(1);
            let _ = write!(
                text,
                "\ncontext: {used} of {window} tokens ({}%); step {} of {}",
                used.saturating_mul(100) / window,
                self.state.step,
                config.max_steps
            );
            if let Some(budget) = config.token_budget {
                let _ = write!(
                    text,
                    "; tokens spent {} of {budget}",
                    self.state.usage.total()
                );
            }
        }
        if injection.working_state {
            if !self.state.working.is_empty() {
                let json = self
                    .state
                    .working
                    .model_view(WORKING_LIST_ITEMS_SHOWN)
                    .to_string();
                let _ = write!(text, "\nworking state: {json}");
            }
            let ledger = &self.state.evidence;
            if let Some(mutation) = &ledger.last_mutation {
                let _ = write!(
                    text,
                    "\nlatest change: {} at step {}",
                    mutation.target, mutation.step
                );
            }
            let mut kinds: Vec<&str> = ledger.records.iter().map(|r| r.kind.as_str()).collect();
            kinds.sort_unstable();
            kinds.dedup();
            for kind in kinds {
                let status = if ledger.has_valid(kind) {
                    "passed on the current code"
                } else if ledger.has_voided(kind) {
                    "passed earlier, void after the latest change"
                } else {
                    "failed"
                };
                let _ = write!(text, "\nevidence {kind}: {status}");
            }
        }
        Some(text)
    }

    /// One model call through the middleware chain, streamed into events
    /// (unless it is a summarization request).
    pub(super) async fn model_turn(
        &mut self,
        request: Arc<ChatRequest>,
        summarization: bool,
    ) -> Result<ModelTurn, ModelError> {
        let middlewares = self.engine.middlewares.clone();
        let input = ModelCallInput {
            session_id: self.session.clone(),
            step: self.state.step,
            model: self.engine.model.model_name().to_owned(),
            provider: self.engine.model.provider_name().to_owned(),
            summarization,
            request,
        };
        let model = self.engine.model.clone();
        let step = self.state.step;
        let emitter = &mut self.emitter;
        let mut cancel = self.cancel_rx.clone();
        run_chain(
            &middlewares,
            input,
            |m, i, n| m.on_model_call(i, n),
            Box::new(move |input: ModelCallInput| {
                Box::pin(async move {
                    let streamed = stream_turn(model.as_ref(), input.request, emitter, step, !summarization);
                    tokio::select! {
                        biased;
                        turn = streamed => turn,
                        _ = cancel.wait_for(|c| *c) => Err(ModelError::Other("cancelled".to_owned())),
                    }
                })
            }),
        )
        .await
    }
}

/// Stream one model turn, emitting thinking and text deltas as they come.
async fn stream_turn(
    model: &dyn ChatModel,
    request: Arc<ChatRequest>,
    emitter: &mut Emitter,
    step: u32,
    emit: bool,
) -> Result<ModelTurn, ModelError> {
    let mut stream = model.stream_shared(request).await?;
    let mut turn = ModelTurn::default();
    while let Some(item) = stream.next().await {
        match item? {
            ModelEvent::ThinkingDelta { text } => {
                if emit {
                    emitter.emit(step, EventKind::Thinking { text: text.clone() });
                }
                turn.thinking.push_str(&text);
            }
            ModelEvent::TextDelta { text } => {
                if emit {
                    emitter.emit(step, EventKind::TextDelta { text: text.clone() });
                }
                turn.text.push_str(&text);
            }
            ModelEvent::ToolCall { call } => turn.tool_calls.push(call),
            ModelEvent::Usage { usage } => {
                let total = turn.usage.get_or_insert_with(Default::default);
                total.input_tokens += usage.input_tokens;
                total.output_tokens += usage.output_tokens;
            }
            ModelEvent::Finish { reason } => turn.finish = Some(reason),
        }
    }
    Ok(turn)
}
