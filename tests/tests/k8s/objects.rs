//! Strict schema validation of every rendering, and the wiring of the
//! objects: NATS as a 3-node JetStream cluster, leaders with their id from
//! the pod name, TLS-only gRPC with TCP probes, PodDisruptionBudgets and
//! NetworkPolicies.

use std::process::Command;

use yaml_rust2::Yaml;

use crate::render::{
    self, SETUP_HINT, args, config_map, config_value, container, env_field, env_value, find,
    objects, of_app, overlay_names, pod, rendered,
};

/// Kubernetes versions the renderings must be valid for: the oldest one
/// supported (the namespace's Pod Security enforce-version) and the newest
/// schema kubernetes-validate ships.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.32.0", "1.37.0"];

#[test]
fn every_rendering_validates_strictly() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in rendered() {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, text).expect("write rendering");
        for version in KUBERNETES_VERSIONS {
            let output = Command::new("kubernetes-validate")
                .args(["--strict", "--quiet", "-k", version])
                .arg(&file)
                .output()
                .unwrap_or_else(|e| {
                    panic!("kubernetes-validate could not be run ({e}): {SETUP_HINT}")
                });
            assert!(
                output.status.success(),
                "{name} is not valid for Kubernetes {version}:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let count = objects(name).len();
        assert!(count >= 10, "{name} rendered only {count} objects");
        eprintln!("{name}: {count} objects valid for Kubernetes {KUBERNETES_VERSIONS:?}");
    }
}

#[test]
fn nats_is_a_three_node_jetstream_cluster() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        let nats = find(&objects, "StatefulSet", "mtswarm-nats");
        let replicas = nats["spec"]["replicas"].as_i64().expect("replicas");
        assert_eq!(replicas, 3, "{overlay}");
        assert_eq!(
            nats["spec"]["podManagementPolicy"].as_str(),
            Some("Parallel")
        );
        let service = nats["spec"]["serviceName"].as_str().expect("serviceName");
        let headless = find(&objects, "Service", service);
        assert_eq!(headless["spec"]["clusterIP"].as_str(), Some("None"));
        assert_eq!(
            headless["spec"]["publishNotReadyAddresses"].as_bool(),
            Some(true)
        );
        assert_eq!(
            env_field(nats, "POD_NAME").as_deref(),
            Some("metadata.name")
        );
        assert_eq!(
            env_value(nats, "SERVER_NAME").as_deref(),
            Some("$(POD_NAME)")
        );
        let claims = nats["spec"]["volumeClaimTemplates"].as_vec().expect("PVCs");
        assert_eq!(claims[0]["metadata"]["name"].as_str(), Some("data"));
        let mounts = container(nats)["volumeMounts"].as_vec().expect("mounts");
        assert!(mounts.iter().any(
            |m| m["name"].as_str() == Some("data") && m["mountPath"].as_str() == Some("/data")
        ));

        let config = config_map(&objects, "mtswarm-nats-config")["data"]["nats-server.conf"]
            .as_str()
            .expect("nats-server.conf");
        assert!(config.contains("server_name: $SERVER_NAME"), "{overlay}");
        assert!(config.contains("store_dir: /data/jetstream"));
        assert!(config.contains("sync_interval: always"));
        // Clients know every node, and every stream is kept on all of them.
        let urls = config_value(&objects, "MTSWARM_NATS_URL");
        let expected: Vec<String> = (0..replicas)
            .map(|i| format!("nats://mtswarm-nats-{i}.{service}:4222"))
            .collect();
        assert_eq!(urls, expected.join(","), "{overlay}");
        assert_eq!(
            config_value(&objects, "MTSWARM_NATS_REPLICAS"),
            replicas.to_string()
        );

        let anti = &pod(nats)["affinity"]["podAntiAffinity"];
        if overlay == "production" {
            let required = anti["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_vec()
                .expect("production: one NATS node per machine is required");
            assert_eq!(
                required[0]["topologyKey"].as_str(),
                Some("kubernetes.io/hostname")
            );
        } else {
            assert!(!anti.is_badvalue(), "{overlay}: NATS anti-affinity");
        }
    }
}

/// Several leaders share NATS; each takes its `--leader-id` from its pod
/// name through the downward API, so a restarted one has the same id.
#[test]
fn leaders_take_their_id_from_the_pod_name() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        let leader = find(&objects, "StatefulSet", "mtswarm-leader");
        assert!(leader["spec"]["replicas"].as_i64().expect("replicas") >= 2);
        assert_eq!(
            env_field(leader, "MTSWARM_LEADER_ID").as_deref(),
            Some("metadata.name"),
            "{overlay}"
        );
        let help = leader_help("leader");
        assert!(help.contains("[env: MTSWARM_LEADER_ID="), "{help}");
        let leader_args = args(leader);
        assert_eq!(leader_args.first().map(String::as_str), Some("leader"));
        assert_flags_exist("leader", &leader_args, &help);
    }
}

fn leader_help(subcommand: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mtswarm-node"))
        .args([subcommand, "--help"])
        .output()
        .expect("mtswarm --help");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every `--flag` in a manifest's args is a flag of that subcommand.
pub(crate) fn assert_flags_exist(subcommand: &str, args: &[String], help: &str) {
    for flag in args.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "`mtswarm {subcommand}` has no flag {flag}:\n{help}"
        );
    }
}

/// gRPC is TLS-only in the cluster: both daemons serve with the Secret's
/// certificate, the leaders check the workers' against the CA, workers
/// advertise `https://`, and no probe sends plaintext gRPC to the API port
/// (the kubelet's gRPC probes cannot speak TLS): they are TCP probes.
#[test]
fn leaders_and_workers_serve_grpc_over_tls_with_tcp_probes() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        let leader = find(&objects, "StatefulSet", "mtswarm-leader");
        find(&objects, "Service", "mtswarm-leader");
        let workers = of_app(&objects, "StatefulSet", "mtswarm-worker");
        assert!(!workers.is_empty(), "{overlay}: no worker StatefulSet");
        let mut daemons = vec![(leader, 7700)];
        daemons.extend(workers.iter().map(|w| (*w, 7701)));
        for (object, port) in daemons {
            let c = container(object);
            let ports = c["ports"].as_vec().expect("ports");
            assert!(
                ports.iter().any(|p| p["name"].as_str() == Some("grpc")
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
            // One key per process: the leader's own, each worker's own.
            let own = if port == 7700 { "leader" } else { "worker" };
            for (name, file) in [
                ("MTSWARM_TLS_CERT", format!("{own}.pem")),
                ("MTSWARM_TLS_KEY", format!("{own}.key")),
            ] {
                let value = env_value(object, name).unwrap_or_else(|| panic!("{name} on {port}"));
                assert!(value.starts_with("/etc/mtswarm/credentials/") && value.ends_with(&file));
            }
            let env_from = c["envFrom"].as_vec().expect("envFrom");
            assert!(env_from.iter().any(|e| {
                e["configMapRef"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("mtswarm-config-"))
            }));
            assert!(
                c["image"]
                    .as_str()
                    .is_some_and(|image| image.contains("mtswarm") && image.contains(':')),
                "{overlay}: the overlay pins the mtswarm image: {:?}",
                c["image"]
            );
        }
        assert_eq!(
            env_value(leader, "MTSWARM_TLS_CA").as_deref(),
            Some("/etc/mtswarm/credentials/ca.pem")
        );
        assert_eq!(
            env_value(leader, "MTSWARM_DECISION_KEY_FILE").as_deref(),
            Some("/etc/mtswarm/credentials/decision.nk")
        );
        for worker in &workers {
            let worker_args = args(worker);
            let advertise = worker_args
                .iter()
                .position(|a| a == "--advertise")
                .and_then(|i| worker_args.get(i + 1))
                .expect("--advertise");
            assert!(advertise.starts_with("https://"), "{advertise}");
            assert_eq!(
                env_value(worker, "MTSWARM_LEADER_PUBLIC_KEY_FILE").as_deref(),
                Some("/etc/mtswarm/credentials/decision.pub")
            );
        }
        // The OTLP endpoint is one optional value in the shared config.
        config_value(&objects, "OTEL_EXPORTER_OTLP_ENDPOINT");
    }
}

/// Every PodDisruptionBudget lets one pod go at a time and selects pods
/// that exist: NATS keeps its quorum, one leader and one board stay in
/// service through a drain.
#[test]
fn disruption_budgets_cover_nats_leaders_and_workers() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        for app in ["mtswarm-nats", "mtswarm-leader", "mtswarm-worker"] {
            let budget = find(&objects, "PodDisruptionBudget", app);
            assert_eq!(budget["spec"]["maxUnavailable"].as_i64(), Some(1), "{app}");
            assert_eq!(
                budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
                Some(app)
            );
            let selected = of_app(&objects, "StatefulSet", app);
            assert!(
                selected.iter().all(|s| pod_label(s) == Some(app)) && !selected.is_empty(),
                "{overlay}: {app}'s budget selects its pods"
            );
        }
    }
}

fn pod_label(object: &Yaml) -> Option<&str> {
    object["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"].as_str()
}

/// Issue: least privilege on Kubernetes. Credentials come from Secrets;
/// NetworkPolicies let only the leaders reach the workers, only mtswarm
/// pods reach NATS clients' port and only NATS pods its route port.
#[test]
fn credentials_come_from_secrets_and_network_policies_confine_traffic() {
    for overlay in overlay_names() {
        let objects = objects(&overlay);
        let leader = find(&objects, "StatefulSet", "mtswarm-leader");
        let secret_of = |object: &Yaml| -> Vec<String> {
            pod(object)["volumes"]
                .as_vec()
                .expect("volumes")
                .iter()
                .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(secret_of(leader), vec!["mtswarm-leader-credentials"]);
        for worker in of_app(&objects, "StatefulSet", "mtswarm-worker") {
            assert_eq!(secret_of(worker), vec!["mtswarm-worker-credentials"]);
            for name in ["MTSWARM_IDENTITIES", "MTSWARM_NATS_NKEY_FILE"] {
                assert!(env_value(worker, name).is_some(), "worker {name}");
            }
        }
        for name in [
            "MTSWARM_IDENTITIES",
            "MTSWARM_NATS_NKEY_FILE",
            "MTSWARM_RESULT_KEY_FILE",
        ] {
            assert!(env_value(leader, name).is_some(), "leader {name}");
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
            "only the leaders reach the workers"
        );
        let to_nats = find(&objects, "NetworkPolicy", "mtswarm-nats-from-mtswarm");
        let rules = to_nats["spec"]["ingress"].as_vec().expect("NATS ingress");
        let rule_for = |port: i64| -> &Yaml {
            rules
                .iter()
                .find(|r| r["ports"][0]["port"].as_i64() == Some(port))
                .unwrap_or_else(|| panic!("{overlay}: no NATS ingress rule for {port}"))
        };
        let clients = rule_for(4222)["from"][0]["podSelector"]["matchExpressions"][0]["values"]
            .as_vec()
            .expect("values");
        assert!(
            clients
                .iter()
                .all(|v| v.as_str().is_some_and(|name| name.starts_with("mtswarm-")))
        );
        assert_eq!(
            rule_for(6222)["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
                .as_str(),
            Some("mtswarm-nats"),
            "only NATS nodes reach the route port"
        );
        let deny = find(&objects, "NetworkPolicy", "mtswarm-default-deny");
        assert!(
            deny["spec"]["ingress"].is_badvalue(),
            "default deny has no ingress rule"
        );
        // Every policy's pods exist under that label.
        for app in ["mtswarm-nats", "mtswarm-leader", "mtswarm-worker"] {
            assert!(!render::of_app(&objects, "StatefulSet", app).is_empty());
        }
    }
}
