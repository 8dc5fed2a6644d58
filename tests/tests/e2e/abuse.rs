//! The abuses tried against a default `mtswarm up`, as an attacker on
//! 127.0.0.1 would try them, each now failing: the stack under test is a
//! real `mtswarm up` (nats-server, leader and two worker daemons as
//! processes, with the credentials it generates), the attacker a client of
//! its own. The KV junk case lives with the bucket listings.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mtswarm_auth::{ClientAuth, ClientConfig, ClientProfile};
use mtswarm_bus::{Bus, BusConfig, subjects, v1};
use mtswarm_tests::cli::spawn_up;
use mtswarm_tests::jobs::{approvals as approvals_of, get_job, submit};
use mtswarm_tests::{NodeProcess, node_bin};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const WAIT: Duration = Duration::from_secs(120);

type Pass = fn(Request<()>) -> Result<Request<()>, Status>;
type Control = v1::control_client::ControlClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;
type Worker = v1::worker_client::WorkerClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;

fn pass(request: Request<()>) -> Result<Request<()>, Status> {
    Ok(request)
}

/// Submits a one-agent vecadd job as `admin`'s identity; its id.
async fn submit_vecadd(admin: &mut Control) -> String {
    let spec = v1::JobSpec {
        goal: "Tune the vecadd kernel.".into(),
        kernel_dir: "vecadd".into(),
        num_agents: 1,
        ..Default::default()
    };
    submit(admin, spec).await
}

/// The job once it is no longer queued or running; `None` (after a short
/// pause) while it still is. Panics with the job after `deadline`.
async fn finished_job(
    admin: &mut Control,
    job_id: &str,
    deadline: Instant,
) -> Option<v1::JobRecord> {
    let record = get_job(admin, job_id).await;
    if !matches!(record.state(), v1::JobState::Queued | v1::JobState::Running) {
        return Some(record);
    }
    assert!(
        Instant::now() < deadline,
        "the job did not finish: {record:?}"
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    None
}

/// A running `mtswarm up` and what it wrote for its clients.
struct SecureUp {
    up: NodeProcess,
    ready: serde_json::Value,
    client: ClientProfile,
    client_config: PathBuf,
    credentials: PathBuf,
    _dir: tempfile::TempDir,
}

impl SecureUp {
    fn start() -> SecureUp {
        let dir = tempfile::tempdir().expect("temp dir");
        let client_config = dir.path().join("config.toml");
        let (up, ready) = spawn_up(node(&client_config), dir.path(), WAIT);
        let ready = ready.document;
        let client = ClientConfig::load(&client_config)
            .expect("client configuration readable")
            .expect("mtswarm up wrote the client configuration")
            .local;
        let credentials = client
            .ca_file
            .as_deref()
            .and_then(Path::parent)
            .expect("credentials directory")
            .to_path_buf();
        SecureUp {
            up,
            ready,
            client,
            client_config,
            credentials,
            _dir: dir,
        }
    }

    fn leader_url(&self) -> String {
        self.client.leader.clone().expect("leader url")
    }

    fn nats_url(&self) -> String {
        self.client.nats.clone().expect("nats url")
    }

    fn ca(&self) -> ClientAuth {
        ClientAuth::none()
            .with_ca_file(self.client.ca_file.as_deref().expect("ca"))
            .expect("ca file")
    }

    fn token(&self, identity: &str) -> ClientAuth {
        self.ca()
            .with_token_file(
                &self
                    .credentials
                    .join("tokens")
                    .join(format!("{identity}.token")),
            )
            .expect("token file")
    }

    async fn control(&self, auth: ClientAuth) -> Control {
        let channel = auth
            .endpoint(&self.leader_url(), WAIT)
            .expect("endpoint")
            .connect()
            .await
            .expect("TLS connection to the leader");
        v1::control_client::ControlClient::with_interceptor(channel, auth.interceptor(pass as Pass))
    }

    async fn worker(&self, auth: ClientAuth) -> Worker {
        let url = self.ready["workers"][0]["grpc"]
            .as_str()
            .expect("worker url")
            .to_string();
        let channel = auth
            .endpoint(&url, WAIT)
            .expect("endpoint")
            .connect()
            .await
            .expect("TLS connection to the worker");
        v1::worker_client::WorkerClient::with_interceptor(channel, auth.interceptor(pass as Pass))
    }

    /// A NATS connection as `identity` (`leader`, `client`, a worker id), or
    /// anonymous; TLS with the stack's CA either way.
    async fn nats(&self, identity: Option<&str>) -> Result<Bus, mtswarm_bus::BusError> {
        let mut config = BusConfig::new(self.nats_url()).with_name("attacker");
        config.retry_on_initial_connect = false;
        config.request_timeout = Duration::from_secs(3);
        config.tls.require_tls = true;
        config.tls.ca_file = self.client.ca_file.clone();
        if let Some(identity) = identity {
            let seed = mtswarm_auth::generate::read_seed(
                &self.credentials.join("nats").join(format!("{identity}.nk")),
            )
            .expect("seed");
            config.nkey_seed = Some(seed);
            config.inbox_prefix = Some(match identity {
                "leader" => "_INBOX".to_string(),
                "client" => mtswarm_bus::permissions::CLIENT_INBOX_PREFIX.to_string(),
                worker => mtswarm_bus::permissions::worker_inbox_prefix(worker),
            });
        }
        let bus = Bus::connect(config).await?;
        bus.wait_connected(Duration::from_secs(10)).await?;
        Ok(bus)
    }

    fn leader_log(&self) -> String {
        let logs = PathBuf::from(self.ready["logs"].as_str().expect("logs"));
        std::fs::read_to_string(logs.join("leader.log")).unwrap_or_default()
    }

    fn stop(mut self) {
        self.up.interrupt().expect("SIGINT");
        let status = self.up.wait_exit(WAIT).unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "{status}; {}", self.up.stderr());
        assert!(
            !self.client_config.exists(),
            "the stack's client configuration outlived it"
        );
    }
}

fn node(client_config: &Path) -> Command {
    let mut command = Command::new(node_bin!());
    command
        .env("MTSWARM_CACHE_DIR", mtswarm_tests::emulator_cache_dir())
        .env("MTSWARM_CONFIG", client_config)
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_NATS_URL")
        .env_remove("MTSWARM_FLEET")
        .env_remove("MTSWARM_TOKEN_FILE")
        .env_remove("MTSWARM_TLS_CA")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) -> Status {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), code, "{status:?}");
    status
}

/// Acceptance 2: anonymous gRPC calls are refused on the leader and the
/// workers, and the README commands work with nothing extra typed.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_stack_refuses_anonymous_grpc_and_the_readme_commands_work() {
    let stack = SecureUp::start();
    assert!(
        stack.leader_url().starts_with("https://"),
        "{}",
        stack.ready
    );

    let mut anonymous = stack.control(stack.ca()).await;
    assert_code(
        anonymous.list_jobs(v1::ListJobsRequest::default()).await,
        Code::Unauthenticated,
    );
    // Anonymous DecideApproval and CancelJob, the first two abuses.
    assert_code(
        anonymous
            .decide_approval(v1::DecideApprovalRequest {
                approval_id: "ap-x".into(),
                verdict: v1::ApprovalVerdict::Approve as i32,
                reason: String::new(),
                decided_by: "mallory".into(),
                ..Default::default()
            })
            .await,
        Code::Unauthenticated,
    );
    assert_code(
        anonymous
            .cancel_job(v1::CancelJobRequest {
                job_id: "some-job".into(),
                reason: "mine now".into(),
            })
            .await,
        Code::Unauthenticated,
    );
    // An anonymous Drain or SpawnSession on a worker; an admin is no leader.
    let mut worker = stack.worker(stack.ca()).await;
    assert_code(
        worker
            .drain(v1::DrainRequest {
                grace_seconds: 1,
                reason: "attack".into(),
            })
            .await,
        Code::Unauthenticated,
    );
    let mut as_admin = stack.worker(stack.token("admin")).await;
    let denied = assert_code(
        as_admin
            .spawn_session(v1::SpawnSessionRequest {
                job_id: "j".into(),
                agent_id: "a".into(),
                session_id: "s-rogue".into(),
                slice_id: "board0-c0".into(),
                role: "tuner".into(),
                kernel_dir: "vecadd".into(),
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
    );
    assert!(denied.message().contains("`leader`"), "{denied:?}");

    // README: `mtswarm fleet` with nothing but the client configuration.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let output = node(&stack.client_config)
            .args(["fleet", "--json"])
            .output()
            .expect("run mtswarm fleet");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let fleet: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        if fleet["slices"].as_array().map(Vec::len) == Some(8) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fleet never showed 8 slices: {fleet}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ... and through the printed `export MTSWARM_LEADER=<url>`.
    let output = node(&stack.client_config)
        .env("MTSWARM_LEADER", stack.leader_url())
        .args(["jobs"])
        .output()
        .expect("run mtswarm jobs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stack.stop();
}

/// Acceptance 2 and the KV abuse: an anonymous NATS client cannot connect
/// at all, with or without TLS; a client identity reads measurements only.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_stack_refuses_anonymous_nats_clients() {
    let stack = SecureUp::start();
    let refused = stack.nats(None).await.expect_err("anonymous NATS");
    let text = refused.to_string().to_lowercase();
    assert!(text.contains("authoriz"), "{refused}");
    let plain = async_nats::ConnectOptions::new()
        .connect(stack.nats_url().replace("tls://", "nats://"))
        .await;
    assert!(
        plain.is_err(),
        "a plaintext anonymous connection was accepted"
    );

    let client = stack.nats(Some("client")).await.expect("client identity");
    let jobs = mtswarm_bus::Jobs::open(&client).await;
    assert!(jobs.is_err(), "the client identity opened the jobs bucket");
    let deleted = client
        .jetstream()
        .delete_stream(subjects::RESULTS_STREAM)
        .await;
    assert!(
        deleted.is_err(),
        "the client identity deleted the results stream"
    );
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    leader
        .jetstream()
        .get_stream(subjects::RESULTS_STREAM)
        .await
        .expect("the results stream is still there");
    stack.stop();
}

/// A worker's identity is confined to its own part: it may not delete
/// streams, read job records, publish tasks (a task published without the
/// leader), or publish approval decisions.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_identity_cannot_act_as_the_leader() {
    let stack = SecureUp::start();
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let leader = stack.nats(Some("leader")).await.expect("leader identity");

    assert!(
        rogue
            .jetstream()
            .delete_stream(subjects::RESULTS_STREAM)
            .await
            .is_err(),
        "a worker deleted the results stream"
    );
    assert!(
        mtswarm_bus::Jobs::open(&rogue).await.is_err(),
        "a worker opened the jobs bucket"
    );
    // A task for board0's slice published by board1's identity is refused.
    let task = v1::TaskAssignment {
        task_id: "rogue-task".into(),
        job_id: "rogue-job".into(),
        attempt: 1,
        agent_id: "a".into(),
        session_id: "s".into(),
        worker_id: "worker-board0".into(),
        slice_id: "board0-c0".into(),
        ..Default::default()
    };
    assert!(
        rogue.publish_task(&task).await.is_err(),
        "a worker published a task"
    );
    let mut stream = leader
        .jetstream()
        .get_stream(subjects::TASKS_STREAM)
        .await
        .expect("tasks stream");
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.messages, 0, "a task was stored: {info:?}");

    // A decision published by a worker never reaches a session: the leader
    // identity, subscribed to the session's decisions, sees only the
    // genuine one published after it.
    let mut decisions = leader
        .subscribe_approval_decisions("s-victim")
        .await
        .expect("subscribe");
    leader.flush().await.expect("flush");
    let forged = v1::ApprovalDecision {
        approval_id: "ap-victim".into(),
        job_id: "j".into(),
        session_id: "s-victim".into(),
        call_id: "c".into(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        decided_by: "mallory".into(),
        ..Default::default()
    };
    for _ in 0..121 {
        let _ = rogue.publish_approval_decision(&forged).await;
    }
    let _ = rogue.flush().await;
    let genuine = v1::ApprovalDecision {
        decided_by: "leader".into(),
        verdict: v1::ApprovalVerdict::Deny as i32,
        ..forged.clone()
    };
    leader
        .publish_approval_decision(&genuine)
        .await
        .expect("the leader publishes");
    let first = tokio::time::timeout(WAIT, decisions.next())
        .await
        .expect("a decision in time")
        .expect("a decision")
        .expect("decodable")
        .message;
    assert_eq!(first.decided_by, "leader", "{first:?}");
    stack.stop();
}

/// A result published by another worker's identity for a task it was not
/// placed for, with the genuine message id, is dropped and logged; the
/// genuine result is not taken for a duplicate and is the job's result.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_result_is_dropped_and_the_genuine_one_counts() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let job_id = submit_vecadd(&mut admin).await;
    let record = get_job(&mut admin, &job_id).await;
    assert_eq!(record.submitted_by, "admin");

    // The first task is on record before it is published.
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    let jobs = mtswarm_bus::Jobs::open(&leader).await.expect("jobs");
    let deadline = Instant::now() + WAIT;
    let assignment = loop {
        let tasks = jobs.tasks(&job_id).await.expect("the job's tasks");
        if let Some(task) = tasks.first().and_then(|t| t.assignment.clone()) {
            break task;
        }
        assert!(Instant::now() < deadline, "no task was assigned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The forger: the other board's worker identity.
    let forger_id = if assignment.worker_id == "worker-board0" {
        "worker-board1"
    } else {
        "worker-board0"
    };
    let forger = stack.nats(Some(forger_id)).await.expect("forger identity");
    let forged = v1::TaskResult {
        task_id: assignment.task_id.clone(),
        attempt: assignment.attempt,
        job_id: job_id.clone(),
        agent_id: assignment.agent_id.clone(),
        session_id: assignment.session_id.clone(),
        worker_id: assignment.worker_id.clone(),
        slice_id: assignment.slice_id.clone(),
        status: v1::TaskStatus::Ok as i32,
        summary: "987654 GFLOPS".into(),
        result_json: r#"{"best":{"gflops":987654.0}}"#.into(),
        ..Default::default()
    };
    // With the genuine message id (the old scheme) and with a guessed token.
    forger.publish_result(&forged).await.expect("stored");
    let guessed = v1::TaskResult {
        result_token: "0".repeat(32),
        ..forged.clone()
    };
    forger.publish_result(&guessed).await.expect("stored");

    // Let the job run: approve what its agent asks for.
    let mut approver = stack.control(stack.token("approver")).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    let record = loop {
        let pending = approvals_of(&mut approver, &job_id, &[v1::ApprovalState::Pending]).await;
        for approval in pending {
            let id = approval.request.map(|r| r.approval_id).unwrap_or_default();
            let decided = approver
                .decide_approval(v1::DecideApprovalRequest {
                    approval_id: id,
                    verdict: v1::ApprovalVerdict::Approve as i32,
                    reason: "ok".into(),
                    decided_by: "somebody-else".into(),
                    ..Default::default()
                })
                .await;
            if let Ok(decided) = decided {
                let decision = decided.into_inner().approval.and_then(|a| a.decision);
                assert_eq!(decision.map(|d| d.decided_by).as_deref(), Some("approver"));
            }
        }
        if let Some(record) = finished_job(&mut admin, &job_id, deadline).await {
            break record;
        }
    };
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");
    assert!(
        !record.result_json.contains("987654") && !record.summary.contains("987654"),
        "the forgery became the result: {record:?}"
    );
    assert_eq!(record.tasks_done, record.tasks_total, "{record:?}");
    let log = stack.leader_log();
    assert!(
        log.matches("its token is not the one issued").count() >= 2,
        "the forgeries were not dropped and logged:\n{log}"
    );
    stack.stop();
}

/// The worker logs of the stack, all boards.
fn worker_logs(stack: &SecureUp) -> String {
    let logs = PathBuf::from(stack.ready["logs"].as_str().expect("logs"));
    ["worker-board0.log", "worker-board1.log"]
        .iter()
        .map(|name| std::fs::read_to_string(logs.join(name)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the workers' logs contain `needle` `times` times.
async fn wait_for_worker_log(stack: &SecureUp, needle: &str, times: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = worker_logs(stack);
        if log.matches(needle).count() >= times {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} was not logged {times} time(s):\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Any worker identity may write the approvals bucket (records move with
/// sessions), so a worker can store a decided record: unsigned or with a
/// forged signature it is dropped and logged with its approval id, the run
/// keeps waiting, and the genuine decision of the leader still decides it.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_written_into_the_approvals_bucket_by_a_worker_is_not_applied() {
    let stack = SecureUp::start();
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let job_id = submit_vecadd(&mut admin).await;

    // The first call that waits for a decision.
    let deadline = Instant::now() + Duration::from_secs(600);
    let target = loop {
        let pending = approvals_of(&mut approver, &job_id, &[v1::ApprovalState::Pending]).await;
        if let Some(request) = pending.into_iter().find_map(|a| a.request) {
            break request;
        }
        assert!(Instant::now() < deadline, "no approval was requested");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let approval_id = target.approval_id.clone();

    // The forger: a worker identity writing the record directly.
    let rogue = stack
        .nats(Some("worker-board1"))
        .await
        .expect("worker identity");
    let approvals = mtswarm_bus::Approvals::open(&rogue)
        .await
        .expect("a worker opens the approvals bucket");
    let forged_decision = v1::ApprovalDecision {
        approval_id: approval_id.clone(),
        job_id: target.job_id.clone(),
        session_id: target.session_id.clone(),
        call_id: target.call_id.clone(),
        verdict: v1::ApprovalVerdict::Approve as i32,
        reason: "looks fine".into(),
        decided_by: "mallory".into(),
        decided_at: Some(prost_types::Timestamp::from(std::time::SystemTime::now())),
        timed_out: false,
        signature: Vec::new(),
        ..Default::default()
    };
    let forge = |signature: Vec<u8>| v1::ApprovalRecord {
        request: Some(target.clone()),
        state: v1::ApprovalState::Approved as i32,
        decision: Some(v1::ApprovalDecision {
            signature,
            ..forged_decision.clone()
        }),
    };
    // Unsigned first, then signed by a key of the forger's own.
    approvals
        .kv()
        .put(&approval_id, &forge(Vec::new()))
        .await
        .expect("a worker identity writes the record");
    wait_for_worker_log(
        &stack,
        &format!("approval decision {approval_id} carries no signature"),
        1,
    )
    .await;
    let mut self_signed = forged_decision.clone();
    mtswarm_auth::DecisionSigner::generate()
        .sign(&mut self_signed)
        .expect("sign");
    approvals
        .kv()
        .put(&approval_id, &forge(self_signed.signature))
        .await
        .expect("a worker identity writes the record");
    wait_for_worker_log(
        &stack,
        &format!("approval decision {approval_id} is not signed by the leader key"),
        1,
    )
    .await;
    let log = worker_logs(&stack);
    assert!(
        log.contains("approval decision dropped: not signed by the leader"),
        "{log}"
    );

    // The run is still paused; the genuine decision decides over the
    // forgery, and every later call is approved too until the job ends.
    let record = loop {
        let pending = approvals_of(&mut approver, &job_id, &[]).await;
        for approval in pending {
            let id = approval
                .request
                .as_ref()
                .map(|r| r.approval_id.clone())
                .unwrap_or_default();
            let forged =
                approval.decision.as_ref().map(|d| d.decided_by.as_str()) == Some("mallory");
            if approval.state() != v1::ApprovalState::Pending && !forged {
                continue;
            }
            let decided = approver
                .decide_approval(v1::DecideApprovalRequest {
                    approval_id: id.clone(),
                    verdict: v1::ApprovalVerdict::Approve as i32,
                    reason: "ok".into(),
                    decided_by: String::new(),
                    ..Default::default()
                })
                .await;
            if id == approval_id {
                let decision = decided
                    .expect("the leader decides over the forged record")
                    .into_inner()
                    .approval
                    .and_then(|a| a.decision)
                    .expect("decision");
                assert_eq!(decision.decided_by, "approver");
                assert_eq!(decision.signature.len(), 64, "{decision:?}");
            }
        }
        if let Some(record) = finished_job(&mut admin, &job_id, deadline).await {
            break record;
        }
    };
    assert_eq!(record.state(), v1::JobState::Succeeded, "{record:?}");

    // What the session applied for that call: the approver's decision,
    // never the forger's.
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    let mut events = leader.replay_events(&job_id, 0).await.expect("replay");
    let mut applied = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), events.next()).await;
        let Ok(Some(Ok(event))) = next else {
            break;
        };
        let event = event.event;
        if event.kind() != v1::AgentEventKind::ApprovalDecided {
            continue;
        }
        let payload: serde_json::Value =
            serde_json::from_str(&event.payload_json).expect("payload");
        if payload["approval_id"] == approval_id.as_str() {
            applied.push(
                payload["decided_by"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
        }
    }
    assert_eq!(applied, vec!["approver".to_string()], "decisions applied");
    let log = stack.leader_log();
    assert!(
        log.contains("stored approval decision is not the leader's"),
        "{log}"
    );
    stack.stop();
}
