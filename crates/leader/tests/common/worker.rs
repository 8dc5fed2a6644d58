//! A fake worker daemon: a real Worker gRPC server with one slice,
//! registered in the workers KV and holding the slice's lease, that reports
//! the calls it gets to the test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::{Bus, LeaseRequest, Leases, Versioned, Workers, v1};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::within;

/// What the fake worker saw.
#[derive(Debug)]
pub(crate) enum WorkerCall {
    /// A SpawnSession reached a gated worker and waits for its gate.
    SpawnArrived(String),
    Spawn(Box<v1::SpawnSessionRequest>),
    Cancel(v1::CancelSessionRequest),
}

struct FakeWorkerService {
    worker_id: String,
    slice_id: String,
    calls: mpsc::UnboundedSender<WorkerCall>,
    lease: Arc<FakeLease>,
    /// When set, every SpawnSession waits for a permit before it starts
    /// the session.
    spawn_gate: Option<Arc<Semaphore>>,
}

/// The fake worker's lease on its slice, renewed like a real worker's (the
/// session it names is set by SpawnSession).
pub(crate) struct FakeLease {
    leases: Leases,
    held: tokio::sync::Mutex<Option<Versioned<v1::SliceLease>>>,
}

impl FakeLease {
    /// Renews the lease, naming `session` when given.
    async fn renew(&self, session: Option<(&str, &str)>) {
        let mut held = self.held.lock().await;
        let Some(current) = held.as_ref() else { return };
        let renewed = self
            .leases
            .renew_with(current, |lease| {
                if let Some((session_id, job_id)) = session {
                    lease.session_id = session_id.to_string();
                    lease.job_id = job_id.to_string();
                }
            })
            .await;
        match renewed {
            Ok(renewed) => *held = Some(renewed),
            Err(error) => {
                eprintln!("fake worker lease not renewed: {error}");
            }
        }
    }
}

#[tonic::async_trait]
impl v1::worker_server::Worker for FakeWorkerService {
    async fn spawn_session(
        &self,
        request: Request<v1::SpawnSessionRequest>,
    ) -> Result<Response<v1::SpawnSessionResponse>, Status> {
        let request = request.into_inner();
        if let Some(gate) = &self.spawn_gate {
            let _ = self
                .calls
                .send(WorkerCall::SpawnArrived(request.session_id.clone()));
            let permit = gate
                .acquire()
                .await
                .map_err(|_| Status::unavailable("spawn gate closed"))?;
            permit.forget();
        }
        if !request.slice_id.is_empty() && request.slice_id != self.slice_id {
            return Err(Status::not_found(format!(
                "slice {} is not on worker {}",
                request.slice_id, self.worker_id
            )));
        }
        self.lease
            .renew(Some((&request.session_id, &request.job_id)))
            .await;
        let response = v1::SpawnSessionResponse {
            session_id: request.session_id.clone(),
            worker_id: self.worker_id.clone(),
            slice_id: self.slice_id.clone(),
            lease_epoch: 1,
            resumed_from_step: 0,
        };
        let _ = self.calls.send(WorkerCall::Spawn(Box::new(request)));
        Ok(Response::new(response))
    }
    async fn cancel_session(
        &self,
        request: Request<v1::CancelSessionRequest>,
    ) -> Result<Response<v1::CancelSessionResponse>, Status> {
        let _ = self.calls.send(WorkerCall::Cancel(request.into_inner()));
        Ok(Response::new(v1::CancelSessionResponse { cancelled: true }))
    }
    async fn drain(
        &self,
        _: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Ok(Response::new(v1::DrainResponse::default()))
    }
    async fn status(
        &self,
        _: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        Ok(Response::new(v1::StatusResponse {
            worker_id: self.worker_id.clone(),
            ..Default::default()
        }))
    }
}

/// Lease TTL of the fake workers (the smallest the KV allows, so a killed
/// fake worker's lease lapses fast).
pub(crate) const FAKE_LEASE_TTL: Duration = Duration::from_secs(1);

/// A Worker gRPC server on 127.0.0.1:0 with one slice, registered in the
/// workers KV and holding the slice's lease (renewed every third of
/// [`FAKE_LEASE_TTL`]). Calls arrive on `calls`.
pub(crate) struct FakeWorker {
    pub worker_id: String,
    pub slice_id: String,
    pub addr: SocketAddr,
    pub calls: mpsc::UnboundedReceiver<WorkerCall>,
    server: tokio::task::JoinHandle<()>,
    renewal: tokio::task::JoinHandle<()>,
    bus: Bus,
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.server.abort();
        self.renewal.abort();
    }
}

impl FakeWorker {
    pub(crate) async fn start(bus: &Bus, worker_id: &str, board: &str) -> FakeWorker {
        Self::start_with_gate(bus, worker_id, board, None).await
    }

    /// A fake worker whose SpawnSession calls each wait for a permit of
    /// `gate` (announced as [`WorkerCall::SpawnArrived`]).
    pub(crate) async fn start_with_gate(
        bus: &Bus,
        worker_id: &str,
        board: &str,
        spawn_gate: Option<Arc<Semaphore>>,
    ) -> FakeWorker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let slice_id = format!("{board}-c0");
        let (tx, calls) = mpsc::unbounded_channel();
        let leases = Leases::open(bus).await.expect("leases bucket");
        let held = leases
            .acquire(&LeaseRequest {
                slice_id: slice_id.clone(),
                worker_id: worker_id.to_string(),
                session_id: String::new(),
                job_id: String::new(),
                ttl: FAKE_LEASE_TTL,
            })
            .await
            .expect("slice lease");
        let lease = Arc::new(FakeLease {
            leases,
            held: tokio::sync::Mutex::new(Some(held)),
        });
        let renewal = {
            let lease = lease.clone();
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(FAKE_LEASE_TTL / 3);
                loop {
                    ticker.tick().await;
                    lease.renew(None).await;
                }
            })
        };
        let service = FakeWorkerService {
            worker_id: worker_id.to_string(),
            slice_id: slice_id.clone(),
            calls: tx,
            lease,
            spawn_gate,
        };
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(v1::worker_server::WorkerServer::new(service))
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        let record = v1::WorkerRecord {
            worker_id: worker_id.to_string(),
            endpoint: format!("http://{addr}"),
            slices: vec![v1::SliceDescriptor {
                slice_id: slice_id.clone(),
                board: board.to_string(),
                cluster: 0,
                cores: 8,
                backend: "emulator".to_string(),
            }],
            ..Default::default()
        };
        Workers::open(bus)
            .await
            .expect("workers bucket")
            .register(&record, Duration::from_secs(60))
            .await
            .expect("register worker");
        FakeWorker {
            worker_id: worker_id.to_string(),
            slice_id,
            addr,
            calls,
            server,
            renewal,
            bus: bus.clone(),
        }
    }

    /// What a crash looks like to the rest of the system: the gRPC server
    /// stops, the lease is no longer renewed (it lapses after its TTL) and
    /// the worker record is gone.
    pub(crate) async fn kill(&self) {
        self.server.abort();
        self.renewal.abort();
        Workers::open(&self.bus)
            .await
            .expect("workers bucket")
            .deregister(&self.worker_id)
            .await
            .expect("deregister the killed worker");
    }
    /// The next call, which must be a SpawnSession that reached the service.
    pub(crate) async fn next_spawn(&mut self, what: &str) -> Box<v1::SpawnSessionRequest> {
        match within(what, self.calls.recv()).await {
            Some(WorkerCall::Spawn(spawn)) => spawn,
            other => panic!(
                "expected a SpawnSession on {} ({what}), got {other:?}",
                self.worker_id
            ),
        }
    }

    /// The next call, which must be a SpawnSession waiting at the gate
    /// (see [`FakeWorker::start_with_gate`]); its session id.
    pub(crate) async fn next_spawn_arrival(&mut self, what: &str) -> String {
        match within(what, self.calls.recv()).await {
            Some(WorkerCall::SpawnArrived(session_id)) => session_id,
            other => panic!(
                "expected a SpawnSession on {} ({what}), got {other:?}",
                self.worker_id
            ),
        }
    }

    /// The next call, which must be a CancelSession.
    pub(crate) async fn next_cancel(&mut self, what: &str) -> v1::CancelSessionRequest {
        match within(what, self.calls.recv()).await {
            Some(WorkerCall::Cancel(cancel)) => cancel,
            other => panic!(
                "expected a CancelSession on {} ({what}), got {other:?}",
                self.worker_id
            ),
        }
    }

    /// Waits for the spawns that complete and the first CancelSession after
    /// them (calls before the first spawn completed are only logged).
    pub(crate) async fn spawns_then_cancel(
        &mut self,
        what: &str,
    ) -> (Vec<v1::SpawnSessionRequest>, v1::CancelSessionRequest) {
        let mut spawns = Vec::new();
        loop {
            match within(what, self.calls.recv()).await {
                Some(WorkerCall::Spawn(spawn)) => spawns.push(*spawn),
                Some(WorkerCall::Cancel(cancel)) if !spawns.is_empty() => return (spawns, cancel),
                Some(other) => eprintln!("before the spawn completed: {other:?}"),
                None => panic!("the fake worker stopped"),
            }
        }
    }

    /// The SpawnSession calls received so far (other calls are dropped).
    pub(crate) fn spawns_so_far(&mut self) -> Vec<v1::SpawnSessionRequest> {
        std::iter::from_fn(|| self.calls.try_recv().ok())
            .filter_map(|call| match call {
                WorkerCall::Spawn(spawn) => Some(*spawn),
                WorkerCall::Cancel(_) | WorkerCall::SpawnArrived(_) => None,
            })
            .collect()
    }
}
