//! The stack the abuse tests attack: a real `mtswarm up` (nats-server,
//! leader and two worker daemons as processes, with the credentials it
//! generates), and the clients an attacker or a user would open on it:
//! gRPC with a token of one identity, NATS as one identity, the CLI.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mtswarm_auth::{ClientAuth, ClientConfig, ClientProfile};
use mtswarm_bus::{Bus, BusConfig, v1};
use mtswarm_tests::cli::spawn_up;
use mtswarm_tests::jobs::{get_job, submit};
use mtswarm_tests::stack::wait_for_fleet;
use mtswarm_tests::{NodeProcess, node_bin};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

pub(crate) const WAIT: Duration = Duration::from_secs(120);

pub(crate) type Pass = fn(Request<()>) -> Result<Request<()>, Status>;
pub(crate) type Control = v1::control_client::ControlClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;
pub(crate) type Worker = v1::worker_client::WorkerClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;

pub(crate) fn pass(request: Request<()>) -> Result<Request<()>, Status> {
    Ok(request)
}

/// Waits until the leader lists at least one slice: `up` is ready when its
/// daemons are, and the leader learns of the workers' registrations a
/// moment later. (Listed is not yet spawnable: a spawn can still find no
/// free slice for a moment after, see the tenancy test in clients.rs.)
pub(crate) async fn fleet_known(control: &mut Control) {
    wait_for_fleet(
        control,
        WAIT,
        |fleet| !fleet.slices.is_empty(),
        |_| "the leader lists no slice".into(),
    )
    .await;
}

/// Submits a one-agent vecadd job as `admin`'s identity once the leader
/// knows the fleet; its id.
pub(crate) async fn submit_vecadd(admin: &mut Control) -> String {
    fleet_known(admin).await;
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
pub(crate) async fn finished_job(
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
pub(crate) struct SecureUp {
    pub(crate) up: NodeProcess,
    pub(crate) ready: serde_json::Value,
    pub(crate) client: ClientProfile,
    pub(crate) client_config: PathBuf,
    pub(crate) credentials: PathBuf,
    _dir: tempfile::TempDir,
}

impl SecureUp {
    pub(crate) fn start() -> SecureUp {
        Self::start_with(None)
    }

    /// `mtswarm up` over the fleet `fleet_toml` instead of the built-in one.
    pub(crate) fn start_with_fleet(fleet_toml: &str) -> SecureUp {
        Self::start_with(Some(fleet_toml))
    }

    fn start_with(fleet_toml: Option<&str>) -> SecureUp {
        let dir = tempfile::tempdir().expect("temp dir");
        let client_config = dir.path().join("config.toml");
        let mut command = node(&client_config);
        if let Some(text) = fleet_toml {
            let fleet = dir.path().join("fleet.toml");
            std::fs::write(&fleet, text).expect("write the fleet");
            command.env("MTSWARM_FLEET", fleet);
        }
        let (up, ready) = spawn_up(command, dir.path(), WAIT);
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

    pub(crate) fn leader_url(&self) -> String {
        self.client.leader.clone().expect("leader url")
    }

    pub(crate) fn nats_url(&self) -> String {
        self.client.nats.clone().expect("nats url")
    }

    pub(crate) fn ca(&self) -> ClientAuth {
        ClientAuth::none()
            .with_ca_file(self.client.ca_file.as_deref().expect("ca"))
            .expect("ca file")
    }

    pub(crate) fn token(&self, identity: &str) -> ClientAuth {
        self.ca()
            .with_token_file(
                &self
                    .credentials
                    .join("tokens")
                    .join(format!("{identity}.token")),
            )
            .expect("token file")
    }

    pub(crate) async fn control(&self, auth: ClientAuth) -> Control {
        let channel = auth
            .endpoint(&self.leader_url(), WAIT)
            .expect("endpoint")
            .connect()
            .await
            .expect("TLS connection to the leader");
        v1::control_client::ControlClient::with_interceptor(channel, auth.interceptor(pass as Pass))
    }

    pub(crate) async fn worker(&self, auth: ClientAuth) -> Worker {
        let url = self.ready["workers"][0]["grpc"]
            .as_str()
            .expect("worker url")
            .to_string();
        let worker_id = self.ready["workers"][0]["worker_id"]
            .as_str()
            .expect("worker id")
            .to_string();
        // Its certificate names its identity, not the host.
        let channel = auth
            .worker_endpoint(&worker_id, &url, WAIT)
            .expect("endpoint")
            .connect()
            .await
            .expect("TLS connection to the worker");
        v1::worker_client::WorkerClient::with_interceptor(channel, auth.interceptor(pass as Pass))
    }

    /// A NATS connection as `identity` (`leader`, `client`, a worker id), or
    /// anonymous; TLS with the stack's CA either way.
    pub(crate) async fn nats(&self, identity: Option<&str>) -> Result<Bus, mtswarm_bus::BusError> {
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

    pub(crate) fn leader_log(&self) -> String {
        let logs = PathBuf::from(self.ready["logs"].as_str().expect("logs"));
        std::fs::read_to_string(logs.join("leader.log")).unwrap_or_default()
    }

    pub(crate) fn stop(mut self) {
        self.up.interrupt().expect("SIGINT");
        let status = self.up.wait_exit(WAIT).unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success(), "{status}; {}", self.up.stderr());
        assert!(
            !self.client_config.exists(),
            "the stack's client configuration outlived it"
        );
    }
}

pub(crate) fn node(client_config: &Path) -> Command {
    mtswarm_tests::cli::configured_node(&node_bin!(), client_config)
}

pub(crate) fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) -> Status {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), code, "{status:?}");
    status
}

/// Acceptance 2: anonymous gRPC calls are refused on the leader and the
/// workers, and the README commands work with nothing extra typed.
pub(crate) fn worker_logs(stack: &SecureUp) -> String {
    let logs = PathBuf::from(stack.ready["logs"].as_str().expect("logs"));
    ["worker-board0.log", "worker-board1.log"]
        .iter()
        .map(|name| std::fs::read_to_string(logs.join(name)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until the workers' logs contain `needle` `times` times.
pub(crate) async fn wait_for_worker_log(stack: &SecureUp, needle: &str, times: usize) {
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

/// Approves the first pending approval of `job_id` that verifies (waiting
/// for one), as the `approver` identity.
pub(crate) async fn approve_pending(stack: &SecureUp, job_id: &str) {
    let mut approver = stack.control(stack.token("approver")).await;
    let record = next_pending(&mut approver, job_id, &[]).await;
    let approval_id = record.request.map(|r| r.approval_id).unwrap_or_default();
    approver
        .decide_approval(v1::DecideApprovalRequest {
            approval_id,
            verdict: v1::ApprovalVerdict::Approve as i32,
            reason: "ok".into(),
            ..Default::default()
        })
        .await
        .expect("approved");
}

/// Approves every pending approval of `job_id` whose record verifies, as
/// the `approver` identity, until the job ends; the job's record.
pub(crate) async fn approve_until_finished(stack: &SecureUp, job_id: &str) -> v1::JobRecord {
    let mut admin = stack.control(stack.token("admin")).await;
    let mut approver = stack.control(stack.token("approver")).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let pending =
            mtswarm_tests::jobs::approvals(&mut approver, job_id, &[v1::ApprovalState::Pending])
                .await;
        for approval in pending {
            if !approval.verification_error.is_empty() {
                continue;
            }
            let Some(request) = approval.request else {
                continue;
            };
            let _ = approver
                .decide_approval(v1::DecideApprovalRequest {
                    approval_id: request.approval_id,
                    verdict: v1::ApprovalVerdict::Approve as i32,
                    reason: "ok".into(),
                    ..Default::default()
                })
                .await;
        }
        if let Some(record) = finished_job(&mut admin, job_id, deadline).await {
            return record;
        }
    }
}

/// The first pending approval of `job_id` that verifies and is not one of
/// `seen`; waits for it.
pub(crate) async fn next_pending(
    control: &mut Control,
    job_id: &str,
    seen: &[String],
) -> v1::ApprovalRecord {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let pending =
            mtswarm_tests::jobs::approvals(control, job_id, &[v1::ApprovalState::Pending]).await;
        if let Some(record) = pending.into_iter().find(|a| {
            a.verification_error.is_empty()
                && a.request
                    .as_ref()
                    .is_some_and(|r| !seen.contains(&r.approval_id))
        }) {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "no new pending approval of {job_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The approval record `approval_id` as ListApprovals shows it to `control`.
pub(crate) async fn listed_approval(
    control: &mut Control,
    job_id: &str,
    approval_id: &str,
) -> Option<v1::ApprovalRecord> {
    mtswarm_tests::jobs::approvals(control, job_id, &[])
        .await
        .into_iter()
        .find(|a| {
            a.request
                .as_ref()
                .is_some_and(|r| r.approval_id == approval_id)
        })
}

/// A job's agent events of kind `approval_decided` naming `approval_id`,
/// as (decided_by, verdict) from the events stream (read as the leader).
pub(crate) async fn decisions_applied(
    stack: &SecureUp,
    job_id: &str,
    approval_id: &str,
) -> Vec<(String, String)> {
    use futures::StreamExt as _;
    let leader = stack.nats(Some("leader")).await.expect("leader identity");
    let mut events = leader.replay_events(job_id, 0).await.expect("replay");
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
        if payload["approval_id"] == approval_id {
            applied.push((
                payload["decided_by"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                payload["verdict"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    applied
}

/// The first checkpoint of `job_id` in the checkpoints bucket, as `bus`
/// (a worker identity may read the bucket) sees it; waits for it.
pub(crate) async fn job_checkpoint(bus: &Bus, job_id: &str) -> v1::SessionCheckpoint {
    let checkpoints = mtswarm_bus::Checkpoints::open(bus)
        .await
        .expect("a worker identity opens the checkpoints bucket");
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = checkpoints.kv().list().await.expect("checkpoints listed");
        if let Some((_, stored)) = listed.into_iter().find(|(_, c)| c.value.job_id == job_id) {
            return stored.value;
        }
        assert!(Instant::now() < deadline, "no checkpoint of {job_id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the leader's log contains `needle` `times` times.
pub(crate) async fn wait_for_leader_log(stack: &SecureUp, needle: &str, times: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let log = stack.leader_log();
        if log.matches(needle).count() >= times {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} was not logged {times} time(s) by the leader:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A TCP port that records the first bytes of every connection made to it
/// (what a client sent before anything answered): where a test points a
/// client or the leader to see whether a credential would have left.
pub(crate) struct Trap {
    pub(crate) addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Trap {
    pub(crate) async fn start() -> Trap {
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>> = Default::default();
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64];
                    let read =
                        tokio::time::timeout(Duration::from_secs(2), socket.read(&mut buffer))
                            .await;
                    let n = match read {
                        Ok(Ok(n)) => n,
                        _ => 0,
                    };
                    buffer.truncate(n);
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
                });
            }
        });
        Trap { addr, seen, task }
    }

    /// The first bytes of each connection so far.
    pub(crate) fn connections(&self) -> Vec<Vec<u8>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (bounded) until `count` connections were recorded.
    pub(crate) async fn wait_for(&self, count: usize) -> Vec<Vec<u8>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen = self.connections();
            if seen.len() >= count && seen.iter().all(|c| !c.is_empty()) {
                return seen;
            }
            assert!(Instant::now() < deadline, "connections seen: {seen:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.task.abort();
    }
}
