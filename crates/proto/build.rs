//! Generates the Rust types, tonic clients and servers, and the file
//! descriptor set (for gRPC reflection) from `proto/mtswarm/v1/*.proto`.
//! protoc comes from `protoc-bin-vendored`, so no system package is needed.

use std::path::PathBuf;

const PROTO_FILES: &[&str] = &[
    "mtswarm/v1/bus.proto",
    "mtswarm/v1/control.proto",
    "mtswarm/v1/worker.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let protoc_include = protoc_bin_vendored::include_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", &protoc) };

    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto").canonicalize()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let files: Vec<PathBuf> = PROTO_FILES.iter().map(|f| proto_root.join(f)).collect();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .file_descriptor_set_path(out_dir.join("mtswarm_v1_descriptor.bin"))
        .compile_protos(&files, &[proto_root, protoc_include])?;
    Ok(())
}
