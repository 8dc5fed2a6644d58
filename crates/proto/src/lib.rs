//! Protobuf and gRPC definitions shared by every mtswarm process.
//!
//! The `.proto` sources live in `proto/mtswarm/v1/` at the repository root;
//! this crate compiles them (vendored protoc, tonic-prost-build) into:
//! - [`v1`]: the message types, the `Control` and `Worker` service clients
//!   (`v1::control_client::ControlClient`, `v1::worker_client::WorkerClient`)
//!   and servers (`v1::control_server::{Control, ControlServer}`,
//!   `v1::worker_server::{Worker, WorkerServer}`);
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors for tonic-reflection.
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
