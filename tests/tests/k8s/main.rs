//! The Kubernetes layout (`k8s/`): the base and every overlay render with
//! `kubectl kustomize` and validate strictly against pinned Kubernetes
//! schemas (`kubernetes-validate --strict`); the rendered objects keep the
//! wiring the deployment relies on (Pod Security "restricted", probes,
//! resources, PodDisruptionBudgets, TLS-only gRPC, NetworkPolicies); each
//! overlay's worker StatefulSets are its fleet, board for board; and the
//! production overlay's NATS configuration forms a 3-node JetStream cluster
//! when three real nats-servers run it on loopback.
//!
//! kubectl and kubernetes-validate come from `deploy/setup.sh`; without
//! them these tests fail and say so, never skip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

mod nats_cluster;
mod objects;
mod render;
mod security;
mod workers;
