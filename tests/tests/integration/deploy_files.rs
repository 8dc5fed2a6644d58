//! The deployment files stay usable: the example fleet loads with the real
//! fleet parser, the nats-server configuration is accepted by nats-server
//! itself, the Kubernetes NATS cluster configuration keeps its settings, and
//! the image build context leaves out the build output and credentials. The
//! Kubernetes manifests themselves are checked by the `k8s` tests
//! (`cargo test -p mtswarm-tests --test k8s`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::PathBuf;
use std::process::Command;

use mtswarm_hw::fleet::Fleet;
use mtswarm_tests::repo_root;

fn deploy() -> PathBuf {
    repo_root().join("deploy")
}

#[test]
fn example_fleet_loads_and_nats_config_is_valid() {
    let fleet = Fleet::load(&deploy().join("fleet.example.toml")).expect("example fleet loads");
    assert_eq!(fleet.slices().len(), 8);

    let deploy_conf = std::fs::read_to_string(deploy().join("nats-server.conf")).expect("conf");

    // nats-server checks the file itself (-t), with the store moved somewhere
    // writable and the authorization block `mtswarm credentials` writes.
    let dir = tempfile::tempdir().expect("temp dir");
    let workers = vec![mtswarm_auth::generate::NatsWorker {
        worker_id: "worker-board0".into(),
        slice_ids: vec!["board0-c0".into()],
    }];
    mtswarm_auth::generate::nats_credentials(&dir.path().join("credentials"), &workers)
        .expect("authorization block");
    let conf = dir.path().join("nats.conf");
    let store = dir.path().join("js");
    std::fs::write(
        &conf,
        deploy_conf.replace("/data/jetstream", &store.display().to_string()),
    )
    .expect("write conf");
    let output = Command::new("nats-server")
        .arg("-t")
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("nats-server on PATH (deploy/setup.sh installs it)");
    assert!(
        output.status.success(),
        "nats-server rejects the config: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The Kubernetes cluster configuration is the single-server one plus the
/// cluster: every setting of deploy/nats-server.conf but the server name
/// (which comes from the pod name there) is in k8s/base/nats-server.conf.
#[test]
fn k8s_nats_config_keeps_the_single_server_settings() {
    let deploy_conf = std::fs::read_to_string(deploy().join("nats-server.conf")).expect("conf");
    let k8s_conf =
        std::fs::read_to_string(repo_root().join("k8s/base/nats-server.conf")).expect("k8s conf");
    let k8s_lines: Vec<&str> = k8s_conf.lines().map(str::trim).collect();
    for line in deploy_conf.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with("server_name:") {
            continue;
        }
        assert!(
            k8s_lines.contains(&line),
            "k8s/base/nats-server.conf lacks `{line}` of deploy/nats-server.conf"
        );
    }
}

/// `docker build .` sends no build output or credentials to the builder,
/// and keeps everything the Dockerfile copies.
#[test]
fn docker_build_context_leaves_out_target_and_credentials() {
    let ignore = std::fs::read_to_string(repo_root().join(".dockerignore")).expect(".dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for needed in ["target", ".git", "deploy/credentials"] {
        assert!(
            patterns
                .iter()
                .any(|p| p.trim_start_matches('/').trim_end_matches('/') == needed),
            ".dockerignore leaves out {needed}: {patterns:?}"
        );
    }
    let dockerfile = std::fs::read_to_string(deploy().join("Dockerfile")).expect("Dockerfile");
    for copy in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let source = copy.split_whitespace().nth(1).expect("COPY source");
        if source == "." {
            continue;
        }
        assert!(
            !patterns
                .iter()
                .any(|p| source.starts_with(p.trim_end_matches('/'))),
            "the Dockerfile copies {source}, which .dockerignore leaves out"
        );
    }
}
