//! Starting and stopping the daemon: [`WorkerDaemon::start`] opens the
//! board's slices (a `Board` and a lease each), connects to NATS, builds the
//! host state ([`crate::host`]), runs the workspace janitor's first pass,
//! registers the worker record, starts the heartbeat, the quarantine tasks
//! and the janitor and serves the `Worker` gRPC service (with health and
//! reflection, [`mtswarm_auth::serve`]); it returns once the daemon is
//! registered and serving. Each of those is one step below, in that order. [`WorkerHandle::shutdown`] stops it gracefully,
//! [`WorkerHandle::kill`] the way a crash would.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_auth::{Role, ServeOptions, Serving};
use mtswarm_bus::{Bus, BusConfig, v1};
use mtswarm_hw::emulator::EmulatorBoard;
use mtswarm_hw::sdk::SdkConfig;
use mtswarm_hw::{BackendKind, Board, ChipSpec, Fleet, HwLock, Slice};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::{WorkerConfig, sanitize_id};
use crate::disk::{DiskState, DiskUsage, JanitorReport};
use crate::error::WorkerError;
use crate::events::now_timestamp;
use crate::health::{FailingSlice, MonitoredBoard, SliceHealth, SliceMonitor};
use crate::heartbeat::Beat;
use crate::host::SessionHost;
use crate::identity::WorkerIdentity;
use crate::janitor::Janitor;
use crate::leases::SliceLeases;
use crate::quarantine::Quarantining;
use crate::slices::{SliceEntry, Slices};
use crate::stop::StopMode;
use crate::stores::WorkerStores;

/// The bus form of a slice id (`board0/c1` -> `board0-c1`): slice ids are
/// subject tokens and KV keys, which allow only `[A-Za-z0-9_-]`.
pub fn bus_slice_id(slice: &Slice) -> String {
    sanitize_id(&slice.id())
}

/// The worker daemon's entry point.
pub struct WorkerDaemon;

/// A running daemon.
pub struct WorkerHandle {
    host: Arc<SessionHost>,
    grpc_addr: SocketAddr,
    health: tonic_health::server::HealthReporter,
    server_stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    heartbeat_stop: Option<watch::Sender<bool>>,
    heartbeat: Option<JoinHandle<()>>,
    /// The quarantine monitor and watch, and the workspace janitor.
    background: Vec<JoinHandle<()>>,
    _observers: mtswarm_telemetry::metrics::observe::WorkerObservers,
}

/// Observes the daemon's sessions and its slices' lock accounting (the
/// `mtswarm.worker.sessions` and `mtswarm.slice.lock.*` metrics), every
/// slice from the start. Weak: the meter must not keep the daemon's state
/// alive.
fn observe_worker(host: &Arc<SessionHost>) -> mtswarm_telemetry::metrics::observe::WorkerObservers {
    use mtswarm_telemetry::metrics::observe::{SliceLockReading, observe_worker};
    let sessions = Arc::downgrade(host);
    let locks = Arc::downgrade(host);
    observe_worker(
        &host.identity.worker_id,
        move || {
            let count = sessions.upgrade()?.slices.table().sessions.len();
            Some(u64::try_from(count).unwrap_or(u64::MAX))
        },
        move || {
            let host = locks.upgrade()?;
            let readings = host
                .slices
                .iter()
                .map(|entry| {
                    // Tools lock a slice by its hardware id.
                    let stats = host
                        .hw_lock
                        .stats(&entry.slice.id())
                        .or_else(|| host.hw_lock.stats(&entry.bus_id));
                    SliceLockReading {
                        slice: entry.bus_id.clone(),
                        busy_seconds: stats.as_ref().map_or(0.0, |s| s.busy.as_secs_f64()),
                        wait_seconds: stats.as_ref().map_or(0.0, |s| s.total_wait.as_secs_f64()),
                        acquisitions: stats.map_or(0, |s| s.acquisitions),
                    }
                })
                .collect();
            Some(readings)
        },
    )
}

fn open_board(
    fleet: &Fleet,
    slice: &Slice,
    spec: &ChipSpec,
    cache_dir: Option<&PathBuf>,
) -> Result<Arc<dyn Board>, WorkerError> {
    if slice.backend == BackendKind::Emulator {
        let mut board = EmulatorBoard::new(slice.clone(), spec.clone())?;
        if let Some(dir) = cache_dir {
            board = board.with_cache_dir(dir.clone());
        }
        if let Some(faults) = fleet.board_of(slice).and_then(|b| b.faults_of(slice)) {
            tracing::warn!(slice.id = %slice.id(), ?faults, "fault injection is configured for this slice");
            board = board.with_faults(faults);
        }
        return Ok(Arc::new(board));
    }
    Ok(fleet.open(slice, &SdkConfig::default())?)
}

fn api_key_from_env(name: &str) -> Option<String> {
    [name, "OPENAI_API_KEY"]
        .iter()
        .filter_map(|n| std::env::var(n).ok())
        .map(|v| v.trim().to_owned())
        .find(|v| !v.is_empty())
}

impl WorkerDaemon {
    /// Start a daemon: load the board, connect to NATS, take the slice
    /// leases, register, and serve gRPC. Returns once serving.
    pub async fn start(config: WorkerConfig) -> Result<WorkerHandle, WorkerError> {
        config.validate()?;
        let worker_id = config.effective_worker_id();
        let (failing_tx, failing_rx) = tokio::sync::mpsc::unbounded_channel::<FailingSlice>();
        let slices = Arc::new(Slices::new(open_slices(&config, &worker_id, &failing_tx)?));
        let (bus, nkey_seed) = connect_bus(&config, &worker_id).await?;
        // The key this daemon signs its records with (registered with the
        // worker record).
        let record_key = crate::provenance::record_key(nkey_seed.as_deref());
        let (stores, leases) = WorkerStores::open(bus, &config, &record_key).await?;
        let (listener, grpc_addr) = bind(config.listen).await?;
        let identity = WorkerIdentity {
            endpoint: advertised_endpoint(&config, grpc_addr),
            worker_id,
            record_key,
            started_at: now_timestamp(),
        };
        let host = session_host(config, identity, stores, leases, slices)?;
        mtswarm_telemetry::metrics::metrics().init_worker_series(
            &host.identity.worker_id,
            host.slices.iter().map(|slice| slice.bus_id.as_str()),
        );
        let observers = observe_worker(&host);
        // Leftovers of a previous process past the retention go before the
        // first spawn, which is checked against the quota measured here.
        crate::janitor::run_pass(&janitor(&host)).await;
        let heartbeat = register(&host).await?;
        let background = start_loops(&host, &heartbeat, failing_rx).await?;
        let (server_stop, server_stop_rx) = oneshot::channel::<()>();
        let serving = serve_worker(&host, listener, server_stop_rx).await?;
        tracing::info!(worker.id = %host.identity.worker_id, board = %host.config.board, slices = host.slices.len(), "listening on {grpc_addr}");
        write_ready_file(&host, grpc_addr)?;
        Ok(WorkerHandle {
            host,
            grpc_addr,
            health: serving.health,
            server_stop: Some(server_stop),
            server: Some(serving.task),
            heartbeat_stop: Some(heartbeat.stop),
            heartbeat: Some(heartbeat.task),
            background,
            _observers: observers,
        })
    }
}

/// The configured board of the fleet file, each of its slices opened: a
/// `Board` (monitored for failures, reported on `failing`) and its health.
fn open_slices(
    config: &WorkerConfig,
    worker_id: &str,
    failing: &tokio::sync::mpsc::UnboundedSender<FailingSlice>,
) -> Result<Vec<SliceEntry>, WorkerError> {
    let fleet = Fleet::load(&config.fleet_file)?;
    let board = fleet
        .board(&config.board)
        .ok_or_else(|| WorkerError::UnknownBoard {
            board: config.board.clone(),
            known: fleet
                .boards
                .iter()
                .map(|b| b.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?
        .clone();
    let mut slices = Vec::with_capacity(board.slices.len());
    for (slice_index, slice) in board.slices.iter().enumerate() {
        let bus_id = bus_slice_id(slice);
        mtswarm_bus::subjects::validate_id("slice id", &bus_id).map_err(|e| {
            WorkerError::Config {
                field: "board",
                reason: e.to_string(),
            }
        })?;
        let health = Arc::new(SliceHealth::default());
        let hardware = open_board(
            &fleet,
            slice,
            &board.spec,
            config.emulator_cache_dir.as_ref(),
        )?;
        slices.push(SliceEntry {
            board: Arc::new(MonitoredBoard::new(
                hardware,
                SliceMonitor {
                    slice_index,
                    bus_id: bus_id.clone(),
                    worker_id: worker_id.to_owned(),
                    health: health.clone(),
                    quarantine_after: config.quarantine_after,
                    reports: failing.clone(),
                    reference_dir: config
                        .workspace_root
                        .join(".reference")
                        .join(bus_id.replace(['/', '.'], "-")),
                },
            )),
            slice: slice.clone(),
            bus_id,
            spec: board.spec.clone(),
            health,
        });
    }
    Ok(slices)
}

/// Connects to NATS as `worker_id`, with its nkey when one is configured
/// (a confined identity: its own inbox prefix), and ensures the topology,
/// or adopts it when confined (such an identity may not create streams:
/// the leader has). Returns the nkey seed too: the record key derives from
/// it.
async fn connect_bus(
    config: &WorkerConfig,
    worker_id: &str,
) -> Result<(Bus, Option<String>), WorkerError> {
    let mut bus_config = BusConfig::new(config.nats_urls[0].clone()).with_name(worker_id);
    bus_config.servers = config.nats_urls.clone();
    bus_config.credentials_file = config.nats_credentials.clone();
    bus_config.tls = config.nats_tls.clone();
    let mut nkey_seed = None;
    if let Some(path) = &config.nats_nkey_file {
        let seed = mtswarm_auth::generate::read_seed(path).map_err(|e| WorkerError::Config {
            field: "nats_nkey_file",
            reason: e.to_string(),
        })?;
        nkey_seed = Some(seed.clone());
        bus_config.nkey_seed = Some(seed);
        bus_config.inbox_prefix = Some(mtswarm_bus::permissions::worker_inbox_prefix(worker_id));
    }
    let bus = Bus::connect(bus_config).await?;
    bus.wait_connected(Duration::from_secs(30)).await?;
    if config.nats_nkey_file.is_none() {
        bus.ensure_topology(&config.topology).await?;
    } else {
        bus.adopt_topology(&config.topology);
    }
    Ok((bus, nkey_seed))
}

/// Binds the gRPC listener; the address it got (the actual port when the
/// configuration asked for port 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), WorkerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| WorkerError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| WorkerError::Bind { addr, source })?;
    Ok((listener, bound))
}

/// `<scheme>://<addr>` for clients on this host: loopback when bound to
/// every interface.
fn local_url(scheme: &str, grpc_addr: SocketAddr) -> String {
    if grpc_addr.ip().is_unspecified() {
        format!("{scheme}://127.0.0.1:{}", grpc_addr.port())
    } else {
        format!("{scheme}://{grpc_addr}")
    }
}

/// The endpoint the worker record names: the configured one, else the
/// bound address.
fn advertised_endpoint(config: &WorkerConfig, grpc_addr: SocketAddr) -> String {
    match &config.advertise_endpoint {
        Some(endpoint) => endpoint.clone(),
        None => local_url(config.security.scheme(), grpc_addr),
    }
}

/// The model API key: from its file when one is configured, else from the
/// configured environment variable (or `OPENAI_API_KEY`).
fn read_api_key(config: &WorkerConfig) -> Result<Option<String>, WorkerError> {
    let Some(path) = &config.llm_api_key_file else {
        return Ok(api_key_from_env(&config.llm_api_key_env));
    };
    let key = std::fs::read_to_string(path).map_err(|e| WorkerError::Config {
        field: "llm_api_key_file",
        reason: format!("{}: {e}", path.display()),
    })?;
    Ok(Some(key.trim().to_string()).filter(|k| !k.is_empty()))
}

/// The handles the session-running parts share ([`crate::host`]).
fn session_host(
    config: WorkerConfig,
    identity: WorkerIdentity,
    stores: WorkerStores,
    leases: mtswarm_bus::Leases,
    slices: Arc<Slices>,
) -> Result<Arc<SessionHost>, WorkerError> {
    let disk = Arc::new(DiskState::new(&config));
    let api_key = read_api_key(&config)?;
    let leases = Arc::new(SliceLeases::new(
        leases,
        slices.clone(),
        identity.worker_id.clone(),
        config.lease_ttl,
    ));
    Ok(Arc::new(SessionHost {
        disk,
        api_key,
        config,
        identity: Arc::new(identity),
        stores,
        slices,
        leases,
        hw_lock: HwLock::new(),
    }))
}

/// The worker record's heartbeat: its task and its stop signal (which
/// stops the task dispatch too).
struct Heartbeat {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Takes the slice leases, registers the worker record and starts its
/// heartbeat. A restarted daemon reclaims its own leases; another holder
/// means two daemons were started for one board. The leases are released
/// again when the record cannot be registered.
async fn register(host: &Arc<SessionHost>) -> Result<Heartbeat, WorkerError> {
    host.leases.take_leases().await?;
    let registered = match host
        .stores
        .workers
        .register(&host.identity.record(&host.slices), host.config.worker_ttl)
        .await
    {
        Ok(held) => held,
        Err(error) => {
            host.leases.release_leases().await;
            return Err(error.into());
        }
    };
    let (stop, heartbeat_rx) = watch::channel(false);
    let beat = Beat {
        identity: host.identity.clone(),
        slices: host.slices.clone(),
        workers: host.stores.workers.clone(),
        leases: host.leases.clone(),
        ttl: host.config.worker_ttl,
    };
    let task = tokio::spawn(crate::heartbeat::heartbeat_loop(
        beat,
        registered,
        heartbeat_rx,
    ));
    Ok(Heartbeat { stop, task })
}

/// Opens the task consumer and starts the background loops: the task
/// dispatch (until the heartbeat stops), the quarantine monitor and watch,
/// and the workspace janitor. Without a consumer the heartbeat stops and
/// the leases are released.
async fn start_loops(
    host: &Arc<SessionHost>,
    heartbeat: &Heartbeat,
    failing: tokio::sync::mpsc::UnboundedReceiver<FailingSlice>,
) -> Result<Vec<JoinHandle<()>>, WorkerError> {
    let consumer = match crate::dispatch::open(host).await {
        Ok(consumer) => consumer,
        Err(error) => {
            heartbeat.task.abort();
            host.leases.release_leases().await;
            return Err(error.into());
        }
    };
    let quarantining = Arc::new(Quarantining {
        slices: host.slices.clone(),
        quarantine: host.stores.quarantine.clone(),
        worker_id: host.identity.worker_id.clone(),
        quarantine_after: host.config.quarantine_after,
    });
    Ok(vec![
        tokio::spawn(crate::dispatch::run(
            host.clone(),
            consumer,
            heartbeat.stop.subscribe(),
        )),
        tokio::spawn(crate::quarantine::monitor(quarantining.clone(), failing)),
        tokio::spawn(crate::quarantine::watch(quarantining)),
        tokio::spawn(crate::janitor::run(janitor(host))),
    ])
}

/// Serves `Worker` with health and reflection until `stop`
/// ([`mtswarm_auth::serve`]): only the leader's identity may spawn, cancel,
/// drain or inspect sessions (or use reflection); health checks (probes)
/// stay open. Each request runs in a span whose parent is the caller's.
async fn serve_worker(
    host: &Arc<SessionHost>,
    listener: TcpListener,
    stop: oneshot::Receiver<()>,
) -> Result<Serving, WorkerError> {
    if host.config.leader_key.is_none() {
        tracing::warn!(
            "no leader public key configured: approval decisions are applied without verifying the leader's signature"
        );
    }
    let service =
        v1::worker_server::WorkerServer::new(crate::service::WorkerService::new(host.clone()));
    let options = ServeOptions {
        required_role: Some(Role::Leader),
        request_span: Some(mtswarm_telemetry::grpc::server_span),
    };
    mtswarm_auth::serve(listener, &host.config.security, service, options, async {
        let _ = stop.await;
    })
    .await
    .map_err(|e| WorkerError::Serve(e.to_string()))
}

/// What the workspace janitor works with.
fn janitor(host: &SessionHost) -> Arc<Janitor> {
    Arc::new(Janitor {
        disk: host.disk.clone(),
        slices: host.slices.clone(),
    })
}

/// Writes the ready file, when one is configured: the local gRPC URL, the
/// advertised endpoint, the worker id and the metrics URL, as JSON; renamed
/// into place, so a reader never sees half of it.
fn write_ready_file(host: &SessionHost, grpc_addr: SocketAddr) -> Result<(), WorkerError> {
    let Some(path) = &host.config.ready_file else {
        return Ok(());
    };
    let mut body = serde_json::json!({
        "grpc": local_url(host.config.security.scheme(), grpc_addr),
        "endpoint": host.identity.endpoint,
        "worker_id": host.identity.worker_id,
    });
    if let Some(url) = &host.config.metrics_url {
        body["metrics"] = serde_json::Value::String(url.clone());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body.to_string())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| WorkerError::ReadyFile {
            path: path.clone(),
            source,
        })
}

impl WorkerHandle {
    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The endpoint in the WorkerRecord (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.host.identity.endpoint
    }

    /// The worker id in use: configured, or `worker-<board>`.
    pub fn worker_id(&self) -> &str {
        &self.host.identity.worker_id
    }

    /// The bus ids of the daemon's slices (`board0-c1`, ...), in fleet order.
    pub fn slice_ids(&self) -> Vec<String> {
        self.host.slices.iter().map(|s| s.bus_id.clone()).collect()
    }

    /// The workspace root's usage at the last janitor pass, and its quota.
    pub fn disk_usage(&self) -> DiskUsage {
        self.host.disk.usage()
    }

    /// The janitor's latest pass report; it changes after every pass (the
    /// first pass ran before [`WorkerDaemon::start`] returned).
    pub fn janitor_reports(&self) -> watch::Receiver<JanitorReport> {
        self.host.disk.subscribe()
    }

    /// Sessions currently known to the daemon.
    pub fn session_count(&self) -> usize {
        self.host.slices.table().sessions.len()
    }

    /// Graceful stop: refuse new sessions, stop the running ones (their last
    /// checkpoint stays; unfinished tasks are not acknowledged, so they are
    /// delivered again), deregister, release the leases, stop serving.
    pub async fn shutdown(mut self) -> Result<(), WorkerError> {
        self.host.slices.start_draining();
        self.health
            .set_not_serving::<v1::worker_server::WorkerServer<crate::service::WorkerService>>()
            .await;
        self.host.slices.stop_sessions(StopMode::Abandon);
        let joins: Vec<JoinHandle<()>> = {
            let sessions = self.host.slices.sessions();
            sessions.iter().filter_map(|s| s.take_join()).collect()
        };
        let timeout = self.host.config.shutdown_timeout;
        for join in joins {
            let abort = join.abort_handle();
            if tokio::time::timeout(timeout, join).await.is_err() {
                tracing::warn!("a session did not stop within {timeout:?}; aborted");
                abort.abort();
            }
        }
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(stop) = self.heartbeat_stop.take() {
            let _ = stop.send(true);
        }
        if let Some(heartbeat) = self.heartbeat.take() {
            let _ = heartbeat.await;
        }
        if let Err(error) = self
            .host
            .stores
            .workers
            .deregister(&self.host.identity.worker_id)
            .await
        {
            tracing::warn!(%error, "worker record not removed");
        }
        self.host.leases.release_leases().await;
        if let Some(stop) = self.server_stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            match tokio::time::timeout(timeout, server).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => return Err(WorkerError::Serve(error.to_string())),
                Ok(Err(join)) => return Err(WorkerError::Serve(join.to_string())),
                Err(_) => {
                    return Err(WorkerError::Serve(
                        "the gRPC server did not stop in time".into(),
                    ));
                }
            }
        }
        if let Err(error) = self.host.stores.bus.flush().await {
            tracing::debug!(%error, "final flush failed");
        }
        tracing::info!(worker.id = %self.host.identity.worker_id, "worker stopped");
        Ok(())
    }

    /// Stop at once the way a crash would look to the rest of the system:
    /// sessions aborted, leases and the worker record left to lapse.
    pub async fn kill(mut self) {
        for session in self.host.slices.table().sessions.values() {
            session.abort();
        }
        self.host.leases.abandon_leases().await;
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(stop) = self.server_stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
        for task in self.background.drain(..) {
            task.abort();
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
        for session in self.host.slices.table().sessions.values() {
            session.abort();
        }
    }
}
