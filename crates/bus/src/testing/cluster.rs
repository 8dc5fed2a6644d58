//! A real nats-server cluster on loopback, for tests of replicated streams:
//! N servers with JetStream, each with its own store, client port and route
//! port, routed to each other. A node can be killed with SIGKILL and
//! restarted on the same ports and store, so a test can check that nothing
//! acknowledged is lost and that the node catches up.
//!
//! Waits are on conditions with a deadline: [`wait_meta_leader`] until the
//! cluster has elected a JetStream meta leader, [`wait_replicas_current`]
//! until every stream reports all its replicas current,
//! [`wait_node_current`] until one node (a restarted one) holds a current
//! replica of every stream.

use std::time::{Duration, Instant};

use async_nats::jetstream::stream;
use futures::StreamExt as _;

use crate::connection::Bus;
use crate::local_server::{LocalServerError, LocalServerOptions, NatsServer, free_port};

/// Pause between two looks at a condition being waited for.
const POLL: Duration = Duration::from_millis(100);
/// Name of the cluster (every node's `cluster.name`).
pub const CLUSTER_NAME: &str = "mtswarm-test";

/// One node's fixed identity: kept across restarts.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    client_port: u16,
}

/// N routed nats-servers with JetStream on 127.0.0.1.
#[derive(Debug)]
pub struct LocalCluster {
    nodes: Vec<Node>,
    servers: Vec<NatsServer>,
}

impl LocalCluster {
    /// Starts `size` routed servers (`n1`, `n2`, ...) and waits (bounded)
    /// until each serves clients; [`wait_meta_leader`] then waits for the
    /// cluster's JetStream. Blocks the calling thread.
    pub fn start(size: usize) -> Result<Self, LocalServerError> {
        let client_ports = (0..size)
            .map(|_| free_port())
            .collect::<Result<Vec<_>, _>>()?;
        let route_ports = (0..size)
            .map(|_| free_port())
            .collect::<Result<Vec<_>, _>>()?;
        let routes = route_ports
            .iter()
            .map(|port| format!("nats-route://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::with_capacity(size);
        let mut servers = Vec::with_capacity(size);
        for (index, (&client_port, &route_port)) in
            client_ports.iter().zip(&route_ports).enumerate()
        {
            let name = format!("n{}", index + 1);
            let config = format!(
                "server_name: {name}\n\
                 cluster {{\n  name: {CLUSTER_NAME}\n  listen: 127.0.0.1:{route_port}\n  routes: [{routes}]\n}}\n"
            );
            servers.push(NatsServer::start_with(LocalServerOptions {
                port: Some(client_port),
                config: Some(config),
                ..LocalServerOptions::default()
            })?);
            nodes.push(Node { name, client_port });
        }
        Ok(Self { nodes, servers })
    }

    /// Client URLs of every node, to connect with all of them.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.client_port))
            .collect()
    }

    /// Number of nodes.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Server name of node `index` (`n1` is index 0).
    pub fn name(&self, index: usize) -> &str {
        &self.nodes[index].name
    }

    /// Index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|node| node.name == name)
    }

    /// The server of node `index` (its log, pid, store).
    pub fn server(&self, index: usize) -> &NatsServer {
        &self.servers[index]
    }

    /// Kills node `index` with SIGKILL (no flush, no goodbye to its peers).
    pub fn kill(&mut self, index: usize) -> Result<(), LocalServerError> {
        self.servers[index].stop()
    }

    /// Starts node `index` again on its ports with its store, and waits
    /// until it serves clients (catching up is [`wait_replicas_current`]).
    pub fn restart(&mut self, index: usize) -> Result<(), LocalServerError> {
        self.servers[index].restart()
    }
}

/// Waits until the cluster has a JetStream meta leader (the account's
/// JetStream info answers), at most `timeout`; panics naming what it saw.
pub async fn wait_meta_leader(bus: &Bus, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let error = match bus.jetstream().query_account().await {
            Ok(_) => return,
            Err(error) => error,
        };
        assert!(
            Instant::now() < deadline,
            "no JetStream meta leader within {timeout:?}: {error}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The server name of the leader of stream `name`, once it has one.
pub async fn stream_leader(bus: &Bus, name: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match stream_info(bus, name).await {
            Ok(info) => match info.cluster.and_then(|cluster| cluster.leader) {
                Some(leader) => return leader,
                None => "no leader".to_string(),
            },
            Err(error) => error,
        };
        assert!(
            Instant::now() < deadline,
            "stream {name} has no leader within {timeout:?}: {seen}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// What `bus`'s server says of stream `name` (its configuration and
/// cluster), or why it could not say.
pub async fn stream_info(bus: &Bus, name: &str) -> Result<stream::Info, String> {
    let mut stream = bus
        .jetstream()
        .get_stream(name)
        .await
        .map_err(|error| error.to_string())?;
    stream
        .info()
        .await
        .map_err(|error| error.to_string())
        .cloned()
}

/// Why stream `info` is not fully replicated yet (`None`: it is): every
/// one of its `replicas` has a leader and the rest are current, online and
/// without lag.
fn not_current(info: &stream::Info, replicas: usize) -> Option<String> {
    let name = &info.config.name;
    let Some(cluster) = &info.cluster else {
        return Some(format!("{name}: no cluster info"));
    };
    if cluster.leader.is_none() {
        return Some(format!("{name}: no leader"));
    }
    if cluster.replicas.len() + 1 < replicas {
        return Some(format!(
            "{name}: {} followers, {} expected",
            cluster.replicas.len(),
            replicas - 1
        ));
    }
    cluster
        .replicas
        .iter()
        .find(|peer| !peer.current || peer.offline || peer.lag.unwrap_or(0) > 0)
        .map(|peer| {
            format!(
                "{name}: replica {} current={} offline={} lag={:?}",
                peer.name, peer.current, peer.offline, peer.lag
            )
        })
}

/// Waits until every stream of the account (KV buckets included) reports
/// a leader and all its replicas current with no lag, at most `timeout`;
/// panics naming the stream and replica still behind.
pub async fn wait_replicas_current(bus: &Bus, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let behind = match streams_behind(bus).await {
            Ok(None) => return,
            Ok(Some(behind)) => behind,
            Err(error) => error,
        };
        assert!(
            Instant::now() < deadline,
            "replicas not current within {timeout:?}: {behind}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Names of every stream of the account (KV buckets included).
async fn stream_names(bus: &Bus) -> Result<Vec<String>, String> {
    bus.jetstream()
        .stream_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|error| error.to_string())
}

/// The first stream not fully replicated, or `None`.
async fn streams_behind(bus: &Bus) -> Result<Option<String>, String> {
    let names = stream_names(bus).await?;
    for name in names {
        let info = stream_info(bus, &name).await?;
        if let Some(behind) = not_current(&info, info.config.num_replicas) {
            return Ok(Some(behind));
        }
    }
    Ok(None)
}

/// Why `node` does not hold a current replica of stream `info` (`None`: it
/// does): it leads the stream, or it is one of its replicas, current,
/// online and without lag (it has the leader's last sequence).
fn node_not_current(info: &stream::Info, node: &str) -> Option<String> {
    let name = &info.config.name;
    let Some(cluster) = &info.cluster else {
        return Some(format!("{name}: no cluster info"));
    };
    if cluster.leader.as_deref() == Some(node) {
        return None;
    }
    if cluster.leader.is_none() {
        return Some(format!("{name}: no leader"));
    }
    match cluster.replicas.iter().find(|peer| peer.name == node) {
        None => Some(format!("{name}: {node} is not a replica")),
        Some(peer) if !peer.current || peer.offline || peer.lag.unwrap_or(0) > 0 => Some(format!(
            "{name}: replica {node} current={} offline={} lag={:?}",
            peer.current, peer.offline, peer.lag
        )),
        Some(_) => None,
    }
}

/// Waits until node `node` (a server name, e.g. a restarted `n2`) leads or
/// holds a current replica, without lag, of every stream of the account
/// (KV buckets included) that has more than one replica, at most
/// `timeout`; returns how many streams it checked, and panics naming the
/// stream still behind.
pub async fn wait_node_current(bus: &Bus, node: &str, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let behind = match node_behind(bus, node).await {
            Ok(Ok(checked)) => return checked,
            Ok(Err(behind)) => behind,
            Err(error) => error,
        };
        assert!(
            Instant::now() < deadline,
            "{node} not current within {timeout:?}: {behind}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The number of replicated streams, or the first one `node` is behind on.
async fn node_behind(bus: &Bus, node: &str) -> Result<Result<usize, String>, String> {
    let names = stream_names(bus).await?;
    let mut checked = 0;
    for name in names {
        let info = stream_info(bus, &name).await?;
        if info.config.num_replicas < 2 {
            continue;
        }
        if let Some(behind) = node_not_current(&info, node) {
            return Ok(Err(behind));
        }
        checked += 1;
    }
    Ok(Ok(checked))
}
