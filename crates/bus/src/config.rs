//! Connection settings for NATS, shared by the leader, worker daemons and the
//! CLI. Security (nkeys/creds, TLS) is configurable on every client because
//! server permissions confine each identity to its subjects.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// TLS settings (rustls, aws-lc-rs provider).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// Refuse to connect without TLS.
    pub require_tls: bool,
    /// PEM file with the CA certificate(s) that signed the server certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for servers that verify clients.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// How to reach and authenticate to NATS.
#[derive(Clone, PartialEq, Eq)]
pub struct BusConfig {
    /// Server URLs (`nats://host:4222`, `tls://host:4222`); at least one.
    pub servers: Vec<String>,
    /// Connection name shown by the server (`nats server report connections`).
    pub name: String,
    /// `.creds` file (JWT + nkey seed) for decentralized auth.
    pub credentials_file: Option<PathBuf>,
    /// Nkey seed (`SU...`) for nkey auth. Secret: never logged.
    pub nkey_seed: Option<String>,
    /// TLS settings: CA to trust, client certificate, whether TLS is required.
    pub tls: TlsConfig,
    /// Prefix of this client's reply subjects (default `_INBOX`). An
    /// identity confined to its own prefix (`_INBOX_<worker>`) cannot read
    /// the replies other clients get (KV reads, stream acks).
    pub inbox_prefix: Option<String>,
    /// Timeout of one TCP/TLS connection attempt.
    pub connect_timeout: Duration,
    /// Timeout of requests, JetStream API calls and publish acks.
    pub request_timeout: Duration,
    /// Keep retrying when the server is not up yet at start (instead of failing).
    pub retry_on_initial_connect: bool,
    /// First reconnect delay; doubles per failed attempt up to `reconnect_max_delay`.
    pub reconnect_base_delay: Duration,
    /// Upper bound of the reconnect delay.
    pub reconnect_max_delay: Duration,
    /// Unacknowledged JetStream publishes allowed in flight per connection
    /// (pipelined publishes wait for a slot beyond this).
    pub max_ack_inflight: usize,
}

impl BusConfig {
    /// Defaults for one server URL: reconnect forever with 100 ms .. 2 s backoff,
    /// retry on initial connect, 5 s connect and 10 s request timeouts.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            servers: vec![url.into()],
            name: "mtswarm".to_string(),
            credentials_file: None,
            nkey_seed: None,
            tls: TlsConfig::default(),
            inbox_prefix: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_on_initial_connect: true,
            reconnect_base_delay: Duration::from_millis(100),
            reconnect_max_delay: Duration::from_secs(2),
            max_ack_inflight: 16_384,
        }
    }

    /// Sets the connection name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Delay before reconnect attempt number `attempt` (0-based): exponential
    /// from `reconnect_base_delay`, capped at `reconnect_max_delay`.
    pub fn reconnect_delay(&self, attempt: usize) -> Duration {
        let factor = 1u32 << attempt.min(16);
        self.reconnect_base_delay
            .saturating_mul(factor)
            .min(self.reconnect_max_delay)
    }
}

impl fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BusConfig")
            .field("servers", &self.servers)
            .field("name", &self.name)
            .field("credentials_file", &self.credentials_file)
            .field("nkey_seed", &self.nkey_seed.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry_on_initial_connect", &self.retry_on_initial_connect)
            .field("reconnect_base_delay", &self.reconnect_base_delay)
            .field("reconnect_max_delay", &self.reconnect_max_delay)
            .field("max_ack_inflight", &self.max_ack_inflight)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delay_grows_and_is_capped() {
        let config = BusConfig::new("nats://127.0.0.1:4222");
        assert_eq!(config.reconnect_delay(0), Duration::from_millis(100));
        assert_eq!(config.reconnect_delay(1), Duration::from_millis(200));
        assert_eq!(config.reconnect_delay(3), Duration::from_millis(800));
        assert_eq!(config.reconnect_delay(10), Duration::from_secs(2));
        assert_eq!(config.reconnect_delay(usize::MAX), Duration::from_secs(2));
    }

    #[test]
    fn debug_output_redacts_the_nkey_seed() {
        let mut config = BusConfig::new("nats://127.0.0.1:4222");
        config.nkey_seed = Some("SUAEXAMPLESEEDSECRET".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("SUAEXAMPLESEEDSECRET"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }
}
