//! Acceptance 1: a job submitted over gRPC; a scripted leader model spawns
//! three agents on three emulated slices served by two worker processes,
//! gives each a task, collects the three results and finishes; WatchJob
//! delivers every agent's events in order (per session, no gaps).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mtswarm_proto::v1;
use mtswarm_tests::small_fleet_toml;

use crate::support::{
    agent_events, fan_out_options, job_spec, run_to_success, start_stack, submit, task_results,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_fans_out_to_three_agents_on_two_worker_processes() {
    let agents = [
        ("tuner-a", "board=board0"),
        ("tuner-b", "board=board1"),
        ("tuner-c", ""),
    ];
    let options = fan_out_options(&agents, small_fleet_toml(2, 2, 2));
    let (stack, mut control) = start_stack(options, 4).await;

    let job_id = submit(
        &mut control,
        job_spec("Tune vecadd on three slices", "vecadd", true),
    )
    .await;
    let (events, job) =
        run_to_success(&stack, &mut control, &job_id, Duration::from_secs(300)).await;

    // Every JobEvent of the stream is in order, without repeats.
    for pair in events.windows(2) {
        assert!(
            pair[0].sequence < pair[1].sequence,
            "job event sequences not increasing: {} then {}",
            pair[0].sequence,
            pair[1].sequence
        );
    }

    // Three results, all OK, one per agent, on three slices of both workers
    // (the leader's confirmation of the best is a task of its own).
    let confirmations: BTreeSet<&str> = job
        .tasks
        .iter()
        .filter(|t| {
            t.assign_call_id
                .starts_with(mtswarm_leader::CONFIRM_CALL_PREFIX)
        })
        .filter_map(|t| t.assignment.as_ref())
        .map(|a| a.task_id.as_str())
        .collect();
    let results: Vec<v1::TaskResult> = task_results(&events)
        .into_iter()
        .filter(|r| !confirmations.contains(r.task_id.as_str()))
        .collect();
    assert_eq!(results.len(), 3, "results: {results:#?}");
    let by_agent: BTreeMap<&str, &v1::TaskResult> =
        results.iter().map(|r| (r.agent_id.as_str(), r)).collect();
    assert_eq!(
        by_agent.keys().copied().collect::<Vec<_>>(),
        vec!["tuner-a", "tuner-b", "tuner-c"]
    );
    for result in &results {
        assert_eq!(
            result.status(),
            v1::TaskStatus::Ok,
            "{result:#?}\nworkers:\n{}",
            stack.worker_logs()
        );
        assert_eq!(result.job_id, job_id);
        let parsed: serde_json::Value =
            serde_json::from_str(&result.result_json).expect("result_json is JSON");
        assert!(
            parsed.get("best").is_some_and(|best| !best.is_null()),
            "the single candidate was benchmarked: {parsed}"
        );
    }
    let slices: BTreeSet<&str> = results.iter().map(|r| r.slice_id.as_str()).collect();
    assert_eq!(slices.len(), 3, "three distinct slices: {slices:?}");
    let workers: BTreeSet<&str> = results.iter().map(|r| r.worker_id.as_str()).collect();
    assert_eq!(
        workers.len(),
        2,
        "both worker processes ran tasks: {workers:?}"
    );
    assert!(by_agent["tuner-a"].worker_id != by_agent["tuner-b"].worker_id);

    // Agent events: all three agents, per session strictly consecutive from 1.
    let mut per_session: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for event in agent_events(&events) {
        per_session
            .entry((event.agent_id.clone(), event.session_id.clone()))
            .or_default()
            .push(event.sequence);
    }
    let agents_seen: BTreeSet<&str> = per_session.keys().map(|(a, _)| a.as_str()).collect();
    assert!(
        agents_seen.is_superset(&BTreeSet::from(["tuner-a", "tuner-b", "tuner-c"])),
        "events of every agent: {agents_seen:?}"
    );
    for ((agent, session), sequences) in &per_session {
        let expected: Vec<u64> = (1..=sequences.len() as u64).collect();
        assert_eq!(
            sequences, &expected,
            "agent {agent} session {session}: events out of order or missing"
        );
        if agent.starts_with("tuner-") {
            assert!(
                sequences.len() >= 4,
                "agent {agent} ran tools, so it has several events: {sequences:?}"
            );
        }
    }
    let kinds: BTreeSet<v1::AgentEventKind> =
        agent_events(&events).iter().map(|e| e.kind()).collect();
    assert!(kinds.contains(&v1::AgentEventKind::ToolCall), "{kinds:?}");
    assert!(kinds.contains(&v1::AgentEventKind::ToolResult), "{kinds:?}");

    assert_eq!(job.tasks_total, 3);
    assert_eq!(job.tasks_done, 3);
    stack.shutdown().await;
}
