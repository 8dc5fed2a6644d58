//! The production overlay's NATS configuration, as rendered into its
//! ConfigMap, runs as a real 3-node cluster: three `nats-server -c`
//! processes on loopback, each with the rendered configuration where only
//! the pods' addresses (listen, monitoring and route addresses, the route
//! URLs naming the StatefulSet's pods) and the paths of the volumes are
//! moved to this machine, and `SERVER_NAME` set to its pod's name as the
//! downward API would. The cluster elects a JetStream meta leader, and
//! mtswarm's whole topology created at 3 replicas places every stream and
//! bucket on all three servers, every replica current.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mtswarm_bus::testing::cluster::{wait_meta_leader, wait_replicas_current};
use mtswarm_bus::{Bus, BusConfig, TopologyConfig};

use crate::render::{config_map, container, find, objects};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The three servers; killed (and their logs kept for a failure message)
/// when the test ends, passing or not.
struct Servers {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
}

impl Servers {
    fn logs(&self) -> String {
        self.logs
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("== {}\n{}", log.display(), tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn container_port(object: &yaml_rust2::Yaml, name: &str) -> i64 {
    container(object)["ports"]
        .as_vec()
        .expect("ports")
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("NATS container port {name}"))
}

/// `text` with `from` replaced by `to`, which must occur exactly once (so
/// the rewrite cannot silently miss a setting that moved).
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "the rendered NATS configuration has `{from}` once:\n{text}"
    );
    text.replacen(from, to, 1)
}

/// One loopback server's configuration made from the rendered one.
struct Node {
    name: String,
    client: u16,
    route: u16,
    http: u16,
}

fn node_config(rendered: &str, node: &Node, nodes: &[Node], pods: &[String], dir: &Path) -> String {
    let mut text = rendered.to_string();
    text = replace_once(
        &text,
        "listen: 0.0.0.0:4222",
        &format!("listen: 127.0.0.1:{}", node.client),
    );
    text = replace_once(
        &text,
        "http: 0.0.0.0:8222",
        &format!("http: 127.0.0.1:{}", node.http),
    );
    text = replace_once(
        &text,
        "listen: 0.0.0.0:6222",
        &format!("listen: 127.0.0.1:{}", node.route),
    );
    for (pod, peer) in pods.iter().zip(nodes) {
        text = replace_once(
            &text,
            &format!("nats://{pod}"),
            &format!("nats://127.0.0.1:{}", peer.route),
        );
    }
    let own = dir.join(&node.name);
    std::fs::create_dir_all(&own).expect("node dir");
    text = replace_once(
        &text,
        "/data/jetstream",
        &own.join("jetstream").display().to_string(),
    );
    replace_once(
        &text,
        "/var/run/nats/nats.pid",
        &own.join("nats.pid").display().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn production_nats_config_forms_a_three_node_cluster_on_loopback() {
    let objects = objects("production");
    let nats = find(&objects, "StatefulSet", "mtswarm-nats");
    let replicas = nats["spec"]["replicas"].as_i64().expect("replicas") as usize;
    let service = nats["spec"]["serviceName"].as_str().expect("serviceName");
    let cluster_port = container_port(nats, "cluster");
    assert_eq!(container_port(nats, "nats"), 4222);
    assert_eq!(container_port(nats, "monitor"), 8222);
    let rendered = config_map(&objects, "mtswarm-nats-config")["data"]["nats-server.conf"]
        .as_str()
        .expect("nats-server.conf")
        .to_string();
    // The routes name exactly the StatefulSet's pods under its headless
    // Service, on the container's cluster port.
    let pod_names: Vec<String> = (0..replicas).map(|i| format!("mtswarm-nats-{i}")).collect();
    let pods: Vec<String> = pod_names
        .iter()
        .map(|pod| format!("{pod}.{service}:{cluster_port}"))
        .collect();
    let routes = rendered.matches("nats://").count();
    assert_eq!(routes, replicas, "one route per pod:\n{rendered}");

    // The authorization block the configuration includes, as `mtswarm
    // credentials` writes it, next to the configuration files.
    let dir = tempfile::tempdir().expect("temp dir");
    let credentials =
        mtswarm_auth::generate::nats_credentials(&dir.path().join("credentials"), &[])
            .expect("NATS credentials");
    let seed = mtswarm_auth::generate::read_seed(
        credentials
            .seed_file(mtswarm_auth::generate::NATS_LEADER)
            .expect("leader seed"),
    )
    .expect("leader seed");

    let nodes: Vec<Node> = pod_names
        .iter()
        .map(|name| Node {
            name: name.clone(),
            client: free_port(),
            route: free_port(),
            http: free_port(),
        })
        .collect();
    let started = Instant::now();
    let servers = start_servers(&rendered, &nodes, &pods, dir.path());
    let bus = connect(&nodes, seed, &servers).await;
    wait_meta_leader(&bus, TIMEOUT).await;
    let elected = started.elapsed();

    // What the leaders and workers do at start with MTSWARM_NATS_REPLICAS.
    let topology = TopologyConfig {
        replicas,
        ..TopologyConfig::default()
    };
    if let Err(e) = bus.ensure_topology(&topology).await {
        panic!(
            "mtswarm's topology at {replicas} replicas: {e}\n{}",
            servers.logs()
        );
    }
    wait_replicas_current(&bus, TIMEOUT).await;
    let streams = assert_every_stream_is_on_every_pod(&bus, &pod_names).await;
    eprintln!(
        "production NATS config: {replicas} nodes, meta leader after {:.1}s, \
         {streams} streams and buckets on all {replicas} ({:.1}s in all)",
        elected.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(bus);
    drop(servers);
}

/// One nats-server per node, each with its copy of the rendered
/// configuration, logging into `dir`.
fn start_servers(rendered: &str, nodes: &[Node], pods: &[String], dir: &Path) -> Servers {
    let mut servers = Servers {
        children: Vec::new(),
        logs: Vec::new(),
    };
    for node in nodes {
        let conf = dir.join(format!("{}.conf", node.name));
        std::fs::write(&conf, node_config(rendered, node, nodes, pods, dir)).expect("write config");
        let log = dir.join(format!("{}.log", node.name));
        let out = File::create(&log).expect("log");
        let err = out.try_clone().expect("log");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .env("SERVER_NAME", &node.name)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("nats-server on PATH (deploy/setup.sh installs it)");
        servers.children.push(child);
        servers.logs.push(log);
    }

    servers
}

/// A client of every node, with the leader's NATS identity (`seed`).
async fn connect(nodes: &[Node], seed: String, servers: &Servers) -> Bus {
    let mut config = BusConfig::new(format!("nats://127.0.0.1:{}", nodes[0].client));
    config.servers = nodes
        .iter()
        .map(|n| format!("nats://127.0.0.1:{}", n.client))
        .collect();
    config.nkey_seed = Some(seed);
    config.name = "k8s-nats-cluster-test".into();
    tokio::time::timeout(TIMEOUT, Bus::connect(config))
        .await
        .unwrap_or_else(|_| panic!("no connection within {TIMEOUT:?}\n{}", servers.logs()))
        .unwrap_or_else(|e| panic!("connect: {e}\n{}", servers.logs()))
}

/// mtswarm's streams and buckets are each on every node, named after its
/// pod; how many there are.
async fn assert_every_stream_is_on_every_pod(bus: &Bus, pod_names: &[String]) -> usize {
    let names: Vec<String> = bus
        .jetstream()
        .stream_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .expect("stream names");
    assert!(
        names.len() >= 10,
        "mtswarm's streams and buckets: {names:?}"
    );
    let expected: BTreeSet<String> = pod_names.iter().cloned().collect();
    for name in &names {
        let mut stream = bus.jetstream().get_stream(name).await.expect("stream");
        let info = stream.info().await.expect("stream info");
        let cluster = info.cluster.clone().expect("cluster info");
        assert_eq!(cluster.name.as_deref(), Some("mtswarm"), "{name}");
        let mut peers: BTreeSet<String> = cluster.replicas.iter().map(|p| p.name.clone()).collect();
        peers.insert(cluster.leader.clone().expect("stream leader"));
        assert_eq!(
            peers, expected,
            "{name} is on every node, named after its pod"
        );
    }
    names.len()
}
