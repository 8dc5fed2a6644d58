//! The one gRPC server setup of mtswarm's daemons: the leader serves
//! `Control` with it, each worker daemon `Worker`. Both must answer alike
//! where they are alike (TLS, bearer tokens, health for probes, reflection
//! for grpcurl), so the server is built in one place, next to the TLS
//! settings and the interceptor it applies; what differs between the
//! daemons is a parameter ([`ServeOptions`], the service, the shutdown
//! signal).
//!
//! Every service but health is authenticated ([`Authenticator`], with the
//! daemon's required role, if any): probes carry no token. Reflection
//! answers both its v1 and v1alpha protocols (grpcurl asks v1 first, older
//! tools only know v1alpha), over the workspace's protos and health's.

use std::convert::Infallible;
use std::future::Future;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic_health::server::HealthReporter;

use crate::{AuthError, Role, ServerSecurity};

/// Why a daemon's gRPC server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The TLS certificate or key cannot be used.
    #[error("{0}")]
    Tls(#[from] AuthError),
    /// The reflection service could not be built from the descriptors.
    #[error("{0}")]
    Reflection(String),
}

/// How one daemon's server differs from the other's.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServeOptions {
    /// A role every authenticated call also needs (the worker daemon's:
    /// [`Role::Leader`]); `None`: each method checks its own.
    pub required_role: Option<Role>,
    /// The span each request runs in (the worker daemon's:
    /// `mtswarm_telemetry::grpc::server_span`, the caller's span its
    /// parent); `None` when the service makes its own spans (the leader's
    /// `SubmitJob` span is the root of a job's trace, so nothing may wrap
    /// it).
    pub request_span: Option<fn(&http::Request<()>) -> tracing::Span>,
}

/// A running server.
#[derive(Debug)]
pub struct Serving {
    /// Health of the daemon's service (SERVING from the start); the daemon
    /// reports NOT_SERVING through it when it stops.
    pub health: HealthReporter,
    /// The server; it ends when the shutdown signal resolves and the open
    /// calls are done.
    pub task: JoinHandle<Result<(), tonic::transport::Error>>,
}

/// Serves `service` on `listener` with `security`'s TLS and identities,
/// health and reflection, until `shutdown` resolves. Health reports
/// `service` SERVING before the first connection is accepted.
pub async fn serve<S>(
    listener: TcpListener,
    security: &ServerSecurity,
    service: S,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Serving, ServeError>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<S>().await;
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let mut authenticator = security.authenticator();
    if !authenticator.is_enabled() {
        tracing::warn!(
            service = S::NAME,
            "no identities configured: the service accepts anonymous calls"
        );
    }
    if let Some(role) = options.required_role {
        authenticator = authenticator.requiring(role);
    }
    let mut builder = security.server_builder()?;
    if let Some(request_span) = options.request_span {
        builder = builder.trace_fn(request_span);
    }
    let router = builder
        .add_service(health_service)
        .add_service(InterceptedService::new(
            reflection_v1,
            authenticator.clone(),
        ))
        .add_service(InterceptedService::new(
            reflection_v1alpha,
            authenticator.clone(),
        ))
        .add_service(InterceptedService::new(service, authenticator));
    let task =
        tokio::spawn(router.serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown));
    Ok(Serving { health, task })
}

/// Reflection over the workspace's protos and health's.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mtswarm_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}
