//! Test tools and engine setup shared by the integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::*;
use serde_json::{Value, json};

type Behaviour = Arc<
    dyn Fn(
            Value,
            ToolContext,
        ) -> Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>
        + Send
        + Sync,
>;

/// A tool whose flags and behaviour are set by the test.
pub(crate) struct FnTool {
    spec: ToolSpec,
    pub resource: Option<String>,
    pub normalize_error: Option<String>,
    behaviour: Behaviour,
}

/// A test tool may report any effect.
const ALL_EFFECTS: &[EffectKind] = &[
    EffectKind::Mutation,
    EffectKind::Evidence,
    EffectKind::State,
];

fn object_schema() -> Value {
    json!({"type": "object"})
}

impl FnTool {
    pub(crate) fn new<F, Fut>(name: &str, behaviour: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        let mut spec = ToolSpec::new("test", "test tool", object_schema).effects(ALL_EFFECTS);
        spec.name = name.to_owned().into();
        Self {
            spec,
            resource: None,
            normalize_error: None,
            behaviour: Arc::new(move |args, ctx| Box::pin(behaviour(args, ctx))),
        }
    }
    /// A tool answering with a fixed text.
    pub(crate) fn echo(name: &str, reply: &str) -> Self {
        let reply = reply.to_owned();
        Self::new(name, move |_, _| {
            let reply = reply.clone();
            async move { Ok(ToolOutput::text(reply)) }
        })
    }
    /// A tool answering with fixed effects.
    pub(crate) fn with_effects(name: &str, effects: Vec<Effect>) -> Self {
        Self::new(name, move |_, _| {
            let effects = effects.clone();
            async move {
                let mut out = ToolOutput::text("done");
                out.effects = effects;
                Ok(out)
            }
        })
    }
    pub(crate) fn risk(mut self, risk: Risk) -> Self {
        self.spec = self.spec.risk(risk);
        self
    }
    /// Read-only and concurrency-safe, as the engine's read-only tools are.
    pub(crate) fn concurrent(mut self) -> Self {
        self.spec = self.spec.concurrent();
        self
    }
    /// Changes something outside its process.
    pub(crate) fn writes(mut self) -> Self {
        self.spec = self.spec.writes();
        self
    }
    pub(crate) fn hardware(mut self, resource: &str) -> Self {
        self.spec = self.spec.hardware();
        self.resource = Some(resource.to_owned());
        self
    }
    pub(crate) fn schema(mut self, schema: Value) -> Self {
        self.spec.schema = ToolSchema::Given(schema);
        self
    }
    /// Reports effects of these kinds only.
    pub(crate) fn declaring(mut self, kinds: &'static [EffectKind]) -> Self {
        self.spec = self.spec.effects(kinds);
        self
    }
    pub(crate) fn failing_normalize(mut self, message: &str) -> Self {
        self.normalize_error = Some(message.to_owned());
        self
    }
}

#[async_trait::async_trait]
impl Tool for FnTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn resource(&self) -> Option<String> {
        self.resource.clone()
    }
    fn normalize(&self, args: Value) -> Result<Value, NormalizeError> {
        match &self.normalize_error {
            Some(message) => Err(NormalizeError::invalid(message.clone())),
            None => Ok(args),
        }
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        (self.behaviour)(args, ctx.clone()).await
    }
}

pub(crate) fn registry(tools: Vec<FnTool>) -> ToolRegistry {
    let mut registry = ToolRegistry::new();
    for tool in tools {
        registry.register(Arc::new(tool)).expect("valid test tool");
    }
    registry
}

pub(crate) fn engine(
    config: EngineConfig,
    turns: Vec<ScriptedTurn>,
    registry: ToolRegistry,
    policy: RiskPolicy,
) -> (Engine, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new(turns));
    let engine = Engine::new(
        config,
        model.clone(),
        registry,
        policy,
        Arc::new(LocalResourceLock::default()),
    )
    .with_clock(Arc::new(ManualClock::new(1_700_000_000_000)));
    (engine, model)
}

/// A run whose first two turns are `first` (calls the engine must answer
/// as a protocol error: the first time it asks again without a word, the
/// second time it tells the model), then a good `read_file` call, then
/// "done"; everything runs without asking.
pub(crate) async fn refused_then_read(
    first: ScriptedTurn,
) -> (Vec<Event>, Outcome, Arc<ScriptedModel>) {
    let (engine, model) = engine(
        EngineConfig::default(),
        vec![
            first.clone(),
            first,
            ScriptedTurn::call("c2", "read_file", r#"{"path": "a.c"}"#),
            ScriptedTurn::text("done"),
        ],
        registry(vec![FnTool::echo("read_file", "contents")]),
        auto_all(),
    );
    let (events, outcome) = run_go(&engine).await;
    (events, outcome, model)
}

pub(crate) fn auto_all() -> RiskPolicy {
    RiskPolicy::default().with_auto_approve(AutoApprove::All)
}

/// Drive a run to its end, failing the test instead of hanging.
pub(crate) async fn run(stream: RunStream) -> (Vec<Event>, Outcome) {
    tokio::time::timeout(Duration::from_secs(10), stream.collect_all())
        .await
        .expect("the run finished within 10 s")
}

/// Starts `engine` on the task "go" (session "s", no system prompt) and
/// drives the run to its end.
pub(crate) async fn run_go(engine: &Engine) -> (Vec<Event>, Outcome) {
    let (stream, _) = engine.start("s", "", "go");
    run(stream).await
}

/// Starts `engine` on the task "go", cancels the run once `started` fires
/// (the test's tool or model got the call) and returns how the run ended.
pub(crate) async fn cancel_once_started(
    engine: &Engine,
    started: tokio::sync::oneshot::Receiver<()>,
) -> Outcome {
    let (stream, handle) = engine.start("s", "", "go");
    let control = handle.control();
    let runner = tokio::spawn(stream.collect_all());
    tokio::time::timeout(Duration::from_secs(10), started)
        .await
        .expect("the call started")
        .expect("sender kept");
    control.cancel();
    let (_, outcome) = tokio::time::timeout(Duration::from_secs(10), runner)
        .await
        .expect("run ends after cancel")
        .expect("task ok");
    outcome
}

/// A script of one tool call, then the final answer `answer`.
pub(crate) fn call_then(id: &str, tool: &str, args: &str, answer: &str) -> Vec<ScriptedTurn> {
    vec![
        ScriptedTurn::call(id, tool, args),
        ScriptedTurn::text(answer),
    ]
}

pub(crate) fn final_text(outcome: &Outcome) -> &str {
    match outcome {
        Outcome::Final { text, .. } => text,
        other => panic!("expected a final answer, got {other:?}"),
    }
}

pub(crate) fn stop_reason(outcome: &Outcome) -> StopReason {
    match outcome {
        Outcome::Stopped { reason, .. } => *reason,
        other => panic!("expected a stop, got {other:?}"),
    }
}

pub(crate) fn tool_results(events: &[Event]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult {
                call_id,
                ok,
                content,
                ..
            } => Some((call_id.clone(), *ok, content.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn call(id: &str, name: &str, args: &str) -> ToolCall {
    ToolCall {
        id: id.to_owned(),
        name: name.to_owned(),
        arguments: args.to_owned(),
    }
}

/// The content of the tool message answering `call_id` in the history.
pub(crate) fn observation<'a>(state: &'a LoopState, call_id: &str) -> &'a str {
    state
        .history()
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call_id))
        .map(|m| m.content.as_str())
        .unwrap_or_else(|| panic!("no tool message for {call_id}"))
}
