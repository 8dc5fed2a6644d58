//! The deployment files stay usable: every Kubernetes manifest parses as
//! YAML with the kinds and wiring the deployment relies on, the fleet files
//! load with the real fleet parser (and match the worker StatefulSet), and
//! the nats-server configuration is accepted by nats-server itself.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::path::{Path, PathBuf};
use std::process::Command;

use mtswarm_hw::fleet::Fleet;
use mtswarm_tests::repo_root;
use yaml_rust2::{Yaml, YamlLoader};

fn k8s() -> PathBuf {
    repo_root().join("k8s")
}

fn deploy() -> PathBuf {
    repo_root().join("deploy")
}

fn load_yaml(path: &Path) -> Vec<Yaml> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kustomization() -> Yaml {
    load_yaml(&k8s().join("kustomization.yaml"))
        .into_iter()
        .next()
        .expect("one document")
}

fn all_objects() -> Vec<Yaml> {
    let kustomization = kustomization();
    let resources = kustomization["resources"]
        .as_vec()
        .expect("kustomization lists resources");
    resources
        .iter()
        .flat_map(|r| load_yaml(&k8s().join(r.as_str().expect("resource path"))))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    objects
        .iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container(object: &Yaml) -> &Yaml {
    &object["spec"]["template"]["spec"]["containers"][0]
}

#[test]
fn every_manifest_parses_and_names_its_kind() {
    for entry in std::fs::read_dir(k8s()).expect("k8s dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        for doc in load_yaml(&path) {
            assert!(
                doc["apiVersion"].as_str().is_some() && doc["kind"].as_str().is_some(),
                "{}: every document has apiVersion and kind",
                path.display()
            );
        }
    }
    let kustomization = kustomization();
    for file in kustomization["configMapGenerator"]
        .as_vec()
        .expect("config maps")
        .iter()
        .flat_map(|g| g["files"].as_vec().cloned().unwrap_or_default())
    {
        let file = file.as_str().expect("file name");
        assert!(k8s().join(file).is_file(), "configMapGenerator file {file}");
    }
}

#[test]
fn nats_runs_jetstream_on_a_persistent_volume() {
    let objects = all_objects();
    let nats = find(&objects, "StatefulSet", "mtswarm-nats");
    let claims = nats["spec"]["volumeClaimTemplates"]
        .as_vec()
        .expect("PVC template");
    assert_eq!(claims[0]["metadata"]["name"].as_str(), Some("data"));
    let mounts = container(nats)["volumeMounts"].as_vec().expect("mounts");
    assert!(mounts.iter().any(|m| m["name"].as_str() == Some("data")
        && m["mountPath"].as_str() == Some("/data")));
    find(&objects, "Service", "mtswarm-nats");
    let config = std::fs::read_to_string(k8s().join("nats-server.conf")).expect("conf");
    assert!(config.contains("store_dir: /data/jetstream"));
}

/// gRPC is TLS-only in the cluster: both daemons serve with the Secret's
/// certificate, the leader checks the workers' against the CA, workers
/// advertise `https://`, and no probe sends plaintext gRPC to the API port
/// (the kubelet's gRPC probes cannot speak TLS): they are TCP probes.
#[test]
fn leader_and_workers_serve_grpc_over_tls_with_tcp_probes() {
    let objects = all_objects();
    let leader = find(&objects, "Deployment", "mtswarm-leader");
    let workers = find(&objects, "StatefulSet", "mtswarm-worker");
    find(&objects, "Service", "mtswarm-leader");
    let env_value = |object: &Yaml, name: &str| -> Option<String> {
        container(object)["env"]
            .as_vec()
            .expect("env")
            .iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str().map(str::to_string))
    };
    for (object, port) in [(leader, 7700), (workers, 7701)] {
        let c = container(object);
        let ports = c["ports"].as_vec().expect("ports");
        assert!(
            ports
                .iter()
                .any(|p| p["name"].as_str() == Some("grpc")
                    && p["containerPort"].as_i64() == Some(port)),
            "{port}"
        );
        for probe in ["readinessProbe", "startupProbe", "livenessProbe"] {
            let probe_spec = &c[probe];
            assert!(
                probe_spec["grpc"].is_badvalue()
                    && probe_spec["httpGet"].is_badvalue()
                    && probe_spec["exec"].is_badvalue(),
                "{probe} would speak plaintext to the TLS port: {probe_spec:?}"
            );
            let target = &probe_spec["tcpSocket"]["port"];
            assert!(
                target.as_str() == Some("grpc") || target.as_i64() == Some(port),
                "{probe} is a TCP probe of the gRPC port: {probe_spec:?}"
            );
        }
        for (name, file) in [
            ("MTSWARM_TLS_CERT", "server.pem"),
            ("MTSWARM_TLS_KEY", "server.key"),
        ] {
            let value = env_value(object, name).unwrap_or_else(|| panic!("{name} on {port}"));
            assert!(value.starts_with("/etc/mtswarm/credentials/") && value.ends_with(file));
        }
        let env_from = c["envFrom"].as_vec().expect("envFrom");
        assert!(
            env_from
                .iter()
                .any(|e| e["configMapRef"]["name"].as_str() == Some("mtswarm-config"))
        );
        assert!(c["resources"]["requests"]["cpu"].as_str().is_some());
    }
    assert_eq!(
        env_value(leader, "MTSWARM_TLS_CA").as_deref(),
        Some("/etc/mtswarm/credentials/ca.pem")
    );
    let worker_args: Vec<&str> = container(workers)["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let advertise = worker_args
        .iter()
        .position(|a| *a == "--advertise")
        .and_then(|i| worker_args.get(i + 1))
        .expect("--advertise");
    assert!(advertise.starts_with("https://"), "{advertise}");
    // Approval decisions: signed by the leader, verified by the workers.
    assert_eq!(
        env_value(leader, "MTSWARM_DECISION_KEY_FILE").as_deref(),
        Some("/etc/mtswarm/credentials/decision.nk")
    );
    assert_eq!(
        env_value(workers, "MTSWARM_LEADER_PUBLIC_KEY_FILE").as_deref(),
        Some("/etc/mtswarm/credentials/decision.pub")
    );
    // The OTLP endpoint is one optional value in the shared config.
    let literals = kustomization()["configMapGenerator"]
        .as_vec()
        .expect("generators")
        .iter()
        .find(|g| g["name"].as_str() == Some("mtswarm-config"))
        .and_then(|g| g["literals"].as_vec().cloned())
        .expect("mtswarm-config literals");
    assert!(literals.iter().any(|l| {
        l.as_str()
            .is_some_and(|l| l.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT="))
    }));
}

#[test]
fn worker_pods_serve_the_boards_of_the_fleet_config_map() {
    let fleet = Fleet::load(&k8s().join("fleet.toml")).expect("k8s fleet.toml loads");
    let objects = all_objects();
    let workers = find(&objects, "StatefulSet", "mtswarm-worker");
    let replicas = kustomization()["replicas"]
        .as_vec()
        .and_then(|r| {
            r.iter()
                .find(|r| r["name"].as_str() == Some("mtswarm-worker"))
        })
        .and_then(|r| r["count"].as_i64())
        .or_else(|| workers["spec"]["replicas"].as_i64())
        .expect("worker replicas");
    let expected: Vec<String> = (0..replicas)
        .map(|i| format!("mtswarm-worker-{i}"))
        .collect();
    let boards: Vec<String> = fleet.boards.iter().map(|b| b.id.clone()).collect();
    assert_eq!(
        boards, expected,
        "one board per worker pod, named after the pod"
    );
    let args: Vec<&str> = container(workers)["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let board_arg = args
        .iter()
        .position(|a| *a == "--board")
        .and_then(|i| args.get(i + 1))
        .expect("--board");
    assert_eq!(*board_arg, "$(POD_NAME)");
    assert_flags_exist("worker", &args);
    let leader_args: Vec<&str> = container(find(&objects, "Deployment", "mtswarm-leader"))["args"]
        .as_vec()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(leader_args.first(), Some(&"leader"));
    assert_flags_exist("leader", &leader_args);
}

/// Every `--flag` in a manifest's args is a flag of that subcommand.
fn assert_flags_exist(subcommand: &str, args: &[&str]) {
    let help = Command::new(env!("CARGO_BIN_EXE_mtswarm-node"))
        .args([subcommand, "--help"])
        .output()
        .expect("mtswarm --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "`mtswarm {subcommand}` has no flag {flag}:\n{help}"
        );
    }
}

#[test]
fn example_fleet_loads_and_nats_config_is_valid() {
    let fleet = Fleet::load(&deploy().join("fleet.example.toml")).expect("example fleet loads");
    assert_eq!(fleet.slices().len(), 8);

    let deploy_conf = std::fs::read_to_string(deploy().join("nats-server.conf")).expect("conf");
    let k8s_conf = std::fs::read_to_string(k8s().join("nats-server.conf")).expect("conf");
    assert_eq!(
        deploy_conf, k8s_conf,
        "k8s/nats-server.conf is a copy of deploy/nats-server.conf"
    );

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

/// Issue: least privilege on Kubernetes. Every pod runs the runtime's
/// default seccomp profile, no mtswarm pod gets a service-account token,
/// credentials come from Secrets, and NetworkPolicies let only the leader
/// reach the workers and only mtswarm pods reach NATS.
#[test]
fn pods_are_confined_and_take_their_credentials_from_secrets() {
    let objects = all_objects();
    let leader = find(&objects, "Deployment", "mtswarm-leader");
    let worker = find(&objects, "StatefulSet", "mtswarm-worker");
    let nats = find(&objects, "StatefulSet", "mtswarm-nats");
    for object in [leader, worker, nats] {
        let pod = &object["spec"]["template"]["spec"];
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault"),
            "{:?}",
            object["metadata"]["name"]
        );
        assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    }
    let secret_of = |object: &Yaml| -> Vec<String> {
        object["spec"]["template"]["spec"]["volumes"]
            .as_vec()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(secret_of(leader), vec!["mtswarm-leader-credentials"]);
    assert_eq!(secret_of(worker), vec!["mtswarm-worker-credentials"]);
    let env_names = |object: &Yaml| -> Vec<String> {
        container(object)["env"]
            .as_vec()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str().map(str::to_string))
            .collect()
    };
    for name in [
        "MTSWARM_IDENTITIES",
        "MTSWARM_NATS_NKEY_FILE",
        "MTSWARM_RESULT_KEY_FILE",
    ] {
        assert!(env_names(leader).iter().any(|n| n == name), "leader {name}");
    }
    for name in ["MTSWARM_IDENTITIES", "MTSWARM_NATS_NKEY_FILE"] {
        assert!(env_names(worker).iter().any(|n| n == name), "worker {name}");
    }

    let to_worker = find(&objects, "NetworkPolicy", "mtswarm-worker-from-leader");
    let from = &to_worker["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    assert_eq!(
        from["app.kubernetes.io/name"].as_str(),
        Some("mtswarm-leader")
    );
    assert_eq!(
        to_worker["spec"]["ingress"].as_vec().map(Vec::len),
        Some(1),
        "only the leader reaches the workers"
    );
    let to_nats = find(&objects, "NetworkPolicy", "mtswarm-nats-from-mtswarm");
    let allowed =
        to_nats["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"]
            .as_vec()
            .expect("values");
    assert!(
        allowed
            .iter()
            .all(|v| v.as_str().is_some_and(|name| name.starts_with("mtswarm-")))
    );
    let deny = find(&objects, "NetworkPolicy", "mtswarm-default-deny");
    assert!(
        deny["spec"]["ingress"].is_badvalue(),
        "default deny has no ingress rule"
    );
}
