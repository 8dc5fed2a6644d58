//! Helpers shared by the end-to-end tests: a scripted leader model, job
//! submission, and reading a job's whole WatchJob stream.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_core::ChatModel;
use mtswarm_core::ToolCall;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_leader::LeaderConfig;
use mtswarm_proto::v1;
use mtswarm_tests::stack::Control;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

/// One leader turn calling `tool` once per argument object.
pub(crate) fn calls(tool: &str, arguments: &[Value]) -> ScriptedTurn {
    ScriptedTurn::tool_calls(arguments.iter().enumerate().map(|(index, args)| ToolCall {
        id: format!("{tool}-{index}"),
        name: tool.to_string(),
        arguments: args.to_string(),
    }))
}

/// Makes every job's leader loop replay `turns` (a fresh copy per job).
pub(crate) fn script_leader(config: &mut LeaderConfig, turns: Vec<ScriptedTurn>) {
    let factory = move |_spec: &v1::JobSpec| -> Result<Arc<dyn ChatModel>, mtswarm_leader::ModelFactoryError> {
        Ok(Arc::new(ScriptedModel::new(turns.clone())) as Arc<dyn ChatModel>)
    };
    config.model_factory = Some(Arc::new(factory));
}

/// The leader script of a job that runs one task per agent: spawn the
/// agents (each `(name, selector)`), give each a task with `parameters`,
/// collect all results, answer.
pub(crate) fn fan_out_script(agents: &[(&str, &str)], parameters: &Value) -> Vec<ScriptedTurn> {
    let spawns: Vec<Value> = agents
        .iter()
        .map(|(name, selector)| {
            json!({"name": name, "selector": selector, "role": "tuner",
                   "instructions": "Benchmark the configuration you are given."})
        })
        .collect();
    let assigns: Vec<Value> = agents
        .iter()
        .map(|(name, _)| {
            json!({"agent": name, "instructions": "Compile, validate and benchmark this configuration.",
                   "parameters": parameters})
        })
        .collect();
    let names: Vec<&str> = agents.iter().map(|(name, _)| *name).collect();
    vec![
        calls("spawn_agent", &spawns),
        calls("assign_task", &assigns),
        calls(
            "collect_result",
            &[json!({"agents": names, "mode": "all", "timeout_seconds": 240})],
        ),
        ScriptedTurn::text("All agents reported; see the task results."),
    ]
}

/// Task parameters for one quick vecadd run on 2 cores.
pub(crate) fn quick_vecadd_parameters() -> Value {
    json!({"params": {"CHUNK": 1024, "BUF": 2}, "cores": 2, "warmup": 0, "repeats": 1})
}

pub(crate) fn job_spec(goal: &str, kernel_dir: &str, auto_approve: bool) -> v1::JobSpec {
    v1::JobSpec {
        goal: goal.to_string(),
        kernel_dir: kernel_dir.to_string(),
        slice_selector: String::new(),
        budgets: Some(v1::Budgets {
            wall_time_seconds: 600,
            ..Default::default()
        }),
        num_agents: 0,
        model: None,
        auto_approve,
        allow_shell: false,
    }
}

pub(crate) async fn submit(control: &mut Control, spec: v1::JobSpec) -> String {
    control
        .submit_job(v1::SubmitJobRequest {
            spec: Some(spec),
            idempotency_key: String::new(),
        })
        .await
        .expect("SubmitJob accepted")
        .into_inner()
        .job_id
}

/// Reads the job's stream from the start until it ends (the job is final),
/// at most `timeout`.
pub(crate) async fn watch_to_end(
    control: &mut Control,
    job_id: &str,
    timeout: Duration,
) -> Vec<v1::JobEvent> {
    let mut stream = control
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_string(),
            from_sequence: 0,
        })
        .await
        .expect("WatchJob")
        .into_inner();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!(
                "job {job_id} not final within {timeout:?}; last events: {:#?}",
                &events[events.len().saturating_sub(10)..]
            ),
            Ok(None) => return events,
            Ok(Some(Err(status))) => panic!("WatchJob failed: {status}"),
            Ok(Some(Ok(event))) => events.push(event),
        }
    }
}

pub(crate) async fn get_job(control: &mut Control, job_id: &str) -> v1::JobRecord {
    control
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_string(),
        })
        .await
        .expect("GetJob")
        .into_inner()
        .job
        .expect("a job record")
}

pub(crate) fn task_results(events: &[v1::JobEvent]) -> Vec<v1::TaskResult> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::TaskResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn agent_events(events: &[v1::JobEvent]) -> Vec<v1::AgentEvent> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(v1::job_event::Event::AgentEvent(a)) => Some(a.clone()),
            _ => None,
        })
        .collect()
}
