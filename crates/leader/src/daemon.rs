//! Starting and stopping the leader: connect to NATS, ensure the topology
//! and the job journal, start the background loops (result consumer,
//! approval relay, the reassigner with its lease and quarantine watches), take over and resume the QUEUED or RUNNING jobs no live leader
//! owns, watch for the ones whose owner dies later (`runner/ownership.rs`),
//! and serve `Control` with health and reflection on the configured address
//! ([`mtswarm_auth::serve`]). Each of those is one step below, in that order.
//!
//! Every background loop re-creates its subscription, consumer or watch
//! with backoff when NATS goes away and comes back (the client itself
//! reconnects forever: `BusConfig` sets no reconnect limit); none of them
//! ends before shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_auth::{ServeError, ServeOptions, Serving};
use mtswarm_bus::{Bus, JobOwners, v1};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::LeaderConfig;
use crate::error::LeaderError;
use crate::host::JobHost;
use crate::job_manager::JobManager;
use crate::keys::LeaderKeys;
use crate::ownerships::Ownerships;
use crate::placement::Placement;
use crate::reassign::{LeaseClock, ReassignHandles};
use crate::result_consumer::{ResultIntake, consume_results};
use crate::results::LeaderCounters;
use crate::service::ControlService;
use crate::stores::Stores;
use crate::tables::JobTables;
use crate::trigger::{Trigger, Triggers};
use crate::worker_dial::WorkerDialer;

/// Longest leader id (it is part of the result consumer's durable name).
const MAX_LEADER_ID_LEN: usize = 64;

/// How long shutdown waits for open gRPC calls to finish.
const SERVER_STOP_WAIT: Duration = Duration::from_secs(10);

/// Entry point of the leader daemon; [`LeaderDaemon::start`] runs one.
pub struct LeaderDaemon;

/// A running leader: its gRPC server, job runners and background loops.
/// Stop it with [`LeaderHandle::shutdown`] (or [`LeaderHandle::abort`] in
/// restart tests).
pub struct LeaderHandle {
    grpc_addr: SocketAddr,
    /// `https` when the server has a TLS certificate.
    scheme: &'static str,
    host: Arc<JobHost>,
    health: tonic_health::server::HealthReporter,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<JoinHandle<()>>,
    _observers: mtswarm_telemetry::metrics::observe::LeaderObservers,
}

impl std::fmt::Debug for LeaderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderHandle")
            .field("grpc_addr", &self.grpc_addr)
            .finish_non_exhaustive()
    }
}

impl LeaderDaemon {
    /// Starts the leader; returns once the gRPC server accepts connections
    /// and health reports SERVING.
    pub async fn start(config: LeaderConfig) -> Result<LeaderHandle, LeaderError> {
        let kernel_root = check_config(&config)?;
        let bus = connect_bus(&config).await?;
        let (stores, owners) = Stores::open(bus, &config).await?;
        // Bound first: the ownership records name this leader's address.
        let (listener, grpc_addr) = bind(config.grpc_addr).await?;
        let scheme = config.security.scheme();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (reassign_tx, reassign_rx) = mpsc::unbounded_channel();
        let (standby_tx, standby_rx) = mpsc::unbounded_channel();
        let links = Links {
            shutdown: shutdown_rx.clone(),
            triggers: Triggers::new(reassign_tx),
            standby_tx,
            grpc_url: format!("{scheme}://{grpc_addr}"),
        };
        let host = job_host(config, kernel_root, stores, owners, links);
        tracing::info!(leader_id = %host.config.leader_id, "leader starting");
        mtswarm_telemetry::metrics::metrics().init_leader_series();
        let observers = observe_jobs(&host.tables);
        let mut background = start_loops(&host, reassign_rx, &shutdown_rx);
        background.extend(take_over_jobs(&host, standby_rx, &shutdown_rx).await?);
        let serving = serve_control(&host, listener, shutdown_rx).await?;
        tracing::info!("listening on {grpc_addr}");
        Ok(LeaderHandle {
            grpc_addr,
            scheme,
            host,
            health: serving.health,
            shutdown,
            server: serving.task,
            background,
            _observers: observers,
        })
    }
}

/// Checks what the configuration must hold before anything starts; the
/// canonical kernel root.
fn check_config(config: &LeaderConfig) -> Result<PathBuf, LeaderError> {
    let kernel_root = config.kernel_root.canonicalize().map_err(|e| {
        LeaderError::InvalidConfig(format!(
            "kernel root {} is not usable: {e}",
            config.kernel_root.display()
        ))
    })?;
    if !kernel_root.is_dir() {
        return Err(LeaderError::InvalidConfig(format!(
            "kernel root {} is not a directory",
            kernel_root.display()
        )));
    }
    if config.grpc_max_message_bytes < 64 * 1024 {
        return Err(LeaderError::InvalidConfig(
            "grpc_max_message_bytes must be at least 64 KiB".into(),
        ));
    }
    if let Err(error) = mtswarm_bus::subjects::validate_id("leader id", &config.leader_id) {
        return Err(LeaderError::InvalidConfig(format!("leader_id: {error}")));
    }
    if config.leader_id.len() > MAX_LEADER_ID_LEN {
        return Err(LeaderError::InvalidConfig(format!(
            "leader_id {} is longer than {MAX_LEADER_ID_LEN} characters",
            config.leader_id
        )));
    }
    if config.job_lease_ttl < Duration::from_secs(1) || config.job_lease_ttl.subsec_nanos() != 0 {
        return Err(LeaderError::InvalidConfig(format!(
            "job_lease_ttl {:?} must be whole seconds, at least 1 s",
            config.job_lease_ttl
        )));
    }
    if config.max_active_jobs == 0 {
        return Err(LeaderError::InvalidConfig(
            "max_active_jobs must be at least 1".into(),
        ));
    }
    Ok(kernel_root)
}

/// Connects to NATS and ensures the topology (the leader creates the
/// streams and buckets).
async fn connect_bus(config: &LeaderConfig) -> Result<Bus, LeaderError> {
    let bus = Bus::connect(config.bus.clone()).await?;
    bus.wait_connected(config.bus.connect_timeout.max(Duration::from_secs(5)))
        .await?;
    bus.ensure_topology(&config.topology).await?;
    Ok(bus)
}

/// Binds the gRPC listener; the address it got (the actual port when the
/// configuration asked for port 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), LeaderError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| LeaderError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| LeaderError::Bind { addr, source })?;
    Ok((listener, bound))
}

/// How the daemon's parts reach each other: the shutdown signal, the
/// reassigner's triggers, the standby loop's candidates, and the URL the
/// ownership records name.
struct Links {
    shutdown: watch::Receiver<bool>,
    triggers: Triggers,
    standby_tx: mpsc::UnboundedSender<String>,
    grpc_url: String,
}

/// The handles the job-hosting parts share ([`crate::host`]).
fn job_host(
    config: LeaderConfig,
    kernel_root: PathBuf,
    stores: Stores,
    owners: JobOwners,
    links: Links,
) -> Arc<JobHost> {
    let tables = Arc::new(JobTables::new(
        config.max_active_jobs,
        config.max_queued_jobs,
    ));
    let ownerships = Arc::new(Ownerships::new(
        owners,
        config.leader_id.clone(),
        links.grpc_url,
        config.job_lease_ttl,
        links.standby_tx,
    ));
    let placement = Arc::new(Placement::new(
        stores.workers.clone(),
        stores.leases.clone(),
        stores.quarantine.clone(),
        WorkerDialer::new(config.worker_auth.clone(), config.worker_call_timeout),
        config.worker_stale_after,
    ));
    let keys = LeaderKeys::new(config.result_key.clone(), config.decision_key.clone());
    let intake = Arc::new(ResultIntake {
        stores: stores.clone(),
        tables: tables.clone(),
        ownerships: ownerships.clone(),
        keys: keys.clone(),
        triggers: links.triggers,
    });
    Arc::new(JobHost {
        model_factory: config.effective_model_factory(),
        kernel_root,
        stores,
        tables,
        ownerships,
        placement,
        keys,
        intake,
        shutdown: links.shutdown,
        config,
    })
}

/// Starts the background loops: the result consumer, the approval relay
/// (journaling the jobs this leader owns; agent events reach the journal
/// without the leader, `journal`), and the reassigner with its lease and
/// quarantine watches.
fn start_loops(
    host: &JobHost,
    reassign_rx: mpsc::UnboundedReceiver<Trigger>,
    shutdown: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let stores = &host.stores;
    let mut background = vec![
        tokio::spawn(consume_results(
            host.intake.clone(),
            host.config.result_consumer(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::approvals::relay_requests(
            stores.bus.clone(),
            stores.approvals.clone(),
            stores.journal.clone(),
            host.keys.decision().cloned(),
            owns(&host.ownerships),
            shutdown.clone(),
        )),
    ];
    let reassigner = ReassignHandles {
        tables: host.tables.clone(),
        placement: host.placement.clone(),
        keys: host.keys.clone(),
        leases: stores.leases.clone(),
        quarantine: stores.quarantine.clone(),
        journal: stores.journal.clone(),
        triggers: host.intake.triggers.clone(),
        lease_clock: LeaseClock::new(host.config.default_lease_ttl),
    };
    background.extend(crate::reassign::start(
        reassigner,
        reassign_rx,
        shutdown.clone(),
    ));
    background
}

/// Takes over the jobs nobody owns (their leader died, or this one under
/// the same id), then starts the standby loop, which takes over the ones
/// that lapse later, and the watch of cancellations.
async fn take_over_jobs(
    host: &Arc<JobHost>,
    standby_rx: mpsc::UnboundedReceiver<String>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, LeaderError> {
    // The relays subscribe asynchronously; make sure the server has the
    // subscriptions before the daemon reports ready.
    host.stores.bus.flush().await?;
    crate::runner::take_unowned(host).await?;
    Ok(vec![
        tokio::spawn(crate::runner::standby(
            host.clone(),
            standby_rx,
            shutdown.clone(),
        )),
        tokio::spawn(crate::runner::watch_cancellations(
            host.clone(),
            shutdown.clone(),
        )),
    ])
}

/// Serves `Control` with health and reflection until shutdown
/// ([`mtswarm_auth::serve`]). Every call but health checks (probes) is
/// authenticated; each Control method then checks the role it needs. No
/// request span: `SubmitJob` makes its own, the root of the job's trace.
async fn serve_control(
    host: &Arc<JobHost>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Serving, LeaderError> {
    let max = host.config.grpc_max_message_bytes;
    let control = v1::control_server::ControlServer::new(ControlService {
        host: host.clone(),
        jobs: JobManager::new(host.clone()),
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(max);
    let options = ServeOptions::default();
    mtswarm_auth::serve(
        listener,
        &host.config.security,
        control,
        options,
        async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        },
    )
    .await
    .map_err(|error| match error {
        ServeError::Tls(error) => LeaderError::InvalidConfig(error.to_string()),
        ServeError::Reflection(reason) => LeaderError::Reflection(reason),
    })
}

/// Observes the jobs this leader runs and queues (`mtswarm.jobs`) from
/// its scheduler. Weak: the meter must not keep the daemon's state alive.
fn observe_jobs(tables: &Arc<JobTables>) -> mtswarm_telemetry::metrics::observe::LeaderObservers {
    let tables = Arc::downgrade(tables);
    mtswarm_telemetry::metrics::observe::observe_jobs(move || {
        let (running, queued) = tables.upgrade()?.scheduler.counts();
        Some(mtswarm_telemetry::metrics::observe::JobCounts {
            running: u64::try_from(running).unwrap_or(u64::MAX),
            queued: u64::try_from(queued).unwrap_or(u64::MAX),
        })
    })
}

/// Whether this leader owns a job (the approval relay journals only its
/// jobs). Weak: the relay must not keep the daemon's state alive after
/// shutdown.
fn owns(ownerships: &Arc<Ownerships>) -> impl Fn(&str) -> bool + Send + 'static {
    let ownerships = Arc::downgrade(ownerships);
    move |job_id: &str| {
        ownerships
            .upgrade()
            .is_some_and(|ownerships| ownerships.owns(job_id))
    }
}

impl LeaderHandle {
    /// This leader's id among the leaders on its NATS.
    pub fn leader_id(&self) -> &str {
        &self.host.config.leader_id
    }

    /// Ids of the jobs this leader owns now.
    pub fn owned_jobs(&self) -> Vec<String> {
        self.host.ownerships.job_ids()
    }

    /// Result and reassignment counters since the daemon started.
    pub fn counters(&self) -> LeaderCounters {
        self.host.tables.results.counters()
    }

    /// Sizes of the in-memory tables that hold per-job state (idle: all 0).
    pub fn table_sizes(&self) -> crate::tables::LeaderTableSizes {
        self.host.tables.sizes(self.host.placement.claims.len())
    }

    /// (running, queued) job counts of this leader's scheduler.
    pub fn job_counts(&self) -> (usize, usize) {
        self.host.tables.scheduler.counts()
    }

    /// Stops the daemon the way a crash would, for tests of restarts: the
    /// runners, background loops and the server are aborted at once; no job
    /// state is written and NATS is not drained.
    pub async fn abort(self) {
        self.shutdown.send_replace(true);
        // Its ownerships lapse after their TTL, as a crashed leader's do.
        self.host.ownerships.abandon_all().await;
        for runner in self.host.tables.runners.iter() {
            runner.abort();
        }
        self.server.abort();
        for task in &self.background {
            task.abort();
        }
        let _ = self.server.await;
        for task in self.background {
            let _ = task.await;
        }
    }

    /// The address the `Control` server listens on (the actual port when
    /// the configuration asked for port 0).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// `http://<addr>` (`https://` with TLS), for clients.
    pub fn grpc_url(&self) -> String {
        format!("{}://{}", self.scheme, self.grpc_addr)
    }

    /// The daemon's NATS connection.
    pub fn bus(&self) -> &Bus {
        &self.host.stores.bus
    }

    /// Ids of the jobs whose runners are in this process.
    pub fn running_jobs(&self) -> Vec<String> {
        self.host
            .tables
            .runners
            .iter()
            .map(|r| r.key().clone())
            .collect()
    }

    /// Graceful stop: health NOT_SERVING, stop accepting calls, stop the job
    /// runners (their jobs stay RUNNING in KV with their last checkpoint,
    /// for a leader that resumes them) and the consumers, drain NATS.
    pub async fn shutdown(self) -> Result<(), LeaderError> {
        self.health
            .set_not_serving::<v1::control_server::ControlServer<ControlService>>()
            .await;
        self.shutdown.send_replace(true);
        for runner in self.host.tables.runners.iter() {
            runner.abort();
        }
        // Another leader takes the jobs over once their ownership lapses;
        // no write for them leaves this leader from now on.
        self.host.ownerships.abandon_all().await;
        let mut server = self.server;
        let served = match tokio::time::timeout(SERVER_STOP_WAIT, &mut server).await {
            Ok(served) => served,
            Err(_) => {
                tracing::warn!("gRPC server did not stop in time; aborting open calls");
                server.abort();
                Ok(Ok(()))
            }
        };
        for task in self.background {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        if let Err(error) = self.host.stores.bus.drain().await {
            tracing::warn!(%error, "NATS drain failed");
        }
        match served {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(LeaderError::Server(error.to_string())),
            Err(error) => Err(LeaderError::Server(error.to_string())),
        }
    }
}
