//! The farm path at CI size: 4 worker daemon processes x 16 simulated
//! single-core slices against a leader process, one job with 64 agents over
//! a 256-configuration space. The job completes, every agent's task has a
//! result, the configurations the simulated boards answer wrongly are
//! reported invalid (never as results), and the job's best is the model's
//! true best among the correct configurations.
//!
//! And nothing per job stays behind: jobs run one after another on a
//! leader in this process, and after each one the leader's per-job tables
//! and the workers' session tables are back at their idle size.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test

use std::time::Duration;

use mtswarm_leader::LeaderTableSizes;
use mtswarm_proto::v1;
use mtswarm_tests::farm::{
    FARM_KERNEL, FarmOptions, FarmStack, farm_fleet_toml, farm_job, wait_for_job, write_farm_kernel,
};
use mtswarm_tests::{StackOptions, TestStack, node_bin};

const DAEMONS: usize = 4;
const SLICES: u32 = 16;
const AGENTS: u32 = DAEMONS as u32 * SLICES;

fn options() -> FarmOptions {
    FarmOptions {
        node_bin: node_bin!(),
        daemons: DAEMONS,
        slices_per_daemon: SLICES,
        run_ms: (1, 3),
        incorrect_fraction: 0.2,
        // No noise: the measured best must be the model's best exactly.
        noise: 0.0,
        param_values: vec![4, 4, 4, 4],
        leader_env: Vec::new(),
        log_level: "info".into(),
        // This test is about the search over the farm, not liveness (the
        // chaos suite is): leases that outlive a stall of the whole machine
        // beside the other tests keep 64 agents from all moving at once.
        worker_args: vec!["--lease-ttl".into(), "30".into()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_agent_job_over_simulated_boards_finds_the_model_best() {
    let farm = FarmStack::start(options()).await;
    farm.wait_for_all_slices(Duration::from_secs(60)).await;
    let mut control = farm.control().await;
    let job_id = mtswarm_tests::jobs::submit(&mut control, farm_job(AGENTS, 300)).await;
    let job = wait_for_job(
        &mut control,
        &job_id,
        Duration::from_secs(180),
        None,
        || farm.logs(),
    )
    .await;
    assert_eq!(
        job.state(),
        v1::JobState::Succeeded,
        "{}: {}\n{}",
        job.error,
        job.final_answer,
        farm.logs()
    );
    // A first-round partition that fails (a loaded machine) gets a retry
    // agent of its own: the logs say which task failed and why.
    assert_eq!(
        job.agents_total,
        AGENTS,
        "one agent per slice; tasks not ok: {:#?}\n{}",
        job.tasks
            .iter()
            .filter(|t| t.status() != v1::TaskStatus::Ok)
            .collect::<Vec<_>>(),
        farm.logs()
    );
    // The job's own tasks: the leader's confirmation of the best is a task
    // of its own (`mtswarm_leader::confirm`).
    let own_tasks = job
        .tasks
        .iter()
        .filter(|t| {
            !t.assign_call_id
                .starts_with(mtswarm_leader::CONFIRM_CALL_PREFIX)
        })
        .count();
    assert_eq!(own_tasks, AGENTS as usize, "one task per agent");
    let seconds = |at: &Option<mtswarm_proto::prost_types::Timestamp>| {
        at.as_ref()
            .map(|t| t.seconds as f64 + f64::from(t.nanos) * 1e-9)
            .unwrap_or_default()
    };
    let last_task = job
        .tasks
        .iter()
        .map(|t| seconds(&t.finished_at))
        .fold(0.0, f64::max);
    eprintln!(
        "farm: {AGENTS} agents, job final {:.2} s after its last task",
        seconds(&job.finished_at) - last_task
    );
    for task in &job.tasks {
        assert!(
            task.done && task.status() == v1::TaskStatus::Ok,
            "every agent's task has a result: {task:?}"
        );
    }

    let truth = farm.model_truth();
    assert_eq!(truth.len(), 256);
    let wrong = truth.iter().filter(|(_, _, wrong)| *wrong).count();
    assert!(
        (20..=80).contains(&wrong),
        "about a fifth of the space answers wrongly: {wrong}"
    );
    let outcome = job.outcome.clone().expect("the job's outcome");
    let by_status = &outcome.candidates_by_status;
    assert_eq!(
        by_status.get("invalid").copied().unwrap_or(0) as usize,
        wrong,
        "every wrong configuration is reported invalid: {by_status:?}"
    );
    assert_eq!(
        by_status.values().sum::<u32>() as usize,
        truth.len(),
        "every configuration was tried once: {by_status:?}"
    );
    let count = |status: &str| by_status.get(status).copied().unwrap_or(0) as usize;
    assert_eq!(
        count("screened") + count("benchmarked"),
        truth.len() - wrong,
        "every correct configuration was measured: {by_status:?}"
    );
    assert_eq!(
        outcome.valid_records as usize,
        count("benchmarked"),
        "only benchmarked correct configurations are results: {by_status:?}"
    );
    let (best_config, best_gflops, _) = truth
        .iter()
        .filter(|(_, _, wrong)| !wrong)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a correct configuration");
    let best = outcome.best.expect("a best configuration");
    let params: std::collections::BTreeMap<String, String> =
        best.params.clone().into_iter().collect();
    let tuned: std::collections::BTreeMap<String, String> = params
        .into_iter()
        .filter(|(name, _)| best_config.contains_key(name))
        .collect();
    assert_eq!(
        &tuned, best_config,
        "the job found the model's best: {best:?}"
    );
    assert!(
        (best.gflops - best_gflops).abs() <= best_gflops * 1e-6,
        "{} GFLOPS measured, {best_gflops} modeled",
        best.gflops
    );
    assert_eq!(best.backend, "simulated");
}

/// Jobs run in a row by the table-size test.
const JOBS_IN_A_ROW: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_job_tables_return_to_their_idle_size_after_every_job() {
    let farm = FarmOptions {
        daemons: 2,
        slices_per_daemon: 4,
        param_values: vec![2, 2, 2, 2],
        ..options()
    };
    let slices = farm.daemons * farm.slices_per_daemon as usize;
    let kernels = tempfile::tempdir().unwrap();
    write_farm_kernel(&kernels.path().join(FARM_KERNEL), &farm.param_values);
    let mut stack_options = StackOptions::new(node_bin!(), farm_fleet_toml(&farm));
    stack_options.kernel_root = kernels.path().to_path_buf();
    let stack = TestStack::start(stack_options).await;
    stack.wait_for_slices(slices, Duration::from_secs(60)).await;
    let leader = stack.leader.as_ref().unwrap();
    let idle = leader.table_sizes();
    assert_eq!(
        idle,
        LeaderTableSizes::default(),
        "an idle leader holds no job"
    );
    let workers = mtswarm_bus::Workers::open(leader.bus()).await.unwrap();
    let mut control = stack.control().await;
    for round in 0..JOBS_IN_A_ROW {
        let job_id = mtswarm_tests::jobs::submit(&mut control, farm_job(slices as u32, 120)).await;
        let job = wait_for_job(
            &mut control,
            &job_id,
            Duration::from_secs(120),
            None,
            || stack.worker_logs(),
        )
        .await;
        assert_eq!(
            job.state(),
            v1::JobState::Succeeded,
            "job {round}: {}: {}",
            job.error,
            job.final_answer
        );
        assert_eq!(job.agents_total as usize, slices);
        // The job's end is written before its runner is dropped and before
        // the workers' sessions have stopped: wait for both, bounded.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let sizes = leader.table_sizes();
            let sessions: u32 = workers
                .list()
                .await
                .unwrap()
                .iter()
                .map(|w| w.value.active_sessions)
                .sum();
            if sizes == idle && sessions == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "after job {round}: leader tables {sizes:?} (idle {idle:?}), {sessions} worker sessions\n{}",
                stack.worker_logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stack.wait_for_slices(slices, Duration::from_secs(30)).await;
    }
}
