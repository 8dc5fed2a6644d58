//! A farm on one machine: `BENCH_DAEMONS` (default 16) worker daemon
//! processes, each owning one simulated board of `BENCH_SLICES_PER_DAEMON`
//! (default 64) single-core slices, a leader process and a real
//! nats-server; one job with one agent per slice (`num_agents` = the slice
//! count, 1,024 by default) over a synthetic kernel of `BENCH_CONFIGS_PER_AGENT`
//! (default 2) configurations per agent, submitted over gRPC. It waits for
//! the job (at most `BENCH_TIMEOUT_SECONDS`, default 1800, with progress
//! lines every 5 s) and prints, as a Markdown table: slices, agents spawned,
//! tasks done, wall time, the leader's peak RSS and RSS per agent, its CPU
//! seconds and CPU per agent (from `/proc/<pid>/status` and
//! `/proc/<pid>/stat`, before and after the job), and the job's best
//! result next to the model's true best. It also reports the spawn time
//! (submit until the job record lists every agent, polled every 50 ms) and
//! the liveness writes per second: every put of the leases bucket (daemon
//! leases and slice claims) and the workers bucket, counted from their
//! `$KV` subjects, over `BENCH_IDLE_SECONDS` (default: the lease TTL) of an
//! idle farm before the job and over the job itself (`BENCH_JOB=false`:
//! only the idle figure, e.g. for a farm too large to run a job on).
//!
//! The workers are processes (one per board, as a farm runs them); a
//! simulated run is a timer, so 16 daemons fit on two cores. Run:
//! `cargo bench -p mtswarm-tests --bench farm`
//! (`BENCH_RUN_MS=5,20` and `BENCH_INCORRECT=0.1` set the boards' run time
//! per execution and wrong-answer share, `BENCH_LEASE_TTL_SECONDS` (30) the
//! workers' slice lease TTL).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: a panic is a failed run

use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt as _;
use mtswarm_bus::subjects;
use mtswarm_proto::v1;
use mtswarm_tests::farm::{
    FarmOptions, FarmStack, ProcessFigures, farm_job, process_figures, wait_for_job,
};
use mtswarm_tests::node_bin;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text} is not a valid value")),
        Err(_) => default,
    }
}

fn run_ms() -> (u64, u64) {
    let text = std::env::var("BENCH_RUN_MS").unwrap_or_else(|_| "5,20".into());
    let ends: Vec<u64> = text
        .split(',')
        .map(|t| {
            t.trim()
                .parse()
                .unwrap_or_else(|_| panic!("BENCH_RUN_MS={text}: expected LOW,HIGH milliseconds"))
        })
        .collect();
    match ends.as_slice() {
        [fixed] => (*fixed, *fixed),
        [low, high] => (*low, *high),
        _ => panic!("BENCH_RUN_MS={text}: expected LOW,HIGH milliseconds"),
    }
}

/// Values of four parameters whose product is at least `configs`.
fn param_values(configs: usize) -> Vec<usize> {
    let mut values = vec![1usize; 4];
    let mut index = 0;
    while values.iter().product::<usize>() < configs {
        values[index % 4] += 1;
        index += 1;
    }
    values
}

/// Counts every put to the liveness buckets (slice leases and worker
/// heartbeats) from their `$KV` subjects.
async fn count_liveness_writes(url: &str) -> Arc<AtomicU64> {
    let client = async_nats::connect(url).await.expect("NATS for counting");
    let count = Arc::new(AtomicU64::new(0));
    for bucket in [subjects::LEASES_BUCKET, subjects::WORKERS_BUCKET] {
        let mut subscription = client
            .subscribe(format!("$KV.{bucket}.>"))
            .await
            .expect("subscribe");
        let count = Arc::clone(&count);
        tokio::spawn(async move {
            while subscription.next().await.is_some() {
                count.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    client.flush().await.expect("flush");
    // The client lives as long as the counting tasks hold its subscriptions.
    std::mem::forget(client);
    count
}

/// The farm the `BENCH_*` knobs describe: `daemons` boards of `slices`
/// slices, a synthetic space of `BENCH_CONFIGS_PER_AGENT` configurations
/// per agent.
fn farm_options(daemons: usize, slices: u32) -> FarmOptions {
    let per_agent: usize = env_or("BENCH_CONFIGS_PER_AGENT", 2);
    FarmOptions {
        node_bin: node_bin!(),
        daemons,
        slices_per_daemon: slices,
        run_ms: run_ms(),
        incorrect_fraction: env_or("BENCH_INCORRECT", 0.1),
        noise: 0.005,
        param_values: param_values(daemons * slices as usize * per_agent),
        leader_env: Vec::new(),
        log_level: "info".into(),
        // A thousand leases renewed on two shared cores: a longer TTL than
        // the default keeps a late renewal from fencing a running session.
        worker_args: vec![
            "--lease-ttl".into(),
            env_or("BENCH_LEASE_TTL_SECONDS", 30u64).to_string(),
        ],
    }
}

/// Liveness writes per second of the idle farm over `BENCH_IDLE_SECONDS`
/// (by default the lease TTL: three renewal periods, since renewals come
/// in bursts a period apart and a window of one period may hold none or two).
async fn idle_rate(writes: &AtomicU64) -> f64 {
    let ttl = env_or("BENCH_LEASE_TTL_SECONDS", 30u64);
    let idle = Duration::from_secs(env_or("BENCH_IDLE_SECONDS", ttl));
    let from = writes.load(Ordering::Relaxed);
    tokio::time::sleep(idle).await;
    (writes.load(Ordering::Relaxed) - from) as f64 / idle.as_secs_f64()
}

/// When the job record first counted `agents` agents, from `submitted`.
/// Read with ListJobs (the job records alone), as `wait_for_job` reads
/// the job's state: a GetJob every 50 ms would read every agent's and
/// task's key each time, and the leader's CPU is the job's, not the
/// observer's.
fn watch_spawn_time(
    mut control: mtswarm_tests::stack::Control,
    job_id: String,
    agents: usize,
    submitted: Instant,
) -> tokio::task::JoinHandle<Option<Duration>> {
    tokio::spawn(async move {
        loop {
            let job = mtswarm_tests::jobs::list_all_jobs(&mut control)
                .await
                .into_iter()
                .find(|job| job.job_id == job_id)?;
            if job.agents_total as usize >= agents {
                return Some(submitted.elapsed());
            }
            if mtswarm_tests::jobs::is_final(job.state()) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

async fn run() {
    let daemons: usize = env_or("BENCH_DAEMONS", 16);
    let slices: u32 = env_or("BENCH_SLICES_PER_DAEMON", 64);
    let timeout = Duration::from_secs(env_or("BENCH_TIMEOUT_SECONDS", 1800));
    let agents = daemons * slices as usize;
    let options = farm_options(daemons, slices);
    eprintln!(
        "farm: starting {daemons} worker daemons x {slices} slices, run_ms {:?}",
        options.run_ms
    );
    let started = Instant::now();
    let farm = FarmStack::start(options).await;
    farm.wait_for_all_slices(Duration::from_secs(300)).await;
    eprintln!(
        "farm: {} slices free after {:.1} s",
        farm.slices(),
        started.elapsed().as_secs_f64()
    );
    let writes = count_liveness_writes(&farm.nats.url()).await;
    let idle_rate = idle_rate(&writes).await;
    if !env_or("BENCH_JOB", true) {
        println!(
            "\n| slices | liveness writes (leases + worker heartbeats) per second, idle |\n| --- | --- |\n| {} ({daemons} x {slices}) | {idle_rate:.0} |",
            farm.slices()
        );
        return;
    }
    let pid = farm.leader.pid();
    let before = process_figures(pid);
    let mut control = farm.control().await;
    let job_writes_from = writes.load(Ordering::Relaxed);
    let submitted = Instant::now();
    let job_id =
        mtswarm_tests::jobs::submit(&mut control, farm_job(agents as u32, timeout.as_secs())).await;
    let spawn_time = watch_spawn_time(farm.control().await, job_id.clone(), agents, submitted);
    let job = wait_for_job(
        &mut control,
        &job_id,
        timeout,
        Some(Duration::from_secs(5)),
        || farm.logs(),
    )
    .await;
    let wall = submitted.elapsed();
    let job_rate =
        (writes.load(Ordering::Relaxed) - job_writes_from) as f64 / wall.as_secs_f64().max(1e-9);
    let spawn_time = spawn_time.await.ok().flatten();
    let after = process_figures(pid);
    let spawned = job.agents_total.max(job.agent_ids.len() as u32);
    let per_agent_count = f64::from(spawned.max(1));
    let truth = farm.model_truth();
    let model_best = truth
        .iter()
        .filter(|(_, _, wrong)| !wrong)
        .map(|(_, gflops, _)| *gflops)
        .fold(0.0, f64::max);
    let outcome = job.outcome.clone().unwrap_or_default();
    let best = outcome.best.clone().unwrap_or_default();

    println!(
        "\n## Farm: one job over {} simulated slices\n",
        farm.slices()
    );
    println!("| figure | value |\n| --- | --- |");
    println!(
        "| slices (daemons x slices) | {} ({daemons} x {slices}) |",
        farm.slices()
    );
    println!("| job state | {:?} |", job.state());
    println!("| agents spawned | {spawned} |");
    println!("| tasks done | {} / {} |", job.tasks_done, job.tasks_total);
    println!(
        "| configurations (valid records / by status) | {} ({} / {:?}) |",
        truth.len(),
        outcome.valid_records,
        outcome.candidates_by_status
    );
    println!(
        "| spawn time, submit to every agent listed | {} |",
        spawn_time.map_or_else(
            || "not all spawned".to_owned(),
            |t| format!("{:.2} s", t.as_secs_f64())
        )
    );
    println!(
        "| wall time, submit to final | {:.1} s |",
        wall.as_secs_f64()
    );
    println!(
        "| liveness writes (leases + worker heartbeats) per second, idle / during the job | {idle_rate:.0} / {job_rate:.0} |"
    );
    print_leader_rows(&before, &after, per_agent_count);
    println!(
        "| best result | {:.3} GFLOPS {:?} on {} |",
        best.gflops, best.params, best.slice_id
    );
    println!("| model's best among the correct configurations | {model_best:.3} GFLOPS |");
    if job.state() != v1::JobState::Succeeded {
        eprintln!(
            "job did not succeed: {}\n{}\n{}",
            job.error,
            job.final_answer,
            farm.logs()
        );
        // The processes go with the farm; exit skips destructors.
        drop(farm);
        std::process::exit(1);
    }
}

/// The leader process's rows: RSS and CPU, in all and per agent.
fn print_leader_rows(before: &ProcessFigures, after: &ProcessFigures, agents: f64) {
    let cpu = after.cpu_seconds - before.cpu_seconds;
    println!(
        "| leader RSS before / after / peak | {:.1} / {:.1} / {:.1} MB |",
        mb(before.rss_bytes),
        mb(after.rss_bytes),
        mb(after.peak_rss_bytes)
    );
    println!(
        "| leader RSS growth per agent | {:.1} KB |",
        (after.rss_bytes.saturating_sub(before.rss_bytes)) as f64 / 1024.0 / agents
    );
    println!(
        "| leader peak RSS per agent | {:.1} KB |",
        after.peak_rss_bytes as f64 / 1024.0 / agents
    );
    println!("| leader CPU during the job | {cpu:.2} s |");
    println!("| leader CPU per agent | {:.2} ms |", cpu * 1000.0 / agents);
}

fn main() {
    // `cargo bench` passes `--bench`; filters are not supported.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(run());
}
