//! Serves the generated `Control` and `Worker` services with tonic-health and
//! tonic-reflection (built from `FILE_DESCRIPTOR_SET`) on a real socket, and
//! checks them with the reflection and health clients, as grpcurl and
//! Kubernetes gRPC probes would.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_proto::v1::control_server::{Control, ControlServer};
use mtswarm_proto::v1::worker_server::{Worker, WorkerServer};
use mtswarm_proto::v1::*;
use mtswarm_proto::{FILE_DESCRIPTOR_SET, service_names};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

/// Control service whose only implemented call is SubmitJob (echoes a job id
/// derived from the goal), enough to prove request/response routing works.
struct EchoControl;

type JobEventStream = Pin<Box<dyn Stream<Item = Result<JobEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Control for EchoControl {
    async fn submit_job(
        &self,
        request: Request<SubmitJobRequest>,
    ) -> Result<Response<SubmitJobResponse>, Status> {
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("spec is required"))?;
        Ok(Response::new(SubmitJobResponse {
            job_id: format!("job-for-{}", spec.goal),
            trace_id: String::new(),
        }))
    }
    async fn get_job(&self, _: Request<GetJobRequest>) -> Result<Response<GetJobResponse>, Status> {
        Err(Status::unimplemented("get_job"))
    }
    async fn list_jobs(
        &self,
        _: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        Err(Status::unimplemented("list_jobs"))
    }
    type WatchJobStream = JobEventStream;
    async fn watch_job(
        &self,
        _: Request<WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        Err(Status::unimplemented("watch_job"))
    }
    async fn cancel_job(
        &self,
        _: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        Err(Status::unimplemented("cancel_job"))
    }
    async fn list_fleet(
        &self,
        _: Request<ListFleetRequest>,
    ) -> Result<Response<ListFleetResponse>, Status> {
        Err(Status::unimplemented("list_fleet"))
    }
    async fn list_approvals(
        &self,
        _: Request<ListApprovalsRequest>,
    ) -> Result<Response<ListApprovalsResponse>, Status> {
        Err(Status::unimplemented("list_approvals"))
    }
    async fn decide_approval(
        &self,
        _: Request<DecideApprovalRequest>,
    ) -> Result<Response<DecideApprovalResponse>, Status> {
        Err(Status::unimplemented("decide_approval"))
    }
    async fn lift_quarantine(
        &self,
        _: Request<LiftQuarantineRequest>,
    ) -> Result<Response<LiftQuarantineResponse>, Status> {
        Err(Status::unimplemented("lift_quarantine"))
    }
}

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

async fn serve() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ControlServer<EchoControl>>()
        .await;
    health_reporter
        .set_serving::<WorkerServer<IdleWorker>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("reflection service from FILE_DESCRIPTOR_SET");
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(reflection)
            .add_service(ControlServer::new(EchoControl))
            .add_service(WorkerServer::new(IdleWorker))
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
    });
    addr
}

async fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to test server")
}

#[tokio::test]
async fn reflection_lists_control_and_worker_services() {
    let addr = serve().await;
    let mut client = ServerReflectionClient::new(channel(addr).await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection call")
        .into_inner();
    let response = tokio::time::timeout(Duration::from_secs(10), responses.next())
        .await
        .expect("reflection answered in time")
        .expect("one response")
        .expect("response ok");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("expected a list-services response, got {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.iter().any(|n| n == service_names::CONTROL),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == service_names::WORKER),
        "{names:?}"
    );
}

#[tokio::test]
async fn health_reports_serving_for_both_services() {
    let addr = serve().await;
    let mut client = HealthClient::new(channel(addr).await);
    for service in [service_names::CONTROL, service_names::WORKER, ""] {
        let status = client
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "service {service:?}");
    }
    let unknown = client
        .check(HealthCheckRequest {
            service: "mtswarm.v1.Nope".into(),
        })
        .await;
    assert_eq!(
        unknown.expect_err("unknown service").code(),
        tonic::Code::NotFound
    );
}

#[tokio::test]
async fn generated_client_reaches_generated_server() {
    let addr = serve().await;
    let mut control = ControlClient::new(channel(addr).await);
    let response = control
        .submit_job(SubmitJobRequest {
            spec: Some(JobSpec {
                goal: "gemm".into(),
                ..Default::default()
            }),
            idempotency_key: String::new(),
        })
        .await
        .expect("submit_job")
        .into_inner();
    assert_eq!(response.job_id, "job-for-gemm");
    let missing_spec = control
        .submit_job(SubmitJobRequest::default())
        .await
        .expect_err("spec missing");
    assert_eq!(missing_spec.code(), tonic::Code::InvalidArgument);
    let not_done = control
        .get_job(GetJobRequest { job_id: "x".into() })
        .await
        .expect_err("unimplemented");
    assert_eq!(not_done.code(), tonic::Code::Unimplemented);
}

#[test]
fn service_names_match_generated_servers() {
    use tonic::server::NamedService;
    assert_eq!(
        <ControlServer<EchoControl> as NamedService>::NAME,
        service_names::CONTROL
    );
    assert_eq!(
        <WorkerServer<IdleWorker> as NamedService>::NAME,
        service_names::WORKER
    );
}
