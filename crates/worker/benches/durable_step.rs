//! One durable ReAct step of the engine against LangGraph's, in the same
//! run: per-step latency and the checkpoint bytes written per step.
//!
//! - **engine**: the real `Engine` runs N steps with a scripted model (one
//!   tool call per step, then a final answer) and a no-op tool, run twice:
//!   declared read-only (one durable point per step) and declared a
//!   hardware call (two); its
//!   checkpoints go through the worker's own sink (`mtswarm_worker::benching`,
//!   the daemon's `checkpoint` module: the durable points the engine
//!   asks for, the states in between written behind) into the
//!   checkpoints KV bucket of a real nats-server started as the local stack
//!   (`mtswarm up`) starts it: file storage, one replica, and
//!   `jetstream { sync_interval: always }` (every write is fsynced before it
//!   is acknowledged). The local stack's TLS and per-role credentials are
//!   left out. A step is timed from the end of the previous step's tool
//!   batch (its checkpoint acknowledged) to the end of its own. The bytes
//!   are every checkpoint record the bucket received (a core subscription
//!   on the bucket's subjects: the heads and the history's messages), by
//!   the step it was written at. After the run the
//!   session's state is read back as a resume reads it and must be the
//!   last step's.
//! - **LangGraph**: `deploy/bench/langgraph_step.py` runs the same loop in
//!   a `StateGraph` (a fake chat model that returns one tool call per step,
//!   a `ToolNode` with a no-op tool) with `SqliteSaver` on a file, in the
//!   pinned venv `deploy/bench/langgraph_setup.sh` creates
//!   (`deploy/bench/requirements.txt`); the bench runs it when the venv is
//!   there (`LANGGRAPH_PYTHON` names another interpreter) and says how to
//!   create it otherwise. Its bytes are the checkpoint and write blobs
//!   SQLite stored, by step.
//!
//! First the bus alone: 1,000 steps of one and of two compare-and-set
//! writes of a 3 KB record, one after the other (the floor a step's
//! durable points pay). Both sides run at 10, 100, `BENCH_STEPS` (default 200) and 1000 steps; the
//! table gives p50, p99 and mean step latency, the ratio of LangGraph's
//! mean to the engine's, and bytes per step over the whole run, over its
//! first ten steps and over its last ten (equal when they do not grow with
//! the step count). Versions (nats-server, Python, langgraph,
//! langgraph-checkpoint-sqlite) head the table. Run:
//! `cargo bench -p mtswarm-worker --bench durable_step`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mtswarm_bus::local_server::{LocalServerOptions, SyncPolicy};
use mtswarm_bus::testing::{NatsServer, ready_bus};
use mtswarm_bus::{Bus, BusConfig, Checkpoints, v1};
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_core::{
    AutoApprove, CheckpointSink, Durability, Engine, EngineConfig, LocalResourceLock, LoopState,
    Node, Outcome, RiskPolicy, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSpec,
};
use serde_json::{Value, json};

/// The no-op tool every step calls: read-only off the hardware (its step
/// has one durable point, after the call), or declared a hardware call
/// (two: before the call, fencing a stale attempt off, and after it).
struct Noop(&'static ToolSpec);

fn noop_schema() -> Value {
    json!({"type": "object", "properties": {"step": {"type": "integer"}}})
}

static NOOP: ToolSpec = ToolSpec::new("noop", "does nothing", noop_schema);
static NOOP_ON_SLICE: ToolSpec = ToolSpec::new("noop", "does nothing", noop_schema).hardware();

#[async_trait::async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        self.0
    }
    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("ok"))
    }
}

/// The worker's sink, noting when each step's tool batch was stored.
struct Timed {
    inner: Arc<dyn CheckpointSink>,
    ends: Mutex<Vec<Instant>>,
}

#[async_trait::async_trait]
impl CheckpointSink for Timed {
    async fn save(
        &self,
        state: &LoopState,
        durability: Durability,
    ) -> Result<(), mtswarm_core::CheckpointError> {
        let saved = self.inner.save(state, durability).await;
        if state.node() == Node::Observation {
            self.ends.lock().unwrap().push(Instant::now());
        }
        saved
    }
}

/// One run's figures (either side).
struct Figures {
    /// What ran: the engine with which tool, or LangGraph.
    side: &'static str,
    steps: usize,
    /// Step latencies, sorted.
    latencies: Vec<Duration>,
    /// Bytes written for each step (index = step - 1).
    bytes: Vec<u64>,
}

impl Figures {
    fn percentile(&self, fraction: f64) -> Duration {
        mtswarm_bus::testing::bench::percentile(&self.latencies, fraction)
    }
    fn mean(&self) -> Duration {
        self.latencies.iter().sum::<Duration>() / self.latencies.len().max(1) as u32
    }
    /// Mean bytes per step over `range` of the steps.
    fn bytes_per_step(&self, range: std::ops::Range<usize>) -> u64 {
        let slice = &self.bytes[range.start.min(self.bytes.len())..range.end.min(self.bytes.len())];
        slice.iter().sum::<u64>() / slice.len().max(1) as u64
    }
    fn all_first_last(&self) -> (u64, u64, u64) {
        let n = self.bytes.len();
        (
            self.bytes_per_step(0..n),
            self.bytes_per_step(0..10),
            self.bytes_per_step(n.saturating_sub(10)..n),
        )
    }
}

/// Counts what the checkpoints bucket receives, by the step each record
/// stores.
async fn count_writes(bus: &Bus) -> Arc<Mutex<BTreeMap<(String, u32), u64>>> {
    let written = Arc::new(Mutex::new(BTreeMap::new()));
    let mut subscription = bus
        .client()
        .subscribe(format!(
            "$KV.{}.>",
            mtswarm_bus::subjects::CHECKPOINTS_BUCKET
        ))
        .await
        .expect("subscribe");
    bus.client().flush().await.expect("flush");
    let counts = written.clone();
    tokio::spawn(async move {
        while let Some(message) = subscription.next().await {
            let Ok(checkpoint) = mtswarm_bus::codec::decode::<v1::SessionCheckpoint>(
                &message.subject,
                None,
                &message.payload,
            ) else {
                continue;
            };
            *counts
                .lock()
                .unwrap()
                .entry((checkpoint.session_id, checkpoint.step))
                .or_default() += message.payload.len() as u64;
        }
    });
    written
}

fn engine(steps: usize, tool: &'static ToolSpec) -> (Engine, EngineConfig) {
    let mut turns: Vec<ScriptedTurn> = (1..=steps)
        .map(|step| {
            ScriptedTurn::call(
                &format!("call-{step}"),
                "noop",
                &format!("{{\"step\":{step}}}"),
            )
        })
        .collect();
    turns.push(ScriptedTurn::text("done"));
    let model = Arc::new(ScriptedModel::new(turns).without_recording());
    let mut registry = ToolRegistry::new();
    registry
        .register(Arc::new(Noop(tool)))
        .expect("valid schema");
    let config = EngineConfig {
        max_steps: steps as u32 + 10,
        ..EngineConfig::default()
    };
    let engine = Engine::new(
        config.clone(),
        model,
        registry,
        RiskPolicy::default().with_auto_approve(AutoApprove::All),
        Arc::new(LocalResourceLock::default()),
    );
    (engine, config)
}

/// `steps` steps of the engine with the worker's sink; the figures.
async fn engine_run(
    checkpoints: &Checkpoints,
    written: &Mutex<BTreeMap<(String, u32), u64>>,
    label: &str,
    steps: usize,
    tool: &'static ToolSpec,
) -> Figures {
    let session = format!("{label}-{steps}-{}", u8::from(tool.needs_hardware));
    let (engine, config) = engine(steps, tool);
    let sink = Arc::new(Timed {
        inner: mtswarm_worker::benching::checkpoint_sink(
            checkpoints.clone(),
            &session,
            "task",
            &config.context,
        ),
        ends: Mutex::new(Vec::with_capacity(steps)),
    });
    let engine = engine.with_checkpoint_sink(sink.clone());
    let started = Instant::now();
    let (mut stream, handle) = engine.start(&session, "You run a tool.", "Run the tool.");
    while stream.next().await.is_some() {}
    let outcome = handle.outcome().await.expect("outcome");
    assert!(matches!(outcome, Outcome::Final { .. }), "{outcome:?}");
    let ends = sink.ends.lock().unwrap().clone();
    assert_eq!(ends.len(), steps, "one tool batch per step");
    let mut latencies: Vec<Duration> = std::iter::once(started)
        .chain(ends.iter().copied())
        .zip(&ends)
        .map(|(from, to)| *to - from)
        .collect();
    latencies.sort();

    let resumed = mtswarm_worker::benching::resume_state(checkpoints, &session)
        .await
        .expect("resume read")
        .expect("a checkpoint");
    assert_eq!(
        resumed.step() as usize,
        steps + 1,
        "the final state is stored"
    );
    // Every write the bucket acknowledged reaches the subscription.
    let deadline = Instant::now() + Duration::from_secs(10);
    let last_step = steps as u32 + 1;
    while !written
        .lock()
        .unwrap()
        .contains_key(&(session.clone(), last_step))
    {
        assert!(Instant::now() < deadline, "the final write was not seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let written = written.lock().unwrap();
    // Writes of the final answer's step count with the last tool step.
    let mut bytes: Vec<u64> = (1..=steps as u32)
        .map(|step| written.get(&(session.clone(), step)).copied().unwrap_or(0))
        .collect();
    *bytes.last_mut().expect("steps") += written[&(session.clone(), last_step)];
    Figures {
        side: if tool.needs_hardware {
            "engine, hardware tool"
        } else {
            "engine, read-only tool"
        },
        steps,
        latencies,
        bytes,
    }
}

/// The bus floor of a durable step: `writes` compare-and-set writes of a
/// head-sized record (3 KB), one after the other, with nothing else (a
/// step's durable points: one with a read-only tool, two with a hardware
/// call); per-step latencies, sorted.
async fn floor_run(checkpoints: &Checkpoints, steps: usize, writes: usize) -> Vec<Duration> {
    let mut record = v1::SessionCheckpoint {
        session_id: format!("floor-{steps}-{writes}"),
        state_json: vec![b'x'; 3 * 1024],
        ..Default::default()
    };
    let kv = checkpoints.kv();
    let mut revision = kv.put(&record.session_id, &record).await.expect("put");
    let mut latencies = Vec::with_capacity(steps);
    for step in 0..steps {
        let started = Instant::now();
        for _ in 0..writes {
            record.step = step as u32;
            revision = kv
                .update(&record.session_id, &record, revision)
                .await
                .expect("update");
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies
}

/// The LangGraph side's output: versions and per-run figures.
struct Python {
    versions: String,
    runs: BTreeMap<usize, Figures>,
}

fn python_interpreter(repo: &std::path::Path) -> Option<PathBuf> {
    if let Ok(python) = std::env::var("LANGGRAPH_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let venv = repo.join("deploy/bench/.venv/bin/python");
    venv.exists().then_some(venv)
}

fn langgraph_runs(step_counts: &[usize]) -> Result<Python, String> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some(python) = python_interpreter(&repo) else {
        return Err(
            "LangGraph side skipped: no venv at deploy/bench/.venv (create it with deploy/bench/langgraph_setup.sh, or set LANGGRAPH_PYTHON)".into(),
        );
    };
    let counts: Vec<String> = step_counts.iter().map(usize::to_string).collect();
    let output = Command::new(&python)
        .arg(repo.join("deploy/bench/langgraph_step.py"))
        .arg("--steps")
        .arg(counts.join(","))
        .output()
        .map_err(|e| format!("LangGraph side not run: {}: {e}", python.display()))?;
    if !output.status.success() {
        return Err(format!(
            "LangGraph side failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let mut result = Python {
        versions: String::new(),
        runs: BTreeMap::new(),
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let value: Value = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
        if let Some(versions) = value.get("versions") {
            result.versions = versions
                .as_object()
                .map(|v| {
                    v.iter()
                        .map(|(k, v)| format!("{k} {}", v.as_str().unwrap_or("?")))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            continue;
        }
        let steps = value["steps"].as_u64().ok_or("no steps")? as usize;
        let mut latencies: Vec<Duration> = value["latencies_us"]
            .as_array()
            .ok_or("no latencies")?
            .iter()
            .map(|v| Duration::from_secs_f64(v.as_f64().unwrap_or(0.0) / 1e6))
            .collect();
        latencies.sort();
        let bytes = value["bytes"]
            .as_array()
            .ok_or("no bytes")?
            .iter()
            .map(|v| v.as_u64().unwrap_or(0))
            .collect();
        result.runs.insert(
            steps,
            Figures {
                side: "LangGraph",
                steps,
                latencies,
                bytes,
            },
        );
    }
    Ok(result)
}

fn us(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e6)
}

fn nats_version() -> String {
    Command::new("nats-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "nats-server ?".into())
}

fn print_table(engine: &[Figures], python: &Result<Python, String>) {
    let (versions, runs) = match python {
        Ok(python) => (python.versions.clone(), Some(&python.runs)),
        Err(why) => {
            println!("{why}\n");
            ("not run".to_owned(), None)
        }
    };
    println!(
        "Durable step: engine + worker checkpoint sink -> JetStream KV ({}, file storage, 1 replica, sync_interval: always) vs LangGraph + SqliteSaver on a file ({versions})\n",
        nats_version()
    );
    println!(
        "| steps | side | p50 µs | p99 µs | mean µs | LangGraph / engine (mean) | bytes/step (all) | bytes/step (first 10) | bytes/step (last 10) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for figures in engine {
        let other = runs.and_then(|runs| runs.get(&figures.steps));
        // LangGraph's row follows the last engine row of its step count.
        let last_of_steps = engine
            .iter()
            .rfind(|f| f.steps == figures.steps)
            .is_some_and(|f| std::ptr::eq(f, figures));
        let ratio = other
            .map(|o| {
                format!(
                    "{:.1}x",
                    o.mean().as_secs_f64() / figures.mean().as_secs_f64()
                )
            })
            .unwrap_or_else(|| "-".into());
        for (side, f, ratio) in [
            (figures.side, Some(figures), ratio.as_str()),
            ("LangGraph", other.filter(|_| last_of_steps), ""),
        ] {
            let Some(f) = f else { continue };
            let (all, first, last) = f.all_first_last();
            println!(
                "| {} | {side} | {} | {} | {} | {ratio} | {all} | {first} | {last} |",
                f.steps,
                us(f.percentile(0.5)),
                us(f.percentile(0.99)),
                us(f.mean()),
            );
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let steps: usize = std::env::var("BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let mut step_counts = vec![10, 100, steps, 1000];
    step_counts.sort_unstable();
    step_counts.dedup();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // As `mtswarm up` starts it (crates/cli/src/up/start.rs): the default
    // sync policy, every write fsynced.
    let options = LocalServerOptions {
        sync: SyncPolicy::Always,
        ..LocalServerOptions::default()
    };
    let nats = NatsServer::start_with(options).expect("nats-server");
    let engine: Vec<Figures> = runtime.block_on(async {
        let bus = ready_bus(BusConfig::new(nats.url())).await;
        let checkpoints = Checkpoints::open(&bus).await.expect("checkpoints");
        let written = count_writes(&bus).await;
        // Warm-up: connections, the bucket's first writes.
        engine_run(&checkpoints, &written, "warm-up", 10, &NOOP_ON_SLICE).await;
        for writes in [1, 2] {
            let floor = floor_run(&checkpoints, 1000, writes).await;
            println!(
                "bus floor, {writes} compare-and-set write(s) of a 3 KB record per step (1,000 steps): p50 {} µs, p99 {} µs",
                us(mtswarm_bus::testing::bench::percentile(&floor, 0.5)),
                us(mtswarm_bus::testing::bench::percentile(&floor, 0.99)),
            );
        }
        println!();
        let mut figures = Vec::new();
        for &steps in &step_counts {
            for tool in [&NOOP, &NOOP_ON_SLICE] {
                figures.push(engine_run(&checkpoints, &written, "bench", steps, tool).await);
            }
        }
        figures
    });
    let python = langgraph_runs(&step_counts);
    print_table(&engine, &python);
}
