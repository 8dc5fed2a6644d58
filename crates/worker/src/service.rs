//! The `Worker` gRPC service: SpawnSession, CancelSession, Drain and Status
//! over the daemon's shared state.

use std::sync::Arc;

use mtswarm_bus::{KeptLease, v1};
use tonic::{Request, Response, Status};

use crate::host::SessionHost;
use crate::session::spawn_session;
use crate::stop::StopMode;

/// The daemon's `mtswarm.v1.Worker` service over its shared state;
/// [`WorkerDaemon::start`](crate::WorkerDaemon::start) builds and serves it.
pub struct WorkerService {
    shared: Arc<SessionHost>,
}

impl WorkerService {
    pub(crate) fn new(shared: Arc<SessionHost>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl v1::worker_server::Worker for WorkerService {
    async fn spawn_session(
        &self,
        request: Request<v1::SpawnSessionRequest>,
    ) -> Result<Response<v1::SpawnSessionResponse>, Status> {
        spawn_session(&self.shared, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn cancel_session(
        &self,
        request: Request<v1::CancelSessionRequest>,
    ) -> Result<Response<v1::CancelSessionResponse>, Status> {
        let request = request.into_inner();
        let session = self
            .shared
            .slices
            .table()
            .sessions
            .get(&request.session_id)
            .cloned();
        let cancelled = match session {
            Some(session) => {
                session.stop(StopMode::Cancel(crate::requests::cancel_reason(&request)));
                true
            }
            None => false,
        };
        Ok(Response::new(v1::CancelSessionResponse { cancelled }))
    }

    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        let request = request.into_inner();
        let grace = crate::requests::drain_grace(&request, self.shared.config.drain_grace);
        let first = !self.shared.slices.start_draining();
        tracing::info!(reason = %request.reason, ?grace, "draining");
        self.shared.slices.stop_sessions(StopMode::AfterTask);
        if first {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                shared.slices.stop_sessions(StopMode::Abandon);
            });
        }
        let remaining = self.shared.slices.table().sessions.len();
        Ok(Response::new(v1::DrainResponse {
            sessions_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        }))
    }

    async fn status(
        &self,
        _request: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        let shared = &self.shared;
        let sessions: Vec<v1::SessionStatus> = {
            let table = shared.slices.table();
            table
                .sessions
                .values()
                .map(|s| s.status(&shared.slices[s.slice_index].bus_id))
                .collect()
        };
        let quarantined: Vec<String> = match shared.stores.quarantine.list().await {
            Ok(list) => list.into_iter().map(|q| q.value.slice_id).collect(),
            Err(error) => {
                tracing::warn!(%error, "quarantine list unavailable for Status");
                Vec::new()
            }
        };
        let mut slices = Vec::with_capacity(shared.slices.len());
        for entry in shared.slices.iter() {
            let lease = match shared.leases.state_of(&entry.bus_id) {
                Some(KeptLease::Held(held)) => Some(held.value),
                _ => None,
            };
            let lock_utilization = shared
                .hw_lock
                .stats(&entry.slice.id())
                .map(|s| s.utilization())
                .unwrap_or(0.0);
            slices.push(v1::SliceStatus {
                slice: Some(entry.descriptor()),
                lease,
                quarantined: quarantined.contains(&entry.bus_id),
                lock_utilization,
            });
        }
        Ok(Response::new(v1::StatusResponse {
            worker_id: shared.identity.worker_id.clone(),
            draining: shared.slices.is_draining(),
            sessions,
            slices,
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }
}
