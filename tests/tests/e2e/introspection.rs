//! Acceptance 5: what grpcurl and Kubernetes probes see. A reflection client
//! lists the services of the leader and of a worker daemon process, and the
//! gRPC health service answers SERVING on both.

use std::time::Duration;

use mtswarm_proto::service_names;
use mtswarm_tests::{StackOptions, TestStack, node_bin, small_fleet_toml};
use tokio_stream::StreamExt as _;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(url.to_string())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

async fn listed_services(url: &str) -> Vec<String> {
    let mut client = ServerReflectionClient::new(channel(url).await);
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
    list.service.into_iter().map(|s| s.name).collect()
}

async fn health(url: &str, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(channel(url).await);
    client
        .check(HealthCheckRequest {
            service: service.to_string(),
        })
        .await
        .unwrap_or_else(|e| panic!("health check of {service:?} at {url}: {e}"))
        .into_inner()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_and_worker_answer_reflection_and_health() {
    let stack = TestStack::start(StackOptions::new(node_bin!(), small_fleet_toml(1, 1, 2))).await;
    let leader = stack.leader_url.clone();
    let worker = stack.worker_ready[0].grpc.clone();

    let leader_services = listed_services(&leader).await;
    assert!(
        leader_services.iter().any(|s| s == service_names::CONTROL),
        "{leader_services:?}"
    );
    assert!(
        leader_services.iter().any(|s| s == "grpc.health.v1.Health"),
        "{leader_services:?}"
    );
    let worker_services = listed_services(&worker).await;
    assert!(
        worker_services.iter().any(|s| s == service_names::WORKER),
        "{worker_services:?}"
    );
    assert!(
        worker_services.iter().any(|s| s == "grpc.health.v1.Health"),
        "{worker_services:?}"
    );

    assert_eq!(
        health(&leader, service_names::CONTROL).await,
        ServingStatus::Serving
    );
    assert_eq!(health(&leader, "").await, ServingStatus::Serving);
    assert_eq!(
        health(&worker, service_names::WORKER).await,
        ServingStatus::Serving
    );
    assert_eq!(health(&worker, "").await, ServingStatus::Serving);

    // An unknown service is NOT_FOUND, so probes cannot pass by accident.
    let mut client = HealthClient::new(channel(&worker).await);
    let unknown = client
        .check(HealthCheckRequest {
            service: "mtswarm.v1.Nope".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    stack.shutdown().await;
}
