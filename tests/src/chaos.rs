//! A fleet to break on purpose: a real nats-server with a file store (stop it,
//! start it again on the same port), the leader and one worker daemon per
//! board as separate `mtswarm-node` processes (SIGKILL, SIGSTOP and SIGCONT
//! them, start a new leader or a standby next to the running one), and an [`Observer`] that records, with the
//! instant it saw them, every task assignment, task result, agent event and
//! checkpoint on the bus, so a scenario waits on what happened instead of
//! sleeping and measures how long recovery took.
//!
//! The observer listens with core NATS subscriptions on the stream subjects
//! and on the checkpoint heads' KV subjects: it sees every publish,
//! including ones JetStream then drops as duplicates, which is what
//! "published twice" and "results seen vs. accepted" count, and it sees a
//! session's checkpoint before the result the session published after it.
//! A watch of the checkpoint bucket adds what a restarted server replays.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use mtswarm_bus::local_server::NatsServer;
use mtswarm_bus::{Bus, BusConfig, Checkpoints, KvChange, codec, subjects, v1};
use mtswarm_cli::{LeaderProcessArgs, StreamBytes, WorkerProcessArgs};
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_telemetry::grpc::TraceContextInterceptor;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::process::{NodeProcess, ReadyInfo};
use crate::stack::{Control, READY_TIMEOUT, start_nats_with_fleet};

/// What to start.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// The `mtswarm-node` binary (`node_bin!()`).
    pub node_bin: PathBuf,
    /// fleet.toml text; one worker process per board (empty: no workers).
    pub fleet_toml: String,
    /// Slice lease TTL of every worker, whole seconds.
    pub lease_ttl_seconds: u64,
    /// Extra arguments of the leader (every start of it).
    pub leader_args: Vec<String>,
    /// Extra environment of the leader.
    pub leader_env: Vec<(String, String)>,
    /// Extra arguments of every worker.
    pub worker_args: Vec<String>,
    /// Extra environment of every worker.
    pub worker_env: Vec<(String, String)>,
    /// NATS servers to run on instead of the stack's own (e.g. every node
    /// of a `LocalCluster`): the leader, the workers and the observer
    /// connect to all of them; the stack's own server then stays idle.
    pub nats_urls: Vec<String>,
}

impl ChaosOptions {
    /// Options for `fleet_toml` run by `node_bin`: 2 s leases, no extra
    /// arguments or environment.
    pub fn new(node_bin: PathBuf, fleet_toml: String) -> Self {
        Self {
            node_bin,
            fleet_toml,
            lease_ttl_seconds: 2,
            leader_args: Vec::new(),
            leader_env: Vec::new(),
            worker_args: Vec::new(),
            worker_env: Vec::new(),
            nats_urls: Vec::new(),
        }
    }
}

/// One worker daemon of the fleet.
#[derive(Debug)]
pub struct FleetWorker {
    /// Board id of the fleet.toml this daemon serves.
    pub board: String,
    /// The `mtswarm-node worker` process (kill, stop, read its logs).
    pub process: NodeProcess,
    /// What it wrote to its ready file: gRPC URL and worker id.
    pub ready: ReadyInfo,
}

/// The running fleet. Dropping it kills every process and the server.
pub struct ChaosStack {
    /// The nats-server (file store; stop and restart it on the same port).
    pub nats: NatsServer,
    /// What the stack was started with; leader restarts reuse it.
    pub options: ChaosOptions,
    /// gRPC URL of the current leader (changes when a new leader starts).
    pub leader_url: String,
    /// The running workers in fleet order; killed ones are moved out.
    pub workers: Vec<FleetWorker>,
    /// Records what flows over the bus since the stack started.
    pub observer: Observer,
    /// The fleet.toml written for the workers (in the stack's directory).
    pub fleet_path: PathBuf,
    leader: Option<NodeProcess>,
    /// Further leaders on the same NATS, oldest first, with their gRPC URLs
    /// (see [`ChaosStack::start_standby_leader`]).
    standbys: Vec<(NodeProcess, String)>,
    /// Leaders killed earlier, kept for their logs.
    dead_leaders: Vec<NodeProcess>,
    /// Workers killed earlier, kept for their logs.
    dead_workers: Vec<FleetWorker>,
    leader_starts: u32,
    dir: tempfile::TempDir,
    /// The leaders' approval decision key (every leader started signs with
    /// it) and its public key (every worker verifies with it).
    decision_key: mtswarm_auth::generate::DecisionKeyFiles,
}

impl ChaosStack {
    /// Starts nats-server, the leader and the workers (each bounded by
    /// [`READY_TIMEOUT`]) and connects the observer. Panics with the failing
    /// part's log: this is test setup.
    pub async fn start(options: ChaosOptions) -> ChaosStack {
        let (nats, dir, fleet_path) =
            start_nats_with_fleet("mtswarm-chaos-", &options.fleet_toml).await;
        let decision_key =
            mtswarm_auth::generate::decision_key_files(dir.path()).expect("decision key");
        let observer = Observer::connect(&nats_url(&nats, &options))
            .await
            .unwrap_or_else(|e| panic!("observer: {e}"));
        let mut stack = ChaosStack {
            nats,
            options,
            leader_url: String::new(),
            workers: Vec::new(),
            observer,
            fleet_path,
            leader: None,
            standbys: Vec::new(),
            dead_leaders: Vec::new(),
            dead_workers: Vec::new(),
            leader_starts: 0,
            dir,
            decision_key,
        };
        stack.start_leader();
        let boards: Vec<String> = if stack.options.fleet_toml.trim().is_empty() {
            Vec::new()
        } else {
            mtswarm_hw::fleet::Fleet::load(&stack.fleet_path)
                .expect("valid test fleet")
                .boards
                .into_iter()
                .map(|board| board.id)
                .collect()
        };
        let mut starting = Vec::new();
        for board in boards {
            let ready = stack.dir.path().join(format!("{board}.ready.json"));
            let process = NodeProcess::spawn(
                &format!("worker {board}"),
                stack.worker_command(&board, &ready),
            )
            .expect("spawn a worker process");
            starting.push((board, process, ready));
        }
        for (board, mut process, ready) in starting {
            let info = tokio::task::block_in_place(|| process.wait_ready(&ready, READY_TIMEOUT))
                .unwrap_or_else(|e| panic!("{e}"));
            stack.workers.push(FleetWorker {
                board,
                process,
                ready: info,
            });
        }
        stack
    }

    /// The `--nats` value of every process: the stack's server, or the
    /// comma list of [`ChaosOptions::nats_urls`].
    pub fn nats_url(&self) -> String {
        nats_url(&self.nats, &self.options)
    }

    /// A directory living as long as the stack.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts a leader process (the first, or a new one after
    /// [`ChaosStack::kill_leader`]) on a free port and waits until it serves.
    pub fn start_leader(&mut self) {
        assert!(self.leader.is_none(), "a leader is already running");
        let (process, url) = self.spawn_leader(&[]);
        self.leader_url = url;
        self.leader = Some(process);
    }

    /// Starts one more leader process on the same NATS next to the running
    /// one, with `extra_args` (e.g. `--leader-id`), and waits until it
    /// serves: a standby that takes over the jobs of a leader that dies.
    /// Its gRPC URL.
    pub fn start_standby_leader(&mut self, extra_args: &[&str]) -> String {
        let extra: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let (process, url) = self.spawn_leader(&extra);
        self.standbys.push((process, url.clone()));
        url
    }

    /// Makes the oldest standby the current leader, after
    /// [`ChaosStack::kill_leader`].
    pub fn promote_standby(&mut self) {
        assert!(self.leader.is_none(), "the current leader still runs");
        assert!(!self.standbys.is_empty(), "no standby leader to promote");
        let (process, url) = self.standbys.remove(0);
        self.leader_url = url;
        self.leader = Some(process);
    }

    fn spawn_leader(&mut self, extra_args: &[String]) -> (NodeProcess, String) {
        self.leader_starts += 1;
        let ready = self
            .dir
            .path()
            .join(format!("leader-{}.ready.json", self.leader_starts));
        let mut command = Command::new(&self.options.node_bin);
        command
            .args(
                LeaderProcessArgs {
                    nats_url: self.nats_url(),
                    listen: "127.0.0.1:0".into(),
                    kernel_root: crate::kernel_root(),
                    ready_file: ready.clone(),
                    stream_bytes: Some(StreamBytes::small()),
                }
                .to_args(),
            )
            .arg("--decision-key-file")
            .arg(&self.decision_key.seed_file)
            .args(&self.options.leader_args)
            .args(extra_args)
            .envs(self.options.leader_env.iter().map(|(k, v)| (k, v)));
        clean_environment(&mut command);
        let mut process = NodeProcess::spawn(&format!("leader #{}", self.leader_starts), command)
            .expect("spawn the leader process");
        let info = tokio::task::block_in_place(|| process.wait_ready(&ready, READY_TIMEOUT))
            .unwrap_or_else(|e| panic!("{e}"));
        (process, info.grpc)
    }

    /// SIGKILLs the leader and waits until it is gone.
    pub fn kill_leader(&mut self) {
        let mut leader = self.leader.take().expect("a running leader");
        leader.kill().expect("SIGKILL the leader");
        leader
            .wait_exit(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}"));
        self.dead_leaders.push(leader);
    }

    /// The running leader process.
    pub fn leader(&self) -> &NodeProcess {
        self.leader.as_ref().expect("a running leader")
    }

    fn worker_command(&self, board: &str, ready: &Path) -> Command {
        let mut command = Command::new(&self.options.node_bin);
        command
            .args(
                WorkerProcessArgs {
                    nats_url: self.nats_url(),
                    fleet: self.fleet_path.clone(),
                    board: board.to_string(),
                    kernel_root: crate::kernel_root(),
                    workspace_root: self.dir.path().join("workspaces").join(board),
                    ready_file: ready.to_path_buf(),
                    stream_bytes: Some(StreamBytes::small()),
                }
                .to_args(),
            )
            .arg("--lease-ttl")
            .arg(self.options.lease_ttl_seconds.to_string())
            .arg("--leader-public-key-file")
            .arg(&self.decision_key.public_file)
            .args(&self.options.worker_args)
            .envs(self.options.worker_env.iter().map(|(k, v)| (k, v)))
            .env("MTSWARM_CACHE_DIR", crate::emulator_cache_dir());
        clean_environment(&mut command);
        command
    }

    /// The worker daemon of `board`.
    pub fn worker(&self, board: &str) -> &FleetWorker {
        self.workers
            .iter()
            .find(|w| w.board == board)
            .unwrap_or_else(|| panic!("no running worker for {board}"))
    }

    /// The worker daemon serving `worker_id`.
    pub fn worker_by_id(&self, worker_id: &str) -> &FleetWorker {
        self.workers
            .iter()
            .find(|w| w.ready.worker_id.as_deref() == Some(worker_id))
            .unwrap_or_else(|| panic!("no running worker with id {worker_id}"))
    }

    /// SIGKILLs the worker with id `worker_id` (and its emulator runs) and
    /// waits until it is gone; returns the instant of the kill.
    pub fn kill_worker(&mut self, worker_id: &str) -> Instant {
        let index = self
            .workers
            .iter()
            .position(|w| w.ready.worker_id.as_deref() == Some(worker_id))
            .unwrap_or_else(|| panic!("no running worker with id {worker_id}"));
        let mut worker = self.workers.remove(index);
        let killed_at = Instant::now();
        worker.process.kill().expect("SIGKILL the worker");
        worker
            .process
            .wait_exit(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}"));
        self.dead_workers.push(worker);
        killed_at
    }

    /// A fresh Control client to the current leader.
    pub async fn control(&self) -> Control {
        connect_control(&self.leader_url).await
    }

    /// Waits until ListFleet shows at least `count` free slices.
    pub async fn wait_for_free_slices(
        &self,
        count: usize,
        timeout: Duration,
    ) -> v1::ListFleetResponse {
        crate::stack::wait_for_free_slices(&mut self.control().await, count, timeout, || {
            self.logs()
        })
        .await
    }

    /// Every leader's stderr (killed ones first).
    pub fn leader_logs(&self) -> String {
        self.dead_leaders
            .iter()
            .chain(self.leader.iter())
            .chain(self.standbys.iter().map(|(process, _)| process))
            .map(|l| format!("--- {} ---\n{}", l.name(), l.stderr()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every worker's stderr (killed ones too).
    pub fn worker_logs(&self) -> String {
        self.dead_workers
            .iter()
            .chain(self.workers.iter())
            .map(|w| format!("--- {} ---\n{}", w.process.name(), w.process.stderr()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The tail of every log, for assertion messages.
    pub fn logs(&self) -> String {
        format!(
            "{}\n{}",
            tail(&self.leader_logs(), 120),
            tail(&self.worker_logs(), 160)
        )
    }
}

fn nats_url(nats: &NatsServer, options: &ChaosOptions) -> String {
    if options.nats_urls.is_empty() {
        nats.url()
    } else {
        options.nats_urls.join(",")
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Leaves a test process only the environment it is given: no model,
/// leader or NATS settings of the shell that runs the tests.
pub(crate) fn clean_environment(command: &mut Command) {
    command
        .env("MTSWARM_LOG", "info")
        .env_remove("MTSWARM_LLM_URL")
        .env_remove("MTSWARM_LLM_MODEL")
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_NATS_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
}

/// A Control client with trace context injection to `url`.
pub async fn connect_control(url: &str) -> Control {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("leader url")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to the leader at {url}: {e}"));
    ControlClient::with_interceptor(channel, TraceContextInterceptor)
}

/// Something the observer saw on the bus.
#[derive(Debug, Clone)]
pub enum Seen {
    /// A publish on `mtswarm.task.<worker>.<slice>`.
    Task(v1::TaskAssignment),
    /// A publish on `mtswarm.result.<job>`.
    Result(v1::TaskResult),
    /// An agent event on `mtswarm.event.<job>.<agent>`.
    Event(v1::AgentEvent),
    /// A checkpoint written to the checkpoints bucket.
    Checkpoint(v1::SessionCheckpoint),
}

/// One observation and when it arrived.
#[derive(Debug, Clone)]
pub struct Observation {
    /// When the observer received it.
    pub at: Instant,
    /// What it was.
    pub seen: Seen,
}

struct ObserverInner {
    log: Mutex<Vec<Observation>>,
    changed: watch::Sender<u64>,
    bus: Bus,
}

impl ObserverInner {
    fn push(&self, seen: Seen) {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.push(Observation {
            at: Instant::now(),
            seen,
        });
        let count = log.len() as u64;
        drop(log);
        self.changed.send_replace(count);
    }
}

/// Records what flows over the bus (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Observer {
    inner: Arc<ObserverInner>,
}

impl Observer {
    /// Connects to NATS (`nats_url`: one URL or a comma list) and starts
    /// recording.
    pub async fn connect(nats_url: &str) -> Result<Observer, String> {
        let mut config = BusConfig::new(nats_url).with_name("chaos-observer");
        config.servers = nats_url.split(',').map(str::to_string).collect();
        let bus = Bus::connect(config)
            .await
            .map_err(|e| format!("connecting the observer: {e}"))?;
        let (changed, _) = watch::channel(0);
        let inner = Arc::new(ObserverInner {
            log: Mutex::new(Vec::new()),
            changed,
            bus: bus.clone(),
        });
        // Checkpoint heads (`$KV.<bucket>.<session>`; a head's history
        // records have more tokens) are seen on a plain subscription too,
        // beside the bucket watch below: the same path as the results,
        // so a checkpoint written before a task's result is seen before it
        // (a watch is a consumer of its own and may lag behind).
        let checkpoint_heads = format!("$KV.{}.*", subjects::CHECKPOINTS_BUCKET);
        for (filter, kind) in [
            (subjects::ALL_TASKS, 0u8),
            (subjects::ALL_RESULTS, 1),
            (subjects::ALL_EVENTS, 2),
            (checkpoint_heads.as_str(), 3),
        ] {
            let mut subscription = bus
                .client()
                .subscribe(filter.to_string())
                .await
                .map_err(|e| format!("subscribing to {filter}: {e}"))?;
            let weak = Arc::downgrade(&inner);
            tokio::spawn(async move {
                while let Some(message) = subscription.next().await {
                    let Some(inner) = weak.upgrade() else { return };
                    let subject = message.subject.as_str();
                    let headers = message.headers.as_ref();
                    // A batch of agent events is seen as its events, in order.
                    let seen = match kind {
                        0 => codec::decode(subject, headers, &message.payload)
                            .map(|task| vec![Seen::Task(task)]),
                        1 => codec::decode(subject, headers, &message.payload)
                            .map(|result| vec![Seen::Result(result)]),
                        // A delete or purge marker has no payload.
                        3 if message.payload.is_empty() => Ok(Vec::new()),
                        3 => codec::decode(subject, headers, &message.payload)
                            .map(|checkpoint| vec![Seen::Checkpoint(checkpoint)]),
                        _ => codec::decode_agent_events(subject, headers, &message.payload)
                            .map(|events| events.into_iter().map(Seen::Event).collect()),
                    };
                    match seen {
                        Ok(seen) => seen.into_iter().for_each(|seen| inner.push(seen)),
                        Err(error) => {
                            eprintln!("observer: undecodable message on {subject}: {error}")
                        }
                    }
                }
            });
        }
        bus.flush()
            .await
            .map_err(|e| format!("flushing the observer's subscriptions: {e}"))?;
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            // The bucket exists once the leader has created the topology; a
            // watch ends when the server goes away: watch again once it is back.
            loop {
                let Some(bus) = weak.upgrade().map(|inner| inner.bus.clone()) else {
                    return;
                };
                if let Ok(checkpoints) = Checkpoints::open(&bus).await
                    && let Ok(mut changes) = checkpoints.kv().watch().await
                {
                    while let Some(change) = changes.next().await {
                        let Some(inner) = weak.upgrade() else { return };
                        if let Ok(KvChange::Put { value, .. }) = change {
                            inner.push(Seen::Checkpoint(value.value));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ok(Observer { inner })
    }

    /// The observer's own connection (e.g. to read KV buckets).
    pub fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// Everything observed so far.
    pub fn snapshot(&self) -> Vec<Observation> {
        self.inner
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until `probe` finds what it looks for in the observations (it
    /// is called again after every new one), at most `timeout`.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut(&[Observation]) -> Option<T>,
    ) -> Result<T, String> {
        let mut changes = self.inner.changed.subscribe();
        let deadline = Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            {
                let log = self.inner.log.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(found) = probe(&log) {
                    return Ok(found);
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Err(_) => return Err(format!("{what}: not observed within {timeout:?}")),
                Ok(Err(_)) => return Err(format!("{what}: the observer stopped")),
                Ok(Ok(())) => {}
            }
        }
    }

    /// Task assignments published for `job_id`, in arrival order.
    pub fn tasks(&self, job_id: &str) -> Vec<(Instant, v1::TaskAssignment)> {
        tasks_of(&self.snapshot(), job_id)
    }

    /// Task results published for `job_id`, in arrival order.
    pub fn results(&self, job_id: &str) -> Vec<(Instant, v1::TaskResult)> {
        self.snapshot()
            .into_iter()
            .filter_map(|o| match o.seen {
                Seen::Result(r) if r.job_id == job_id => Some((o.at, r)),
                _ => None,
            })
            .collect()
    }

    /// Agent events of `job_id`, in arrival order.
    pub fn events(&self, job_id: &str) -> Vec<(Instant, v1::AgentEvent)> {
        self.snapshot()
            .into_iter()
            .filter_map(|o| match o.seen {
                Seen::Event(e) if e.job_id == job_id => Some((o.at, e)),
                _ => None,
            })
            .collect()
    }
}

/// Task assignments of `job_id` among `observations`.
pub fn tasks_of(observations: &[Observation], job_id: &str) -> Vec<(Instant, v1::TaskAssignment)> {
    observations
        .iter()
        .filter_map(|o| match &o.seen {
            Seen::Task(t) if t.job_id == job_id => Some((o.at, t.clone())),
            _ => None,
        })
        .collect()
}

/// The JSON payload of a LOG event with `"type": kind`, if `event` is one.
pub fn log_payload(event: &v1::AgentEvent, kind: &str) -> Option<serde_json::Value> {
    if event.kind() != v1::AgentEventKind::Log {
        return None;
    }
    let payload: serde_json::Value = serde_json::from_str(&event.payload_json).ok()?;
    (payload["type"] == kind).then_some(payload)
}
