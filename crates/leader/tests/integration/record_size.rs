//! The size of a job's stored record does not grow with the job: the
//! builtin leader runs the same 128-candidate space on 1, 8 and 32 fake
//! worker daemons (so 128, 16 and 4 candidates per agent), and the
//! `mtswarm_jobs` value under the job's id stays the same size; the agents,
//! tasks and loop state live under keys of their own, `GetJob` still
//! answers with all of them and `ListJobs` with the stored record. The figures are printed (`--nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_bus::{Jobs, v1};
use prost::Message as _;

/// Upper bound of a stored job record, whatever the job's size: the old
/// layout (agents, tasks with their candidates and the loop state embedded)
/// passed it with a single agent.
const MAX_RECORD_BYTES: usize = 8 * 1024;

/// Configurations of the space every run tunes (8 x 16).
const CONFIGURATIONS: usize = 128;

/// What one run measured.
#[derive(Debug)]
struct Sizes {
    agents: usize,
    /// The job record as stored under the job's id.
    stored: usize,
    /// `GetJob`'s answer (record with agents, tasks and loop state).
    assembled: usize,
    /// The leader loop's checkpoint.
    loop_state: usize,
}

fn gflops_of(task: &v1::TaskAssignment) -> f64 {
    task.slice_id.len() as f64
}

async fn run_job(agents: usize) -> Sizes {
    let env = Env::start().await;
    let a: Vec<String> = (1..=8).map(|v| v.to_string()).collect();
    let b: Vec<String> = (1..=16).map(|v| v.to_string()).collect();
    std::fs::write(
        env.kernel_dir().join("tune.toml"),
        format!(
            "kernel = \"k1\"\n[[param]]\nname = \"A\"\nvalues = [{}]\ndefault = 1\n\
             [[param]]\nname = \"B\"\nvalues = [{}]\ndefault = 1\n",
            a.join(", "),
            b.join(", ")
        ),
    )
    .expect("tune.toml");
    let mut workers = Vec::new();
    let mut answers = Vec::new();
    for n in 0..agents {
        let worker_id = format!("sw{n}");
        workers.push(FakeWorker::start(&env.bus, &worker_id, &format!("sb{n}")).await);
        answers.push(answer_tasks(&env.bus, &worker_id, gflops_of).0);
    }
    let leader = start_leader(env.config()).await;
    let mut control = control(&leader).await;
    let mut job = spec("Tune k1 across the fleet.");
    job.num_agents = agents as u32;
    let job_id = try_submit(&mut control, job).await.expect("submit");
    let events = watch_to_end(&mut control, &job_id, 0).await;
    assert_eq!(final_state(&events), Some(v1::JobState::Succeeded));

    let jobs = Jobs::open(&env.bus).await.expect("jobs");
    let stored = jobs
        .get(&job_id)
        .await
        .expect("read")
        .expect("the job record")
        .value;
    let listed = control
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("list_jobs")
        .into_inner()
        .jobs;
    assert_eq!(
        listed,
        std::slice::from_ref(&stored),
        "ListJobs answers the stored record"
    );
    assert_eq!(stored.agents_total, agents as u32);
    assert!(stored.agents.is_empty() && stored.tasks.is_empty());
    assert!(stored.agent_ids.is_empty() && stored.leader_state_json.is_empty());
    let assembled = get_job(&mut control, &job_id).await.expect("get_job");
    assert_eq!(assembled.agents.len(), agents, "GetJob has every agent");
    assert_eq!(assembled.agent_ids.len(), agents);
    // The job's own tasks; the leader's confirmation of the best is a
    // task of its own (`mtswarm_leader::confirm`).
    let own_tasks: Vec<&v1::TaskRecord> = assembled
        .tasks
        .iter()
        .filter(|t| {
            !t.assign_call_id
                .starts_with(mtswarm_leader::CONFIRM_CALL_PREFIX)
        })
        .collect();
    assert_eq!(own_tasks.len(), agents, "GetJob has every task");
    let candidates: usize = own_tasks
        .iter()
        .filter_map(|t| t.assignment.as_ref())
        .map(|a| {
            let parameters: serde_json::Value =
                serde_json::from_str(&a.parameters_json).expect("parameters");
            parameters["candidates"].as_array().map_or(0, Vec::len)
        })
        .sum();
    assert_eq!(candidates, CONFIGURATIONS, "every candidate was assigned");
    assert!(!assembled.leader_state_json.is_empty(), "the loop state");
    assert_eq!(
        (assembled.tasks_total, assembled.tasks_done),
        (agents as u32, agents as u32)
    );
    let sizes = Sizes {
        agents,
        stored: stored.encoded_len(),
        assembled: assembled.encoded_len(),
        loop_state: assembled.leader_state_json.len(),
    };
    let state: serde_json::Value =
        serde_json::from_slice(&assembled.leader_state_json).expect("the loop state is JSON");
    let part = |name: &str| state[name].to_string().len();
    println!(
        "job record: {agents} agents, {} candidates each: stored {} B, with agents, tasks and loop state {} B (loop state {} B: history {} B in {} messages, transitions {} B)",
        CONFIGURATIONS / agents,
        sizes.stored,
        sizes.assembled,
        sizes.loop_state,
        part("history"),
        state["history"].as_array().map_or(0, Vec::len),
        part("transitions"),
    );
    for answer in answers {
        answer.abort();
    }
    drop(workers);
    leader.shutdown().await.expect("shutdown");
    sizes
}

#[tokio::test]
async fn a_job_record_does_not_grow_with_its_agents_and_candidates() {
    let mut runs = Vec::new();
    for agents in [1, 8, 32] {
        runs.push(run_job(agents).await);
    }
    let one = &runs[0];
    for run in &runs {
        assert!(
            run.stored < MAX_RECORD_BYTES,
            "a job record of {} agents is {} B, over {MAX_RECORD_BYTES} B: {runs:?}",
            run.agents,
            run.stored
        );
        // Within a few percent: ids and figures differ by a few bytes.
        let allowed = one.stored / 20 + 64;
        assert!(
            run.stored.abs_diff(one.stored) <= allowed,
            "the record of {} agents is {} B, of one agent {} B: {runs:?}",
            run.agents,
            run.stored,
            one.stored
        );
    }
    let largest = runs.last().expect("runs");
    assert!(
        largest.assembled > 4 * largest.stored,
        "what GetJob assembles is where the job's size goes: {runs:?}"
    );
}
