//! Helpers shared by the end-to-end tests: a scripted leader model and the
//! jobs it runs (submitting and reading jobs is `mtswarm_tests::jobs`).

use std::sync::Arc;

use mtswarm_core::ChatModel;
use mtswarm_core::ToolCall;
use mtswarm_core::testing::{ScriptedModel, ScriptedTurn};
use mtswarm_leader::LeaderConfig;
use mtswarm_proto::v1;
use serde_json::{Value, json};

pub(crate) use mtswarm_tests::jobs::{agent_events, get_job, submit, task_results, watch_to_end};
use mtswarm_tests::stack::Control;
use mtswarm_tests::{StackOptions, TestStack};

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

/// Options for a stack on `fleet_toml` whose leader replays the
/// [`fan_out_script`] of `agents` with [`quick_vecadd_parameters`].
pub(crate) fn fan_out_options(agents: &[(&str, &str)], fleet_toml: String) -> StackOptions {
    let script = fan_out_script(agents, &quick_vecadd_parameters());
    let mut options = StackOptions::new(mtswarm_tests::node_bin!(), fleet_toml);
    options.configure_leader = Box::new(move |config| script_leader(config, script));
    options
}

/// Starts `options`' stack, waits until its workers registered `slices`
/// slices, and connects a Control client.
pub(crate) async fn start_stack(options: StackOptions, slices: usize) -> (TestStack, Control) {
    let stack = TestStack::start(options).await;
    stack
        .wait_for_slices(slices, std::time::Duration::from_secs(30))
        .await;
    let control = stack.control().await;
    (stack, control)
}

/// Task parameters for one quick vecadd run on 2 cores.
pub(crate) fn quick_vecadd_parameters() -> Value {
    json!({"params": {"CHUNK": 1024, "BUF": 2}, "cores": 2, "warmup": 0, "repeats": 1})
}

/// Reads the job's stream until it ends (at most `timeout`) and asserts
/// that the job succeeded; its events and its final record.
pub(crate) async fn run_to_success(
    stack: &TestStack,
    control: &mut Control,
    job_id: &str,
    timeout: std::time::Duration,
) -> (Vec<v1::JobEvent>, v1::JobRecord) {
    let events = watch_to_end(control, job_id, timeout, || stack.worker_logs()).await;
    let job = get_job(control, job_id).await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "job {job:#?}\nworkers:\n{}",
        stack.worker_logs()
    );
    (events, job)
}

/// A job on `kernel_dir` for as many agents as the leader's script spawns.
pub(crate) fn job_spec(goal: &str, kernel_dir: &str, auto_approve: bool) -> v1::JobSpec {
    mtswarm_tests::jobs::job_spec(goal, kernel_dir, 0, auto_approve)
}
