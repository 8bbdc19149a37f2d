//! Generates the CRI v1 client from the proto kept in `proto/` (origin: `proto/README.md`).
//!
//! The proto is compiled by `protox`, a protobuf compiler written in Rust, so building the agent
//! needs no `protoc` on the machine: `cargo build` works wherever Rust does, and `cargo xtask
//! setup` has one package fewer to install.

use std::path::PathBuf;

const PROTO_ROOT: &str = "proto";
const API_PROTO: &str = "k8s.io/cri-api/pkg/apis/runtime/v1/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = PathBuf::from(PROTO_ROOT).join(API_PROTO);
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([API_PROTO], [PROTO_ROOT])?;
    tonic_prost_build::configure()
        // The agent is a client of the runtime; it never serves the CRI.
        .build_server(false)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
