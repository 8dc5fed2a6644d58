//! Serves the generated `Control` service on a real socket and calls it
//! with the generated client; checks the service names the crate exports
//! against the generated servers'. Health and reflection (built from
//! `FILE_DESCRIPTOR_SET`) are served by `mtswarm_auth::serve` and checked
//! there, as grpcurl and Kubernetes gRPC probes would
//! (crates/auth/tests/serve.rs).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::net::SocketAddr;
use std::pin::Pin;

use futures::Stream;
use mtswarm_proto::service_names;
use mtswarm_proto::v1::control_client::ControlClient;
use mtswarm_proto::v1::control_server::{Control, ControlServer};
use mtswarm_proto::v1::*;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

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

async fn serve() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(ControlServer::new(EchoControl))
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
    });
    addr
}

#[tokio::test]
async fn generated_client_reaches_generated_server() {
    let addr = serve().await;
    let mut control = ControlClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the test server");
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
    assert_eq!(
        mtswarm_proto::v1::control_server::SERVICE_NAME,
        service_names::CONTROL
    );
    assert_eq!(
        mtswarm_proto::v1::worker_server::SERVICE_NAME,
        service_names::WORKER
    );
}
