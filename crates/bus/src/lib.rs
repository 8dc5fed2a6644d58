//! NATS and JetStream wiring for mtswarm: the data plane between the leader
//! and the worker daemons.
//!
//! - [`Bus::connect`] opens one self-reconnecting connection ([`BusConfig`]:
//!   servers, name, creds/nkey, TLS, timeouts, backoff).
//! - [`Bus::ensure_topology`] creates the streams and KV buckets idempotently.
//! - Typed messaging: tasks ([`Bus::publish_task`], [`Bus::task_consumer`]),
//!   results ([`Bus::publish_result`], [`Bus::result_consumer`]), events
//!   ([`Bus::publish_event`], [`Bus::publish_events`] for a batch in one
//!   message, [`Bus::subscribe_events`], [`Bus::replay_events`]),
//!   approval notifications ([`Bus::publish_approval_request`],
//!   [`Bus::publish_approval_decision`] and their subscriptions).
//! - Typed KV stores: [`Leases`] (with [`LeaseKeeper`] for background
//!   renewal of one lease and [`LeaseSet`] for many, by one loop), [`Workers`], [`Quarantine`], [`Jobs`], [`Checkpoints`],
//!   [`Approvals`], all over [`TypedKv`].
//! - Every message is protobuf with a content-type header ([`codec`]) and
//!   carries the publisher's W3C trace context ([`trace`]).
//! - [`local_server::NatsServer`] runs a real `nats-server` on a loopback
//!   port for local stacks and tests; `testing` (cargo feature `testing`)
//!   holds the benchmarks' shared pieces.
//!
//! Subjects, streams and buckets are listed in [`subjects`] (and README.md).

pub mod codec;
pub mod config;
pub mod error;
pub mod jobs;
mod kv;
mod lease_set;
mod leases;
mod limits;
pub mod local_server;
mod messaging;
pub mod ownership;
pub mod permissions;
mod renewal;
pub mod reopen;
pub mod results;
mod stores;
pub mod subjects;
#[cfg(any(test, feature = "testing"))]
// Test support: a failed setup step panics, which fails the test or bench.
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod testing;
mod topology;
pub mod trace;
mod ttl_lease;

use std::sync::Arc;

use async_nats::jetstream;
use tokio::sync::watch;

pub use async_nats::HeaderMap;
/// File or memory storage of a stream ([`TopologyConfig::storage`]).
pub use async_nats::jetstream::stream::StorageType;
pub use codec::BusMessage;
pub use config::{BusConfig, TlsConfig};
pub use error::BusError;
pub use jobs::{Jobs, OwnerWrites};
pub use kv::{KvChange, KvWatch, TypedKv, Versioned};
pub use lease_set::LeaseSet;
pub use leases::{KeptLease, LeaseEvent, LeaseKeeper, LeaseRequest, LeaseWatch, Leases};
pub use messaging::{
    Delivery, DeliveryInfo, DeliveryStream, PendingPublish, PublishReceipt, Received,
    ReceivedStream, ReplayedEvent, ResultConsumer, ResultConsumerConfig, TaskConsumer,
    TaskConsumerConfig,
};
pub use mtswarm_proto::v1;
pub use ownership::{
    Fence, JobOwner, JobOwners, KeptOwnership, OwnerEvent, OwnerWatch, OwnershipError,
    OwnershipKeeper,
};
pub use reopen::{Backoff, reopen};
pub use results::{ResultQuery, ResultRecord, ResultsStore};
pub use stores::{
    Approvals, CheckpointSeal, Checkpoints, Quarantine, STANDING_APPROVAL_PREFIX, Workers,
};
pub use topology::{TopologyConfig, TopologyInfo};

/// State of the NATS connection as last reported by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Not connected yet (initial connect still retrying).
    Pending,
    /// Connected to a server.
    Connected,
    /// Lost; the client is reconnecting by itself.
    Disconnected,
    /// Closed for good (after `drain` or a fatal error).
    Closed,
}

/// One connection to NATS with JetStream. Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    state: watch::Receiver<ConnectionState>,
    name: Arc<str>,
    /// What [`Bus::ensure_topology`] last created, to re-create a stream or
    /// bucket that disappears while the process runs.
    topology: Arc<topology::Remembered>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("name", &self.name)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Bus {
    /// Connects according to `config`. With `retry_on_initial_connect` this
    /// returns at once and the client keeps trying in the background
    /// ([`Bus::wait_connected`] waits for it); otherwise it fails when no server
    /// answers. After a connection loss the client reconnects forever with
    /// exponential backoff; connection events are logged.
    pub async fn connect(config: BusConfig) -> Result<Bus, BusError> {
        if config.servers.is_empty() {
            return Err(BusError::InvalidConfig("no NATS server URL given".into()));
        }
        let servers: Vec<async_nats::ServerAddr> = config
            .servers
            .iter()
            .map(|url| {
                url.parse::<async_nats::ServerAddr>().map_err(|error| {
                    BusError::InvalidConfig(format!("NATS server URL {url:?}: {error}"))
                })
            })
            .collect::<Result<_, _>>()?;

        let (state_tx, state_rx) = watch::channel(ConnectionState::Pending);
        let initial_state_tx = state_tx.clone();
        let name: Arc<str> = Arc::from(config.name.as_str());
        let event_name = name.clone();
        let delay_config = config.clone();
        let mut options = async_nats::ConnectOptions::new()
            .name(&config.name)
            .connection_timeout(config.connect_timeout)
            .request_timeout(Some(config.request_timeout))
            .max_reconnects(None)
            .reconnect_delay_callback(move |attempt| delay_config.reconnect_delay(attempt))
            .event_callback(move |event| {
                let state_tx = state_tx.clone();
                let name = event_name.clone();
                async move {
                    log_event(&name, &event);
                    let state = match event {
                        async_nats::Event::Connected => Some(ConnectionState::Connected),
                        async_nats::Event::Disconnected => Some(ConnectionState::Disconnected),
                        async_nats::Event::Closed => Some(ConnectionState::Closed),
                        _ => None,
                    };
                    if let Some(state) = state {
                        state_tx.send_replace(state);
                    }
                }
            });
        if config.retry_on_initial_connect {
            options = options.retry_on_initial_connect();
        }
        if let Some(path) = &config.credentials_file {
            options =
                options
                    .credentials_file(path)
                    .await
                    .map_err(|source| BusError::Credentials {
                        path: path.clone(),
                        source,
                    })?;
        }
        if let Some(seed) = &config.nkey_seed {
            options = options.nkey(seed.clone());
        }
        if let Some(prefix) = config.inbox_prefix.as_ref().filter(|p| !p.is_empty()) {
            options = options.custom_inbox_prefix(prefix.clone());
        }
        if config.tls.require_tls {
            options = options.require_tls(true);
        }
        if let Some(ca) = &config.tls.ca_file {
            if !ca.is_file() {
                return Err(BusError::InvalidConfig(format!(
                    "TLS CA file {} does not exist",
                    ca.display()
                )));
            }
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &config.tls.client_cert {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }

        let client = options
            .connect(servers)
            .await
            .map_err(|source| BusError::Connect {
                servers: config.servers.join(","),
                source,
            })?;
        if client.connection_state() == async_nats::connection::State::Connected {
            // The Connected event callback may not have run yet.
            initial_state_tx.send_replace(ConnectionState::Connected);
        }
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.request_timeout)
            .max_ack_inflight(config.max_ack_inflight)
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(Bus {
            client,
            jetstream,
            state: state_rx,
            name,
            topology: Arc::default(),
        })
    }

    /// The underlying NATS client (for request/reply and anything not wrapped here).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// Connection state changes as reported by the client.
    pub fn connection_state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// True when the client is connected right now.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Waits until the client is connected, at most `timeout`.
    pub async fn wait_connected(&self, timeout: std::time::Duration) -> Result<(), BusError> {
        let mut state = self.state.clone();
        let wait = async {
            loop {
                if self.is_connected() {
                    return Ok(());
                }
                if state.changed().await.is_err() {
                    return Err(BusError::InvalidConfig("connection closed".into()));
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(BusError::Connect {
                servers: format!("{} (waited {timeout:?})", self.name),
                source: async_nats::ConnectError::new(async_nats::ConnectErrorKind::TimedOut),
            }),
        }
    }

    /// Drains subscriptions and closes the connection (graceful shutdown).
    pub async fn drain(&self) -> Result<(), BusError> {
        self.client
            .drain()
            .await
            .map_err(|source| connection_error("<drain>", source))
    }

    /// Flushes buffered publishes to the server.
    pub async fn flush(&self) -> Result<(), BusError> {
        self.client
            .flush()
            .await
            .map_err(|source| connection_error("<flush>", source))
    }
}

/// A connection-wide operation (`<drain>`, `<flush>`) that failed, reported
/// as a publish error on that pseudo-subject.
fn connection_error(operation: &str, source: impl Into<error::NatsSource>) -> BusError {
    BusError::Publish {
        subject: operation.into(),
        source: source.into(),
    }
}

fn log_event(name: &str, event: &async_nats::Event) {
    match event {
        async_nats::Event::Connected => tracing::info!(connection = name, "NATS connected"),
        async_nats::Event::Disconnected => {
            tracing::warn!(connection = name, "NATS disconnected; reconnecting")
        }
        async_nats::Event::Closed => tracing::warn!(connection = name, "NATS connection closed"),
        async_nats::Event::LameDuckMode => {
            tracing::warn!(connection = name, "NATS server entered lame duck mode")
        }
        async_nats::Event::Draining => {
            tracing::info!(connection = name, "NATS connection draining")
        }
        async_nats::Event::SlowConsumer(sid) => {
            tracing::warn!(connection = name, subscription = sid, "NATS slow consumer")
        }
        async_nats::Event::ServerError(error) => {
            tracing::error!(connection = name, %error, "NATS server error")
        }
        async_nats::Event::ClientError(error) => {
            tracing::error!(connection = name, %error, "NATS client error")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_configurations_are_clear_errors() {
        let mut config = BusConfig::new("nats://127.0.0.1:4222");
        config.servers.clear();
        let error = Bus::connect(config).await.expect_err("no servers");
        assert!(matches!(error, BusError::InvalidConfig(_)), "{error}");

        let error = Bus::connect(BusConfig::new("nats://[not a host"))
            .await
            .expect_err("bad url");
        assert!(error.to_string().contains("not a host"), "{error}");

        let mut config = BusConfig::new("tls://127.0.0.1:4222");
        config.tls.ca_file = Some("/nonexistent/ca.pem".into());
        let error = Bus::connect(config).await.expect_err("missing CA");
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");

        let mut config = BusConfig::new("nats://127.0.0.1:4222");
        config.credentials_file = Some("/nonexistent/user.creds".into());
        let error = Bus::connect(config).await.expect_err("missing creds");
        assert!(matches!(error, BusError::Credentials { .. }), "{error}");
    }
}
