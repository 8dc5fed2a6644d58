//! A long session's checkpoint: how big it is after 10 and after 120
//! steps, written whole (format 1) and as stored now, and that a resume
//! from either continues the same run. The session is the engine with the
//! worker's sink over a real nats-server, a model that calls a compile and
//! a benchmark tool in turn (long compiler logs, a summary and evidence per
//! call, an edit now and then) and answers summarization requests, and a
//! context window small enough that the history is compacted every few
//! steps.

use std::sync::atomic::AtomicU32;

use futures::StreamExt;
use mtswarm_core::model::{FinishReason, ModelEvent, ToolChoice};
use mtswarm_core::{
    AutoApprove, ChatModel, ChatRequest, Effect, EffectKind, Engine, EngineConfig, EventKind,
    LocalResourceLock, ModelError, ModelStream, Outcome, RiskPolicy, Role, Tool, ToolCall,
    ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec,
};
use serde_json::{Value, json};

use super::restore::restored_state;
use super::stored::{KEPT_LIST_ITEMS, checkpoint_json};
use super::tests::store;
use super::*;

/// The context window of the test's engine (tokens of about four chars).
const WINDOW_TOKENS: u64 = 8_000;

/// Calls `compile` and `benchmark` in turn until its `steps`-th turn,
/// which answers; a summarization request gets a short summary.
pub(super) struct LongSession {
    steps: u32,
    turns: AtomicU32,
    requests: Mutex<Vec<ChatRequest>>,
}

impl LongSession {
    /// A model whose next turn is turn `done + 1` of a `steps`-turn run.
    pub(super) fn new(steps: u32, done: u32) -> Self {
        Self {
            steps,
            turns: AtomicU32::new(done),
            requests: Mutex::new(Vec::new()),
        }
    }

    fn requests(&self) -> Vec<ChatRequest> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait::async_trait]
impl ChatModel for LongSession {
    fn model_name(&self) -> &str {
        "long-session"
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let events = if request.tool_choice == ToolChoice::None {
            vec![
                ModelEvent::TextDelta {
                    text: format!(
                        "Summary: {} messages; candidates compiled and benchmarked, the best so far kept.",
                        request.messages.len()
                    ),
                },
                ModelEvent::Finish {
                    reason: FinishReason::Stop,
                },
            ]
        } else {
            self.requests
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(request);
            let turn = self.turns.fetch_add(1, Ordering::SeqCst) + 1;
            if turn < self.steps {
                let name = if turn % 2 == 1 {
                    "compile"
                } else {
                    "benchmark"
                };
                vec![
                    ModelEvent::ToolCall {
                        call: ToolCall {
                            id: format!("c{turn}-{name}"),
                            name: name.into(),
                            arguments: json!({"candidate": turn / 2, "defines": {"CHUNK": 256 << (turn % 4), "BUF": 2}}).to_string(),
                        },
                    },
                    ModelEvent::Finish {
                        reason: FinishReason::ToolCalls,
                    },
                ]
            } else {
                vec![
                    ModelEvent::TextDelta {
                        text: "The fastest candidate is CHUNK=1024.".into(),
                    },
                    ModelEvent::Finish {
                        reason: FinishReason::Stop,
                    },
                ]
            }
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

/// A stand-in for the worker's compile (`benchmark: false`) or benchmark
/// tool: as much output and as many effects as the real ones.
struct Step {
    benchmark: bool,
}

fn step_schema() -> Value {
    json!({"type": "object", "properties": {"candidate": {"type": "integer"}, "defines": {"type": "object"}}})
}

static COMPILE: ToolSpec = ToolSpec::new("compile", "a compile stand-in", step_schema)
    .concurrent()
    .effects(&[EffectKind::Mutation, EffectKind::State]);
static BENCHMARK: ToolSpec = ToolSpec::new("benchmark", "a benchmark stand-in", step_schema)
    .concurrent()
    .effects(&[EffectKind::Evidence, EffectKind::State]);

#[async_trait::async_trait]
impl Tool for Step {
    fn spec(&self) -> &ToolSpec {
        if self.benchmark { &BENCHMARK } else { &COMPILE }
    }
    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let candidate = args["candidate"].as_u64().unwrap_or(0);
        let summary = json!({
            "artifact": format!("art-{candidate:04}"), "kernel_hash": "9f2c4e1a7b3d5f60",
            "defines": args["defines"], "valid": true, "median_seconds": 1.25e-3,
            "gflops": 41.5, "peak_fraction": 0.31, "cores": 4,
        });
        if !self.benchmark {
            let log =
                format!("kernel.c:{candidate}: note: vectorized loop (8 lanes)\n").repeat(150);
            let mut out = ToolOutput::text(format!("compiled art-{candidate:04}\n{log}"))
                .with_effect(Effect::State {
                    key: "compile_results".into(),
                    value: summary,
                    append: true,
                });
            if candidate.is_multiple_of(5) {
                out = out.with_effect(Effect::Mutation {
                    target: "kernel.c".into(),
                });
            }
            return Ok(out);
        }
        Ok(ToolOutput::text(format!(
            "artifact art-{candidate:04} on 4 cores: median 1.25e-3 s over 9 runs\n{}",
            "run 1.25e-3 s\n".repeat(60)
        ))
        .with_effect(Effect::Evidence {
            kind: "benchmark".into(),
            passed: !candidate.is_multiple_of(3),
            summary: summary.clone(),
        })
        .with_effect(Effect::State {
            key: "benchmark_results".into(),
            value: summary,
            append: true,
        }))
    }
}

fn engine(model: Arc<LongSession>, steps: u32) -> Engine {
    engine_with_window(model, steps, WINDOW_TOKENS)
}

/// The test's engine with a context window of `window_tokens`.
pub(super) fn engine_with_window(
    model: Arc<LongSession>,
    steps: u32,
    window_tokens: u64,
) -> Engine {
    let mut registry = ToolRegistry::new();
    for benchmark in [false, true] {
        registry
            .register(Arc::new(Step { benchmark }))
            .expect("valid schema");
    }
    let mut config = EngineConfig {
        max_steps: steps + 10,
        ..EngineConfig::default()
    };
    config.context.window_tokens = window_tokens;
    Engine::new(
        config,
        model,
        registry,
        RiskPolicy::default().with_auto_approve(AutoApprove::All),
        Arc::new(LocalResourceLock::default()),
    )
}

/// The worker's sink, noting the largest state it was handed, written
/// whole (as format 1 stored it) and as it is stored now.
struct Measuring {
    sink: KvCheckpointSink,
    largest: Mutex<(usize, usize)>,
    states: Mutex<Vec<LoopState>>,
}

#[async_trait::async_trait]
impl CheckpointSink for Measuring {
    async fn save(
        &self,
        state: &LoopState,
        durability: Durability,
    ) -> Result<(), mtswarm_core::CheckpointError> {
        let whole = state.to_json().expect("json").len();
        let stored = checkpoint_json(state, self.sink.inner.limits)
            .expect("json")
            .len();
        {
            let mut largest = self.largest.lock().unwrap_or_else(|e| e.into_inner());
            largest.0 = largest.0.max(whole);
            largest.1 = largest.1.max(stored);
        }
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(state.clone());
        self.sink.save(state, durability).await
    }
}

/// What one long session left: the largest checkpoint in each format and
/// every state the engine reported.
struct Run {
    largest_whole: usize,
    largest_stored: usize,
    states: Vec<LoopState>,
}

async fn long_session(checkpoints: &Checkpoints, session: &str, steps: u32) -> Run {
    let model = Arc::new(LongSession::new(steps, 0));
    let known = SessionCheckpointCell::default();
    let config = engine(model.clone(), steps).config().clone();
    let sink = Arc::new(Measuring {
        sink: KvCheckpointSink::new(
            checkpoints.clone(),
            session,
            "j1",
            "a1",
            "t1",
            1,
            known,
            &config.context,
            None,
        ),
        largest: Mutex::new((0, 0)),
        states: Mutex::new(Vec::new()),
    });
    let engine = engine(model, steps).with_checkpoint_sink(sink.clone());
    let (stream, handle) = engine.start(session, "You tune kernels.", "Tune vecadd.");
    sink.sink.attach(handle.control());
    let outcome = finish(stream, handle).await;
    assert!(matches!(outcome, Outcome::Final { .. }), "{outcome:?}");
    assert_eq!(outcome.state().step(), steps);
    let stored = checkpoints
        .get(session)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored.value.format_version, CHECKPOINT_FORMAT_VERSION);
    // A resume reads the final state as format 2 kept it (the state as
    // shown), its history message by message.
    let as_shown = LoopState::from_json(
        &checkpoint_json(outcome.state(), ShownLimits::of(&config.context)).expect("json"),
    )
    .expect("a state");
    assert_eq!(
        restored_state(checkpoints, &stored.value)
            .await
            .expect("restored"),
        as_shown,
        "the stored checkpoint is the final state as shown"
    );
    let (largest_whole, largest_stored) = *sink.largest.lock().expect("lock");
    let states = sink.states.lock().expect("lock").clone();
    Run {
        largest_whole,
        largest_stored,
        states,
    }
}

pub(super) async fn finish(
    mut stream: mtswarm_core::RunStream,
    handle: mtswarm_core::RunHandle,
) -> Outcome {
    let mut ended = false;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("the run goes on")
    {
        ended |= matches!(event.kind, EventKind::ReplyEnd { .. });
    }
    let outcome = handle.outcome().await.expect("outcome");
    assert!(ended || !matches!(outcome, Outcome::Final { .. }));
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_sessions_checkpoint_does_not_grow_with_its_steps() {
    let (_server, _bus, checkpoints) = store().await;
    let short = long_session(&checkpoints, "short", 10).await;
    let long = long_session(&checkpoints, "long", 120).await;
    eprintln!(
        "largest checkpoint after 10 steps: whole {} B, stored {} B; after 120 steps: whole {} B, stored {} B",
        short.largest_whole, short.largest_stored, long.largest_whole, long.largest_stored
    );
    // Whole, the state grows with the session.
    assert!(
        long.largest_whole > 5 * short.largest_whole,
        "{} vs {}",
        long.largest_whole,
        short.largest_whole
    );
    // Stored, it is bounded by the context budget: the window (about four
    // bytes a token, the compaction triggers at 80 %) plus one step's
    // results and the bounded rest of the state, the same after 10 or 120
    // steps.
    let bound = 4 * WINDOW_TOKENS as usize + 24 * 1024;
    for run in [&short, &long] {
        assert!(
            run.largest_stored <= bound,
            "{} > {bound}",
            run.largest_stored
        );
    }
    assert!(
        long.largest_stored <= short.largest_stored * 3 / 2,
        "120 steps {} vs 10 steps {}",
        long.largest_stored,
        short.largest_stored
    );
    // What the bounded parts keep.
    let last = long.states.last().expect("states");
    let bounded =
        LoopState::from_json(&checkpoint_json(last, ShownLimits::default()).expect("json"))
            .expect("a state");
    assert!(
        last.projection().view_start > 1,
        "the history was compacted"
    );
    assert_eq!(bounded.projection().view_start, 1);
    assert_eq!(bounded.projection().summary, last.projection().summary);
    assert_eq!(
        bounded.history().len(),
        last.history().len() - last.projection().view_start + 1
    );
    assert_eq!(bounded.transitions().len(), stored::KEPT_TRANSITIONS);
    assert_eq!(bounded.last_transition(), last.last_transition());
    let working = bounded.working_state();
    assert_eq!(working.benchmark_results.len(), KEPT_LIST_ITEMS);
    assert_eq!(
        working.benchmark_results[..],
        last.working_state().benchmark_results
            [last.working_state().benchmark_results.len() - KEPT_LIST_ITEMS..]
    );
    let (before, after) = (last.evidence(), bounded.evidence());
    assert!(after.records.len() <= 3 && after.records.len() < before.records.len());
    for kind in ["benchmark", "validate"] {
        assert_eq!(after.has_valid(kind), before.has_valid(kind), "{kind}");
        assert_eq!(after.has_voided(kind), before.has_voided(kind), "{kind}");
    }
    assert_eq!(after.last_mutation, before.last_mutation);
    assert_eq!(after.next_seq, before.next_seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_written_whole_or_bounded_resumes_the_same_run() {
    let (_server, _bus, checkpoints) = store().await;
    let steps = 40;
    let run = long_session(&checkpoints, "first", steps).await;
    // A state after the tools of a step ran, once the history was compacted.
    let state = run
        .states
        .iter()
        .rev()
        .find(|s| {
            s.node() == Node::Observation && s.projection().view_start > 1 && s.step() < steps - 4
        })
        .expect("a compacted state after a tool batch")
        .clone();
    let whole = v1::SessionCheckpoint {
        session_id: "resumed".into(),
        job_id: "j1".into(),
        task_id: "t1".into(),
        attempt: 1,
        agent_id: "a1".into(),
        step: state.step(),
        state_json: state.to_json().expect("json").into_bytes(),
        format_version: 1,
        updated_at: None,
        fenced: false,
        grant: None,
        signature: Vec::new(),
    };
    let bounded = v1::SessionCheckpoint {
        state_json: checkpoint_json(&state, ShownLimits::default())
            .expect("json")
            .into_bytes(),
        format_version: 2,
        ..whole.clone()
    };
    assert!(bounded.state_json.len() < whole.state_json.len());
    let mut firsts = Vec::new();
    let mut restored_states = Vec::new();
    for checkpoint in [Some(whole), Some(bounded), None] {
        match checkpoint {
            Some(checkpoint) => {
                checkpoints.put(&checkpoint).await.expect("stored");
            }
            // Format 3, as the sink writes it.
            None => {
                let sink = KvCheckpointSink::new(
                    checkpoints.clone(),
                    "resumed",
                    "j1",
                    "a1",
                    "t1",
                    1,
                    SessionCheckpointCell::default(),
                    &ContextConfig::default(),
                    None,
                );
                sink.save(&state, Durability::Required)
                    .await
                    .expect("a durable point is stored");
            }
        }
        let read = checkpoints
            .get("resumed")
            .await
            .expect("get")
            .expect("there");
        let restored = restored_state(&checkpoints, &read.value)
            .await
            .expect("a checkpoint of any format is read");
        assert_eq!(restored.step(), state.step());
        restored_states.push(restored.clone());
        let model = Arc::new(LongSession::new(steps, state.step()));
        let (stream, handle) = engine(model.clone(), steps)
            .resume(restored)
            .expect("resumes");
        let outcome = finish(stream, handle).await;
        assert!(matches!(outcome, Outcome::Final { .. }), "{outcome:?}");
        assert_eq!(outcome.state().step(), steps);
        firsts.push(model.requests().into_iter().next().expect("a request"));
    }
    assert_eq!(
        restored_states[1], restored_states[2],
        "format 3 restores what format 2 did"
    );
    assert_eq!(firsts[1], firsts[2]);
    // The model is sent the same request after either resume: the same
    // messages, tool results as the view shows them (the bounded one
    // cut a few chars earlier, with the same note).
    let (from_whole, from_bounded) = (&firsts[0], &firsts[1]);
    assert_eq!(from_whole.messages.len(), from_bounded.messages.len());
    for (a, b) in from_whole.messages.iter().zip(&from_bounded.messages) {
        assert_eq!(a.role, b.role);
        if a.role == Role::Tool && a.content != b.content {
            let note = a.content.rsplit_once("\n... [truncated").map(|(_, n)| n);
            assert_eq!(
                note,
                b.content.rsplit_once("\n... [truncated").map(|(_, n)| n)
            );
            let kept = b.content.split("\n... [truncated").next().expect("text");
            assert!(a.content.starts_with(kept));
        } else if !a.content.contains("[session context]") {
            // (The injected context counts the view's tokens, which the
            // earlier cut changes by a few.)
            assert_eq!(a, b);
        }
    }
}
