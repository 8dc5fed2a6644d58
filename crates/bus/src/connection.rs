//! The one connection a process keeps to NATS: connecting (servers,
//! credentials, TLS, reconnect backoff), its state as the client reports
//! it, and the JetStream context every typed store and message rides on.
//! Each store and message kind adds its own `impl Bus` block in its module.

use std::sync::Arc;

use async_nats::jetstream;
use tokio::sync::watch;

use crate::config::BusConfig;
use crate::config::TopologyConfig;
use crate::error::{BusError, NatsSource};

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

/// The topology a [`Bus`] created, and when its last re-creation started.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    pub(crate) config: std::sync::Mutex<Option<TopologyConfig>>,
    /// The shape this client works with (record limits, the measurements
    /// stream): the one ensured or adopted last.
    pub(crate) in_use: std::sync::Mutex<Option<TopologyConfig>>,
    pub(crate) last_recovery: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// One connection to NATS with JetStream. Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub struct Bus {
    pub(crate) client: async_nats::Client,
    pub(crate) jetstream: jetstream::Context,
    state: watch::Receiver<ConnectionState>,
    name: Arc<str>,
    /// What [`Bus::ensure_topology`] last created, to re-create a stream or
    /// bucket that disappears while the process runs.
    pub(crate) topology: Arc<Remembered>,
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
fn connection_error(operation: &str, source: impl Into<NatsSource>) -> BusError {
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
    use crate::config::BusConfig;

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
