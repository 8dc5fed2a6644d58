//! `mtswarm_auth::serve` on a real socket, as the worker daemon runs it
//! (every call needs the `leader` role): health answers without a token
//! (and NOT_FOUND for a service it does not know), reflection (v1 and
//! v1alpha, listing every service of `FILE_DESCRIPTOR_SET`, as grpcurl
//! sees them) and the service only with one, the service only with the
//! role; the shutdown signal stops the server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mtswarm_auth::{
    IdentityEntry, IdentityTable, Role, ServeOptions, ServerSecurity, Serving, serve, token_digest,
};
use mtswarm_proto::service_names;
use mtswarm_proto::v1::worker_client::WorkerClient;
use mtswarm_proto::v1::worker_server::{Worker, WorkerServer};
use mtswarm_proto::v1::*;
use tokio::sync::oneshot;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const LEADER_TOKEN: &str = "leader-token";
const SUBMIT_TOKEN: &str = "alice-token";

/// A `Worker` whose only answer is its status.
struct IdleWorker;

#[tonic::async_trait]
impl Worker for IdleWorker {
    async fn spawn_session(
        &self,
        _: Request<SpawnSessionRequest>,
    ) -> Result<Response<SpawnSessionResponse>, Status> {
        Err(Status::unimplemented("spawn_session"))
    }
    async fn cancel_session(
        &self,
        _: Request<CancelSessionRequest>,
    ) -> Result<Response<CancelSessionResponse>, Status> {
        Err(Status::unimplemented("cancel_session"))
    }
    async fn drain(&self, _: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        Err(Status::unimplemented("drain"))
    }
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        Ok(Response::new(StatusResponse {
            worker_id: "w1".into(),
            ..Default::default()
        }))
    }
}

/// The leader (role `leader`) and a submitter (role `submit`).
fn security() -> ServerSecurity {
    let entry = |name: &str, role: &str, token: &str| IdentityEntry {
        name: name.into(),
        roles: vec![role.into()],
        token_sha256: token_digest(token),
    };
    let table = IdentityTable::from_entries(&[
        entry("leader", "leader", LEADER_TOKEN),
        entry("alice", "submit", SUBMIT_TOKEN),
    ])
    .expect("identities");
    ServerSecurity {
        identities: Some(Arc::new(table)),
        tls: None,
    }
}

/// Serves an idle `Worker` on a loopback port the way the worker daemon
/// does; the sender stops it.
async fn start() -> (SocketAddr, Serving, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = serve(
        listener,
        &security(),
        WorkerServer::new(IdleWorker),
        ServeOptions {
            required_role: Some(Role::Leader),
            request_span: None,
        },
        async {
            let _ = stopped.await;
        },
    )
    .await
    .expect("serving");
    (addr, serving, stop)
}

async fn channel(addr: SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

/// `message` with `token` as its bearer credential, if any.
fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
    }
    request
}

async fn health(channel: &Channel, service: &str) -> ServingStatus {
    HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status()
}

/// `$list(channel, token)`: the services reflection `$version` lists, or
/// the status it refused with (one body for the two protocol versions,
/// whose generated types are distinct).
macro_rules! list_services {
    ($list:ident, $version:ident) => {
        async fn $list(channel: &Channel, token: Option<&str>) -> Result<Vec<String>, Status> {
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            use tonic_reflection::pb::$version::{
                ServerReflectionRequest, ServerReflectionResponse,
            };
            let ask = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut answers = ServerReflectionClient::new(channel.clone())
                .server_reflection_info(with_token(tokio_stream::iter(vec![ask]), token))
                .await?
                .into_inner();
            let answer: ServerReflectionResponse = answers.next().await.expect("one answer")?;
            match answer.message_response {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    Ok(list.service.into_iter().map(|s| s.name).collect())
                }
                other => panic!("not a service list: {other:?}"),
            }
        }
    };
}

list_services!(list_v1, v1);
list_services!(list_v1alpha, v1alpha);

#[tokio::test]
async fn health_is_open_and_follows_the_reporter() {
    let (addr, serving, _stop) = start().await;
    let channel = channel(addr).await;
    for service in [service_names::WORKER, ""] {
        assert_eq!(
            health(&channel, service).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let unknown = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: "mtswarm.v1.Nope".into(),
        })
        .await
        .expect_err("an unknown service");
    assert_eq!(unknown.code(), Code::NotFound);
    serving
        .health
        .set_not_serving::<WorkerServer<IdleWorker>>()
        .await;
    assert_eq!(
        health(&channel, service_names::WORKER).await,
        ServingStatus::NotServing
    );
}

#[tokio::test]
async fn reflection_answers_both_protocols_to_the_authenticated_only() {
    let (addr, _serving, _stop) = start().await;
    let channel = channel(addr).await;
    for names in [
        list_v1(&channel, Some(LEADER_TOKEN)).await.expect("v1"),
        list_v1alpha(&channel, Some(LEADER_TOKEN))
            .await
            .expect("v1alpha"),
    ] {
        // Every service of the protos (the leader's too) and health's.
        for service in [
            service_names::WORKER,
            service_names::CONTROL,
            "grpc.health.v1.Health",
        ] {
            assert!(names.iter().any(|n| n == service), "{service}: {names:?}");
        }
    }
    let refused = list_v1(&channel, None).await.expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated);
    let refused = list_v1alpha(&channel, Some(SUBMIT_TOKEN))
        .await
        .expect_err("not the leader");
    assert_eq!(refused.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn the_service_needs_a_token_and_the_required_role() {
    let (addr, _serving, _stop) = start().await;
    let mut worker = WorkerClient::new(channel(addr).await);
    let refused = worker
        .status(with_token(StatusRequest::default(), None))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated);
    let refused = worker
        .status(with_token(StatusRequest::default(), Some(SUBMIT_TOKEN)))
        .await
        .expect_err("not the leader");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let status = worker
        .status(with_token(StatusRequest::default(), Some(LEADER_TOKEN)))
        .await
        .expect("the leader may")
        .into_inner();
    assert_eq!(status.worker_id, "w1");
}

#[tokio::test]
async fn the_shutdown_signal_stops_the_server() {
    let (_addr, serving, stop) = start().await;
    stop.send(()).expect("server waiting");
    let served = tokio::time::timeout(Duration::from_secs(10), serving.task)
        .await
        .expect("stopped in time")
        .expect("not panicked");
    assert!(served.is_ok(), "{served:?}");
}
