//! Protobuf and gRPC definitions shared by every mtswarm process.
//!
//! The `.proto` sources live in `proto/mtswarm/v1/` at the repository root;
//! this crate compiles them (vendored protoc, tonic-prost-build) into:
//! - [`v1`]: the message types, the `Control` and `Worker` service clients
//!   (`v1::control_client::ControlClient`, `v1::worker_client::WorkerClient`)
//!   and servers (`v1::control_server::{Control, ControlServer}`,
//!   `v1::worker_server::{Worker, WorkerServer}`);
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors for tonic-reflection;
//! - [`GrpcTransport`]: the one bound on what a generated client runs over,
//!   for helpers that take any client.
//!
//! Well-known types (`google.protobuf.Timestamp`) map to [`prost_types`].

/// Generated code for package `mtswarm.v1`.
// Each generated server routes all its methods in one `call` function:
// longer than the workspace's limit, and tonic's code, not ours to split.
#[allow(clippy::too_many_lines)]
pub mod v1 {
    tonic::include_proto!("mtswarm.v1");
}

/// Encoded `FileDescriptorSet` of all `mtswarm.v1` files, for
/// `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("mtswarm_v1_descriptor");

/// Fully-qualified gRPC service names, e.g. for health reporting.
pub mod service_names {
    /// `mtswarm.v1.Control`
    pub const CONTROL: &str = "mtswarm.v1.Control";
    /// `mtswarm.v1.Worker`
    pub const WORKER: &str = "mtswarm.v1.Worker";
}

pub use prost_types;

use tonic::codegen::{Body, Bytes, StdError};

/// What a generated gRPC client needs of its transport: a channel, with or
/// without interceptors (trace context, bearer tokens). Helpers that take
/// any client bound their transport by this one name.
pub trait GrpcTransport:
    tonic::client::GrpcService<
        tonic::body::Body,
        Error: Into<StdError>,
        ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
    >
{
}

impl<T> GrpcTransport for T where
    T: tonic::client::GrpcService<
            tonic::body::Body,
            Error: Into<StdError>,
            ResponseBody: Body<Data = Bytes, Error: Into<StdError> + Send> + Send + 'static,
        >
{
}
