//! Middleware onion order, hooks that change inputs and outputs, and the
//! tracing middleware's span tree.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::*;
use mtswarm_core::middleware::*;
use mtswarm_core::model::ModelError;
use mtswarm_core::testing::ScriptedTurn;
use mtswarm_core::*;
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Logs entry and exit of the hooks it wraps.
struct Recorder {
    name: &'static str,
    log: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn wrap<'a, I: Send + 'a, O: Send + 'a>(
        &'a self,
        hook: &'static str,
        input: I,
        next: Next<'a, I, O>,
    ) -> BoxFuture<'a, O> {
        Box::pin(async move {
            self.push(format!("{}>{hook}", self.name));
            let out = next.run(input).await;
            self.push(format!("{}<{hook}", self.name));
            out
        })
    }
    fn push(&self, entry: String) {
        self.log.lock().expect("lock").push(entry);
    }
}

/// The hooks of [`Middleware`] as `hook(input) -> output as "label"`:
/// each one a [`Recorder::wrap`] logging under its label.
macro_rules! recorded_hooks {
    ($($hook:ident($input:ty) -> $output:ty as $label:literal;)*) => {
        $(
            fn $hook<'a>(
                &'a self,
                input: $input,
                next: Next<'a, $input, $output>,
            ) -> BoxFuture<'a, $output> {
                self.wrap($label, input, next)
            }
        )*
    };
}

impl Middleware for Recorder {
    recorded_hooks! {
        on_step(StepInfo) -> StepReport as "step";
        on_reasoning(StepInfo) -> StepReport as "reasoning";
        on_acting(StepInfo) -> StepReport as "acting";
        on_model_call(ModelCallInput) -> Result<ModelTurn, ModelError> as "model";
        on_tool_call(ToolCallInfo) -> ToolCallOutcome as "tool";
        on_check_permission(PermissionInput) -> Permission as "permission";
        on_system_prompt(SystemPromptInput) -> String as "prompt";
    }
}

#[tokio::test]
async fn middlewares_wrap_in_onion_order() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let (engine, _) = engine(
        EngineConfig::default(),
        call_then("c1", "read_file", "{}", "ok"),
        registry(vec![FnTool::echo("read_file", "x")]),
        auto_all(),
    );
    let engine = engine
        .with_middleware(Arc::new(Recorder {
            name: "A",
            log: log.clone(),
        }))
        .with_middleware(Arc::new(Recorder {
            name: "B",
            log: log.clone(),
        }));
    run_go(&engine).await;
    let log = log.lock().expect("lock").clone();
    let first_step: Vec<&str> = log
        .iter()
        .map(String::as_str)
        .take_while(|e| *e != "A<step")
        .collect();
    assert_eq!(
        first_step,
        vec![
            "A>step",
            "B>step",
            "A>reasoning",
            "B>reasoning",
            "A>prompt",
            "B>prompt",
            "B<prompt",
            "A<prompt",
            "A>model",
            "B>model",
            "B<model",
            "A<model",
            "B<reasoning",
            "A<reasoning",
            "A>permission",
            "B>permission",
            "B<permission",
            "A<permission",
            "A>acting",
            "B>acting",
            "A>tool",
            "B>tool",
            "B<tool",
            "A<tool",
            "B<acting",
            "A<acting",
            "B<step",
        ]
    );
}

/// Denies shell, and stamps the system prompt.
struct Guard;

impl Middleware for Guard {
    fn on_check_permission<'a>(
        &'a self,
        input: PermissionInput,
        next: Next<'a, PermissionInput, Permission>,
    ) -> BoxFuture<'a, Permission> {
        if input.tool == "shell" {
            Box::pin(async {
                Permission::Deny {
                    reason: "shell is disabled for this job".to_owned(),
                }
            })
        } else {
            next.run(input)
        }
    }
    fn on_system_prompt<'a>(
        &'a self,
        mut input: SystemPromptInput,
        next: Next<'a, SystemPromptInput, String>,
    ) -> BoxFuture<'a, String> {
        input.prompt.push_str(" [guarded]");
        next.run(input)
    }
}

#[tokio::test]
async fn middleware_can_deny_a_call_and_change_the_prompt() {
    let (engine, model) = engine(
        EngineConfig::default(),
        call_then("x1", "shell", "{}", "ok"),
        registry(vec![FnTool::echo("shell", "ran").risk(Risk::High)]),
        auto_all(),
    );
    let engine = engine.with_middleware(Arc::new(Guard));
    let (stream, _) = engine.start("s", "base", "go");
    let (events, outcome) = run(stream).await;
    let state = outcome.state();
    assert_eq!(state.risk().permission_denied, 1);
    assert!(observation(state, "x1").contains("shell is disabled"));
    assert!(!tool_results(&events).iter().any(|(_, ok, _)| *ok));
    assert_eq!(model.requests()[0].messages[0].content, "base [guarded]");
}

/// A middleware that refuses to run reasoning stops the run instead of
/// looping forever.
struct Refuse;

impl Middleware for Refuse {
    fn on_reasoning<'a>(
        &'a self,
        info: StepInfo,
        _next: Next<'a, StepInfo, StepReport>,
    ) -> BoxFuture<'a, StepReport> {
        Box::pin(async move {
            StepReport {
                node: info.node,
                reason: None,
            }
        })
    }
}

#[tokio::test]
async fn skipped_node_stops_the_run() {
    let (engine, _) = engine(
        EngineConfig::default(),
        vec![ScriptedTurn::text("never")],
        ToolRegistry::new(),
        auto_all(),
    );
    let (stream, _) = engine
        .with_middleware(Arc::new(Refuse))
        .start("s", "", "go");
    let (_, outcome) = run(stream).await;
    assert_eq!(stop_reason(&outcome), StopReason::Aborted);
}

#[derive(Debug, Clone)]
struct SpanRecord {
    id: u64,
    name: String,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<SpanRecord>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent().map(|p| p.name().to_owned()));
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().expect("lock").push(SpanRecord {
            id: id.into_u64(),
            name: attrs.metadata().name().to_owned(),
            parent,
            fields,
        });
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.0.lock().expect("lock");
        if let Some(span) = spans.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut Fields(&mut span.fields));
        }
    }
}

/// Spans of this thread go to a fresh [`Capture`] while the guard lives.
fn capturing() -> (Capture, tracing::subscriber::DefaultGuard) {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    (capture, tracing::subscriber::set_default(subscriber))
}

/// An engine of `tools` driven by `turns`, every call auto-approved,
/// traced by `tracing`.
fn traced_engine(
    tracing: TracingMiddleware,
    turns: Vec<ScriptedTurn>,
    tools: Vec<FnTool>,
) -> Engine {
    let (engine, _) = engine(EngineConfig::default(), turns, registry(tools), auto_all());
    engine.with_middleware(Arc::new(tracing))
}

#[tokio::test]
async fn tracing_middleware_builds_the_span_tree() {
    let (capture, _guard) = capturing();
    let engine = traced_engine(
        TracingMiddleware::new(),
        vec![
            ScriptedTurn::tool_calls([call("r1", "run", "{}"), call("g1", "grep", "{}")])
                .with_usage(120, 30),
            ScriptedTurn::text("ok").with_usage(200, 10),
        ],
        vec![
            FnTool::echo("run", "ran")
                .risk(Risk::Medium)
                .concurrent()
                .hardware("slice-0"),
            FnTool::echo("grep", "found").concurrent(),
        ],
    );
    let caller = tracing::info_span!("job");
    let (stream, _) = {
        let _entered = caller.enter();
        engine.start("s", "", "go")
    };
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "ok");

    let spans = capture.0.lock().expect("lock").clone();
    let named = |name: &str| -> Vec<SpanRecord> {
        spans.iter().filter(|s| s.name == name).cloned().collect()
    };
    let steps = named("react.step");
    assert_eq!(steps.len(), 2);
    assert!(steps.iter().all(|s| s.parent.as_deref() == Some("job")));
    let numbers: Vec<&str> = steps
        .iter()
        .map(|s| s.fields["react.step"].as_str())
        .collect();
    assert_eq!(numbers, vec!["1", "2"]);
    let chats = named("chat");
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert_eq!(chat.parent.as_deref(), Some("react.step"));
        assert_eq!(chat.fields["otel.name"], "chat scripted");
        assert_eq!(chat.fields["otel.kind"], "client");
        assert_eq!(chat.fields["gen_ai.operation.name"], "chat");
        assert_eq!(chat.fields["gen_ai.provider.name"], "mtswarm.builtin");
        assert_eq!(chat.fields["gen_ai.request.model"], "scripted");
        assert_eq!(chat.fields["gen_ai.conversation.id"], "s");
        // Content stays out unless asked for.
        assert!(!chat.fields.contains_key("gen_ai.input.messages"));
    }
    assert_eq!(
        chats[0].fields["gen_ai.response.finish_reasons"],
        "tool_calls"
    );
    assert_eq!(chats[0].fields["gen_ai.usage.input_tokens"], "120");
    assert_eq!(chats[0].fields["gen_ai.usage.output_tokens"], "30");
    let tools = named("execute_tool");
    assert_eq!(tools.len(), 2);
    assert!(
        tools
            .iter()
            .all(|t| t.parent.as_deref() == Some("react.step"))
    );
    let run_span = tools
        .iter()
        .find(|t| t.fields["gen_ai.tool.name"] == "run")
        .expect("run span");
    assert_eq!(run_span.fields["gen_ai.tool.call.id"], "r1");
    assert_eq!(run_span.fields["otel.name"], "execute_tool run");
    assert_eq!(run_span.fields["gen_ai.operation.name"], "execute_tool");
    assert_eq!(run_span.fields["tool.risk"], "medium");
    assert!(run_span.fields.contains_key("tool.lock_wait_ms"));
    let grep_span = tools
        .iter()
        .find(|t| t.fields["gen_ai.tool.name"] == "grep")
        .expect("grep span");
    assert!(!grep_span.fields.contains_key("tool.lock_wait_ms"));
}

#[tokio::test]
async fn message_content_reaches_spans_only_when_asked_for() {
    let (capture, _guard) = capturing();
    let engine = traced_engine(
        TracingMiddleware::with_message_content(true),
        vec![
            ScriptedTurn::tool_calls([call("g1", "grep", "{}")]),
            ScriptedTurn::text("the answer"),
        ],
        vec![FnTool::echo("grep", "found it").concurrent()],
    );
    let (stream, _) = engine.start("s", "", "find the secret");
    let (_, outcome) = run(stream).await;
    assert_eq!(final_text(&outcome), "the answer");

    let spans = capture.0.lock().expect("lock").clone();
    let chats: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == "chat").collect();
    assert_eq!(chats.len(), 2);
    assert!(
        chats[0].fields["gen_ai.input.messages"].contains("find the secret"),
        "{:?}",
        chats[0].fields
    );
    assert!(chats[1].fields["gen_ai.output.messages"].contains("the answer"));
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool")
        .expect("tool span");
    assert_eq!(tool.fields["gen_ai.tool.call.result"], "found it");
}
