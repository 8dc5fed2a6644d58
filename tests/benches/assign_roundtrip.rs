//! assign_task -> result round trip through a real worker daemon, against
//! raw NATS request/reply on the same nats-server in the same run.
//!
//! - `raw`: core NATS request/reply to an echo responder (the floor).
//! - `floor`: the same durable JetStream path without a worker daemon: the
//!   task is stored and delivered to a bare durable consumer that acks it
//!   and publishes a `TaskResult` at once. Two stored messages and two
//!   deliveries per task: the least any JetStream task design pays, so
//!   `assign` minus `floor` is the worker's own cost.
//! - `assign`: what the leader's `assign_task` + `collect_result` do on the
//!   wire: publish a `TaskAssignment` (JetStream, stream ack awaited) for a
//!   session of a real `WorkerDaemon` (in this process; builtin worker policy
//!   in its no-op mode, `{"noop": true}`), which runs one worker ReAct loop
//!   for it (engine, events, checkpoint), publishes the `TaskResult` and
//!   acks; the leader side's durable result consumer receives it.
//! - `secure`: `assign` as the default local stack runs it, on a second
//!   nats-server and worker daemon of the same run: NATS over TLS with an
//!   nkey identity per role and the generated least-privilege permissions,
//!   the worker's gRPC over TLS with bearer tokens (sessions spawned with
//!   the leader's token), and a result token per task. The last table is
//!   its p50 overhead over `assign`.
//!
//! The worker daemon owns one emulated board cut into `BENCH_SESSIONS`
//! single-core cluster slices (default 64) with one session each; tasks are
//! spread round-robin over the sessions, so with more tasks in flight than
//! sessions the extra ones wait in the session's JetStream queue (that wait
//! is part of the measured latency, as it would be for a leader).
//!
//! Each cell runs 1, 16 and 256 operations in flight for `BENCH_SECONDS`
//! (default 3) after a short warm-up, and prints p50/p99 latency and
//! throughput as a Markdown table, with the CPU time per operation of the
//! nats-server process and of this process (leader, worker daemon and, for
//! `floor`, the bare consumer). Run:
//! `cargo bench -p mtswarm-tests --bench assign_roundtrip`
//! (`BENCH_MODES=assign` runs only the named modes, for profiling).
//! Besides latency and CPU it prints the messages each mode stored per task,
//! by stream (KV buckets included), and assign against the floor side by
//! side: the ratios the dispatch targets are stated in.
//!
//! `raw` and `floor` are measured by the round-trip bench's floor
//! (`crates/bus/benches/floor/`, included here), as `cargo bench -p
//! mtswarm-bus --bench roundtrip` measures them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

#[path = "../../crates/bus/benches/floor/mod.rs"]
mod floor;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;

use floor::{
    Cell, FLOOR_SLICE, FLOOR_WORKER, IN_FLIGHT, JOB_ID, Leader, env_number, find, measure, us,
};
use mtswarm_bus::testing::NatsServer;
use mtswarm_bus::{TopologyConfig, v1};
use mtswarm_proto::v1::worker_client::WorkerClient;
use mtswarm_tests::stack::GrpcTransport;
use mtswarm_worker::{WorkerConfig, WorkerDaemon, WorkerHandle};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Raw,
    Floor,
    Assign,
    Secure,
}

struct Session {
    agent_id: String,
    session_id: String,
    worker_id: String,
    slice_id: String,
}

struct Harness {
    leader: Leader,
    sessions: Vec<Session>,
    /// Result tokens of the tasks (the secure stack's leader key).
    result_key: Option<mtswarm_auth::ResultKey>,
    /// The secure stack's decision key and the worker's record key: each
    /// task carries a signed placement grant, as the leader's
    /// `assign_task` sends it.
    grants: Option<(mtswarm_auth::DecisionSigner, String)>,
}

/// Messages ever stored per stream (its last sequence: a work-queue stream
/// deletes what was acked, the sequence still counts it), KV buckets
/// included, so the difference over a cell is what the cell stored.
async fn stored_messages(bus: &mtswarm_bus::Bus) -> BTreeMap<String, u64> {
    let js = bus.jetstream();
    let mut names = js.stream_names();
    let mut stored = BTreeMap::new();
    while let Some(Ok(name)) = names.next().await {
        if let Ok(mut stream) = js.get_stream(&name).await
            && let Ok(info) = stream.info().await
        {
            stored.insert(name, info.state.last_sequence);
        }
    }
    stored
}

fn timestamp(at: SystemTime) -> mtswarm_proto::prost_types::Timestamp {
    mtswarm_proto::prost_types::Timestamp::from(at)
}

async fn one_operation(harness: &Harness, mode: Mode) {
    match mode {
        Mode::Raw => harness.leader.raw().await,
        Mode::Floor | Mode::Assign | Mode::Secure => {
            let n = harness.leader.next_task();
            let session = &harness.sessions[(n as usize) % harness.sessions.len()];
            let (worker_id, slice_id) = if mode == Mode::Floor {
                (FLOOR_WORKER.to_owned(), FLOOR_SLICE.to_owned())
            } else {
                (session.worker_id.clone(), session.slice_id.clone())
            };
            let task_id = format!("bench-{n}");
            let result_token = harness
                .result_key
                .as_ref()
                .map(|key| key.token(JOB_ID, &task_id, 1))
                .unwrap_or_default();
            let now = SystemTime::now();
            let mut task = v1::TaskAssignment {
                task_id,
                job_id: JOB_ID.into(),
                attempt: 1,
                agent_id: session.agent_id.clone(),
                session_id: session.session_id.clone(),
                worker_id,
                slice_id,
                instructions: "No-op task.".into(),
                kernel_dir: "vecadd".into(),
                parameters_json: "{\"noop\":true}".into(),
                budgets: None,
                deadline: Some(timestamp(now + Duration::from_secs(600))),
                assigned_at: Some(timestamp(now)),
                resume_from_checkpoint: false,
                measure_baseline: false,
                result_token,
                grant: None,
            };
            if let Some((signer, worker_key)) = &harness.grants {
                let mut grant = mtswarm_auth::grant_for(&task, worker_key);
                signer.sign_grant(&mut grant).expect("grant");
                task.grant = Some(grant);
            }
            let status = harness.leader.round_trip(&task, false).await;
            assert_eq!(status, v1::TaskStatus::Ok, "no-op task failed");
        }
    }
}

/// The modes named in `BENCH_MODES` (comma-separated `raw`, `floor`,
/// `assign`; all by default), e.g. to profile one of them alone.
fn selected_modes() -> Vec<Mode> {
    let Ok(names) = std::env::var("BENCH_MODES") else {
        return vec![Mode::Raw, Mode::Floor, Mode::Assign, Mode::Secure];
    };
    let modes: Vec<Mode> = names
        .split(',')
        .filter_map(|name| match name.trim() {
            "raw" => Some(Mode::Raw),
            "floor" => Some(Mode::Floor),
            "assign" => Some(Mode::Assign),
            "secure" => Some(Mode::Secure),
            "" => None,
            other => panic!("BENCH_MODES: unknown mode `{other}` (raw, floor, assign, secure)"),
        })
        .collect();
    assert!(!modes.is_empty(), "BENCH_MODES names no mode");
    modes
}

fn fleet_toml(board: &str, sessions: u32) -> String {
    format!(
        "[[board]]\nid = \"{board}\"\nbackend = \"emulator\"\nspec = {{ clusters = {sessions} }}\nslicing = \"per-cluster\"\ncores = 1\n"
    )
}

/// SpawnSession calls in flight at once while the sessions are spawned.
const SPAWN_CONCURRENCY: usize = 16;

/// One session per slice of `worker`, spawned [`SPAWN_CONCURRENCY`] at a
/// time; prints how long the first 1,000 (or all, when fewer) took.
async fn spawn_sessions<T>(
    client: &WorkerClient<T>,
    worker: &WorkerHandle,
    prefix: &str,
) -> Vec<Session>
where
    T: GrpcTransport + Clone,
{
    use futures::StreamExt as _;
    let slices = worker.slice_ids();
    let total = slices.len();
    let started = std::time::Instant::now();
    let mut first_thousand = None;
    let mut spawned = Vec::with_capacity(total);
    let mut calls =
        futures::stream::iter(slices.into_iter().enumerate().map(|(index, slice_id)| {
            let mut client = client.clone();
            let agent_id = format!("{prefix}-agent-{index}");
            async move {
                let response = client
                    .spawn_session(v1::SpawnSessionRequest {
                        job_id: JOB_ID.into(),
                        agent_id: agent_id.clone(),
                        session_id: format!("{prefix}-session-{index}"),
                        slice_id,
                        role: "tuner".into(),
                        kernel_dir: "vecadd".into(),
                        auto_approve: true,
                        ..Default::default()
                    })
                    .await
                    .expect("SpawnSession")
                    .into_inner();
                Session {
                    agent_id,
                    session_id: response.session_id,
                    worker_id: response.worker_id,
                    slice_id: response.slice_id,
                }
            }
        }))
        .buffer_unordered(SPAWN_CONCURRENCY);
    while let Some(session) = calls.next().await {
        spawned.push(session);
        if spawned.len() == total.min(1_000) {
            first_thousand = Some(started.elapsed());
        }
    }
    if let Some(elapsed) = first_thousand {
        eprintln!(
            "{prefix}: spawned the first {} sessions in {:.3} s ({SPAWN_CONCURRENCY} at a time), all {total} in {:.3} s",
            total.min(1_000),
            elapsed.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }
    spawned
}

/// This process's resident set size, bytes (Linux `/proc/self/status`).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// The `secure` side: its own nats-server with the generated permissions
/// over TLS, a worker daemon with its NATS identity and gRPC TLS + tokens,
/// the leader side with the leader's identity.
async fn start_secure(
    dir: &std::path::Path,
    sessions: u32,
) -> (NatsServer, Arc<Harness>, WorkerHandle) {
    let fleet_path = dir.join("secure-fleet.toml");
    std::fs::write(&fleet_path, fleet_toml("bench", sessions)).expect("write fleet");
    let fleet = mtswarm_hw::fleet::Fleet::load(&fleet_path).expect("fleet");
    let deployment =
        mtswarm_cli::generate_deployment(&dir.join("credentials"), &fleet_path, &fleet, &[])
            .expect("credentials");
    let config = deployment
        .nats_server_config()
        .expect("nats-server configuration");
    let server = NatsServer::start_with_config(&config).expect("secure nats-server");
    let grpc = &deployment.grpc;
    let tls = mtswarm_bus::config::TlsConfig {
        require_tls: true,
        ca_file: Some(grpc.ca_file.clone()),
        client_cert: None,
    };
    let leader_config = deployment
        .bus_config(
            &server.url(),
            mtswarm_auth::generate::NATS_LEADER,
            "bench-secure-leader",
        )
        .expect("leader bus settings");
    let leader = mtswarm_bus::Bus::connect(leader_config)
        .await
        .expect("secure leader");
    leader
        .wait_connected(Duration::from_secs(10))
        .await
        .expect("secure leader up");
    leader
        .ensure_topology(&TopologyConfig::small())
        .await
        .expect("topology");
    let worker_tls = deployment.worker_tls("bench").expect("worker certificate");
    let security = mtswarm_auth::ServerSecurity::load(
        Some(&grpc.identities_file),
        Some((&worker_tls.cert_file, &worker_tls.key_file)),
    )
    .expect("security");
    let mut config = WorkerConfig::new(&fleet_path, "bench");
    config.nats_urls = vec![server.url()];
    config.topology = mtswarm_bus::TopologyConfig::small();
    config.nats_nkey_file = deployment.worker_seed("bench").map(|p| p.to_path_buf());
    config.nats_tls = tls;
    config.security = security;
    let signer = mtswarm_auth::DecisionSigner::load(&deployment.decision_key.seed_file)
        .expect("decision key");
    config.leader_key = Some(signer.verifier());
    let worker_key = mtswarm_auth::WorkerKey::derive(
        &mtswarm_auth::generate::read_seed(deployment.worker_seed("bench").expect("seed"))
            .expect("seed"),
    )
    .expect("record key")
    .public_key();
    config.kernel_root = mtswarm_tests::kernel_root();
    config.workspace_root = dir.join("secure-workspaces");
    config.max_sessions = sessions as usize;
    let worker = WorkerDaemon::start(config)
        .await
        .expect("secure worker daemon");
    let auth = mtswarm_auth::ClientAuth::none()
        .with_ca_file(&grpc.ca_file)
        .expect("ca")
        .with_token_file(
            grpc.token_file(mtswarm_auth::generate::LEADER_IDENTITY)
                .expect("leader token"),
        )
        .expect("token");
    let channel = auth
        .worker_endpoint(
            worker.worker_id(),
            worker.endpoint(),
            Duration::from_secs(10),
        )
        .expect("endpoint")
        .connect()
        .await
        .expect("worker gRPC over TLS");
    let pass: fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> = Ok;
    let client = WorkerClient::with_interceptor(channel, auth.interceptor(pass));
    let spawned = spawn_sessions(&client, &worker, "secure").await;
    let key = mtswarm_auth::ResultKey::load(&deployment.result_key_file).expect("result key");
    let harness = Arc::new(Harness {
        leader: Leader::new(leader, "bench-secure"),
        sessions: spawned,
        result_key: Some(key),
        grants: Some((signer, worker_key)),
    });
    (server, harness, worker)
}

fn main() {
    let seconds: f64 = env_number("BENCH_SECONDS", 3.0);
    let sessions: u32 = env_number("BENCH_SESSIONS", 64);
    let duration = Duration::from_secs_f64(seconds);
    let modes = selected_modes();
    let runtime = floor::runtime();
    let server = NatsServer::start().expect("nats-server from PATH");
    let server_pid = server.pid().map(|pid| pid.to_string()).unwrap_or_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let (cells, stored) = runtime.block_on(async {
        let (harness, worker) = start_plain(&server, dir.path(), sessions).await;
        let secure = if modes.contains(&Mode::Secure) {
            Some(start_secure(dir.path(), sessions).await)
        } else {
            None
        };
        let sides = Sides {
            plain: harness,
            plain_pid: server_pid,
            secure: secure.as_ref().map(|(server, harness, _)| {
                let pid = server.pid().map(|pid| pid.to_string()).unwrap_or_default();
                (harness.clone(), pid)
            }),
        };
        let measured = measure_every_cell(&modes, duration, &sides).await;
        if let Err(error) = worker.shutdown().await {
            eprintln!("worker shutdown: {error}");
        }
        if let Some((server, _, worker)) = secure {
            if let Err(error) = worker.shutdown().await {
                eprintln!("secure worker shutdown: {error}");
            }
            drop(server);
        }
        measured
    });
    print_against_the_floor(&cells);
    print_assign_against_floor(&cells);
    print_stored_per_task(&stored);
    print_secure_overhead(&cells);
}

/// The plain side: the floor's leader on `server` and a real worker daemon
/// with one single-core slice per session, its sessions spawned.
async fn start_plain(
    server: &NatsServer,
    dir: &std::path::Path,
    sessions: u32,
) -> (Arc<Harness>, WorkerHandle) {
    let leader = floor::start_floor(&server.url(), &TopologyConfig::small(), "bench-assign").await;

    // A real worker daemon with one single-core slice per session.
    let fleet = dir.join("fleet.toml");
    std::fs::write(&fleet, fleet_toml("bench", sessions)).expect("write fleet");
    let mut config = WorkerConfig::new(&fleet, "bench");
    config.nats_urls = vec![server.url()];
    config.topology = mtswarm_bus::TopologyConfig::small();
    config.kernel_root = mtswarm_tests::kernel_root();
    config.workspace_root = dir.join("workspaces");
    config.max_sessions = sessions as usize;
    let worker = WorkerDaemon::start(config).await.expect("worker daemon");
    let client = WorkerClient::connect(format!("http://{}", worker.grpc_addr()))
        .await
        .expect("worker gRPC");
    let before = resident_bytes();
    let spawned = spawn_sessions(&client, &worker, "bench").await;
    let after = resident_bytes();
    eprintln!(
        "worker daemon with {} sessions: process RSS {:.1} MB before spawning, {:.1} MB after ({:.1} KB per idle session)",
        spawned.len(),
        before as f64 / 1e6,
        after as f64 / 1e6,
        after.saturating_sub(before) as f64 / 1e3 / spawned.len().max(1) as f64
    );

    let harness = Arc::new(Harness {
        leader,
        sessions: spawned,
        result_key: None,
        grants: None,
    });
    (harness, worker)
}

/// The sides a mode runs on: the plain one, and the secure one when asked
/// for; each with its nats-server's pid.
struct Sides {
    plain: Arc<Harness>,
    plain_pid: String,
    secure: Option<(Arc<Harness>, String)>,
}

/// Messages stored per mode: operations measured and messages, by stream.
type Stored = BTreeMap<String, (u64, BTreeMap<String, u64>)>;

/// Every mode at every number of operations in flight, with what each
/// stored.
async fn measure_every_cell(
    modes: &[Mode],
    duration: Duration,
    sides: &Sides,
) -> (Vec<Cell<Mode>>, Stored) {
    let mut cells = Vec::new();
    // Per mode: operations measured and messages stored, by stream.
    let mut stored: Stored = BTreeMap::new();
    for in_flight in IN_FLIGHT {
        for mode in modes.iter().copied() {
            let (side, pid) = match (&sides.secure, mode) {
                (Some((secure, pid)), Mode::Secure) => (secure.clone(), pid),
                _ => (sides.plain.clone(), &sides.plain_pid),
            };
            let counted_side = side.clone();
            let operation = move || {
                let side = side.clone();
                async move { one_operation(&side, mode).await }
            };
            let warm_up = Duration::from_millis(500);
            let counted = counted_side.leader.bus().clone();
            let before = stored_messages(&counted).await;
            let started = counted_side.leader.next_task();
            let cell = measure(mode, in_flight, warm_up, duration, pid, operation).await;
            let operations = counted_side.leader.next_task() - started - 1;
            let after = stored_messages(&counted).await;
            let entry = stored.entry(format!("{mode:?}")).or_default();
            entry.0 += operations;
            for (name, last) in after {
                let delta = last.saturating_sub(before.get(&name).copied().unwrap_or(0));
                *entry.1.entry(name).or_default() += delta;
            }
            eprintln!(
                "{:<8} in-flight {:>3}: p50 {:>9.1} us  p99 {:>9.1} us  {:>9.0} ops/s ({} ops)  cpu/op server {:>6.1} us client {:>6.1} us",
                format!("{:?}", cell.mode),
                cell.in_flight,
                us(cell.p50),
                us(cell.p99),
                cell.per_second,
                cell.operations,
                us(cell.server_cpu_per_op),
                us(cell.client_cpu_per_op),
            );
            cells.push(cell);
        }
    }
    (cells, stored)
}

/// Raw, floor and assign side by side, and assign's CPU per task.
fn print_against_the_floor(cells: &[Cell<Mode>]) {
    println!();
    println!(
        "| in flight | raw p50 (us) | raw p99 (us) | raw ops/s | floor p50 (us) | floor p99 (us) | floor tasks/s | assign p50 (us) | assign p99 (us) | no-op tasks/s | floor p50 / raw p50 | assign p50 / raw p50 | CPU/task server (us) | CPU/task client (us) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for in_flight in IN_FLIGHT {
        let cell = |mode| find(cells, mode, in_flight);
        if let (Some(raw), Some(floor), Some(assign)) =
            (cell(Mode::Raw), cell(Mode::Floor), cell(Mode::Assign))
        {
            println!(
                "| {in_flight} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {:.1}x | {:.1}x | {:.1} | {:.1} |",
                us(raw.p50),
                us(raw.p99),
                raw.per_second,
                us(floor.p50),
                us(floor.p99),
                floor.per_second,
                us(assign.p50),
                us(assign.p99),
                assign.per_second,
                floor.p50.as_secs_f64() / raw.p50.as_secs_f64().max(1e-9),
                assign.p50.as_secs_f64() / raw.p50.as_secs_f64().max(1e-9),
                us(assign.server_cpu_per_op),
                us(assign.client_cpu_per_op),
            );
        }
    }
}

/// Assign against the floor: the ratios the dispatch targets are stated in.
fn print_assign_against_floor(cells: &[Cell<Mode>]) {
    println!();
    println!(
        "| in flight | floor p50 (us) | assign p50 (us) | assign p50 / floor p50 | floor tasks/s | no-op tasks/s | no-op / floor tasks/s | CPU/task server floor -> assign (us) | CPU/task client floor -> assign (us) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for in_flight in IN_FLIGHT {
        let cell = |mode| find(cells, mode, in_flight);
        if let (Some(floor), Some(assign)) = (cell(Mode::Floor), cell(Mode::Assign)) {
            println!(
                "| {in_flight} | {:.1} | {:.1} | {:.1}x | {:.0} | {:.0} | {:.0} % | {:.1} -> {:.1} | {:.1} -> {:.1} |",
                us(floor.p50),
                us(assign.p50),
                assign.p50.as_secs_f64() / floor.p50.as_secs_f64().max(1e-9),
                floor.per_second,
                assign.per_second,
                assign.per_second / floor.per_second.max(1e-9) * 100.0,
                us(floor.server_cpu_per_op),
                us(assign.server_cpu_per_op),
                us(floor.client_cpu_per_op),
                us(assign.client_cpu_per_op),
            );
        }
    }
}

/// The messages each mode stored per task, by stream.
fn print_stored_per_task(stored: &Stored) {
    println!();
    println!("| mode | stream | stored messages per task |");
    println!("|---|---|---|");
    for (mode, (operations, streams)) in stored {
        if matches!(mode.as_str(), "Raw") || *operations == 0 {
            continue;
        }
        for (name, count) in streams.iter().filter(|(_, c)| **c > 0) {
            println!(
                "| {mode} | {name} | {:.2} |",
                *count as f64 / *operations as f64
            );
        }
    }
}

/// The secure stack's overhead over `assign`.
fn print_secure_overhead(cells: &[Cell<Mode>]) {
    println!();
    println!(
        "| in flight | assign p50 (us) | secure p50 (us) | p50 overhead | assign p99 (us) | secure p99 (us) | secure tasks/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for in_flight in IN_FLIGHT {
        let cell = |mode| find(cells, mode, in_flight);
        if let (Some(assign), Some(secure)) = (cell(Mode::Assign), cell(Mode::Secure)) {
            println!(
                "| {in_flight} | {:.1} | {:.1} | {:+.1} % | {:.1} | {:.1} | {:.0} |",
                us(assign.p50),
                us(secure.p50),
                (secure.p50.as_secs_f64() / assign.p50.as_secs_f64().max(1e-9) - 1.0) * 100.0,
                us(assign.p99),
                us(secure.p99),
                secure.per_second,
            );
        }
    }
}
