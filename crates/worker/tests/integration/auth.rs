//! The Worker service behind TLS and bearer tokens, over real sockets: only
//! the leader's identity may call it. An anonymous Drain (which used to
//! make the daemon refuse new sessions) and a SpawnSession without the
//! leader are refused, and the daemon keeps serving the leader.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use crate::common;

use common::*;
use mtswarm_auth::generate::{LOCAL_HOSTS, default_identities, grpc_credentials};
use mtswarm_auth::{ClientAuth, ServerSecurity};
use mtswarm_bus::v1;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

type Pass = fn(Request<()>) -> Result<Request<()>, Status>;
type Client = v1::worker_client::WorkerClient<
    InterceptedService<Channel, mtswarm_auth::BearerInterceptor<Pass>>,
>;

fn pass(request: Request<()>) -> Result<Request<()>, Status> {
    Ok(request)
}

async fn client(worker_id: &str, url: &str, auth: &ClientAuth) -> Client {
    let channel = auth
        .worker_endpoint(worker_id, url, WAIT)
        .expect("endpoint")
        .connect()
        .await
        .expect("TLS connect");
    v1::worker_client::WorkerClient::with_interceptor(channel, auth.interceptor(pass as Pass))
}

/// A Drain (which would make the daemon refuse new sessions) that must be
/// refused; returns the status.
async fn refused_drain(client: &mut Client) -> Status {
    client
        .drain(v1::DrainRequest {
            reason: "attack".into(),
            grace_seconds: 1,
        })
        .await
        .expect_err("the drain is refused")
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_identity_may_call_the_worker_service() {
    let env = Env::start().await;
    let hosts: Vec<String> = LOCAL_HOSTS.iter().map(|h| h.to_string()).collect();
    let mut config = env.config("emu0");
    let worker_id = config.effective_worker_id();
    let credentials = grpc_credentials(
        &env.dir.path().join("creds"),
        &hosts,
        &default_identities(),
        std::slice::from_ref(&worker_id),
    )
    .expect("credentials");
    let tls = credentials
        .worker_tls(&worker_id)
        .expect("worker certificate");
    config.security = ServerSecurity::load(
        Some(&credentials.identities_file),
        Some((&tls.cert_file, &tls.key_file)),
    )
    .expect("security");
    let handle = env.daemon(config).await;
    let url = handle.endpoint().to_string();
    let slice = handle.slice_ids()[0].clone();
    assert!(url.starts_with("https://"), "{url}");
    let ca = ClientAuth::none()
        .with_ca_file(&credentials.ca_file)
        .expect("ca");
    let token = |name: &str| {
        ca.clone()
            .with_token_file(credentials.token_file(name).expect("token"))
            .expect("token")
    };

    // The worker's certificate names its identity, not the host: a
    // client checking the host alone is refused.
    let by_host = ca.endpoint(&url, WAIT).expect("endpoint").connect().await;
    assert!(by_host.is_err(), "the worker's certificate names its host");
    let mut anonymous = client(&worker_id, &url, &ca).await;
    let drained = refused_drain(&mut anonymous).await;
    assert_eq!(drained.code(), Code::Unauthenticated, "{drained:?}");
    let spawned = anonymous
        .spawn_session(spawn_request("j", "a", "s-anon", &slice))
        .await
        .expect_err("anonymous spawn");
    assert_eq!(spawned.code(), Code::Unauthenticated, "{spawned:?}");

    // A person's identity, even an admin, is not the leader.
    let mut admin = client(&worker_id, &url, &token("admin")).await;
    let denied = refused_drain(&mut admin).await;
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains("`leader`"), "{denied:?}");

    // Even the leader may not point a session at an endpoint off the
    // daemon's allowlist (its key would follow).
    let mut leader = client(&worker_id, &url, &token("leader")).await;
    let mut off_list = spawn_request("j", "a", "s-evil", &slice);
    off_list.model = Some(v1::ModelSettings {
        base_url: "http://127.0.0.1:9/v1".into(),
        model: "m".into(),
        ..Default::default()
    });
    let refused = leader
        .spawn_session(off_list)
        .await
        .expect_err("endpoint off the allowlist");
    assert!(refused.message().contains("allowlist"), "{refused:?}");

    // The daemon was not drained: the leader's identity spawns a session.
    let response = leader
        .spawn_session(spawn_request("j", "a", "s-leader", &slice))
        .await
        .expect("the leader spawns")
        .into_inner();
    assert_eq!(response.session_id, "s-leader", "{response:?}");
    let status = leader
        .status(v1::StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.sessions.len(), 1, "{status:?}");
    handle.shutdown().await.expect("shutdown");
}
