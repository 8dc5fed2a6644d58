//! The client side: the bearer token a process presents and the CA it
//! trusts, turned into a tonic endpoint (TLS for `https://` URLs) and an
//! interceptor that adds the token to every call.
//!
//! A token never travels in clear text unless the caller said so
//! ([`ClientAuth::allow_plaintext_token`]): an `http://` endpoint with a
//! token is refused. The leader's calls to worker daemons go further
//! ([`ClientAuth::worker_endpoint`]): the endpoint must be `https://` and
//! its certificate must name the worker's own identity, whatever URL the
//! worker's registration gives.

use std::path::Path;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::error::AuthError;
use crate::server::AUTHORIZATION;
use crate::tls::{install_crypto_provider, read_pem};

/// How a client authenticates: a token (absent: anonymous calls) and the
/// CA certificate that signed the server's (needed for `https://`).
#[derive(Clone, Default)]
pub struct ClientAuth {
    token: Option<MetadataValue<Ascii>>,
    ca_pem: Option<Vec<u8>>,
    /// The caller accepted sending the token over plain `http://`.
    plaintext_token: bool,
}

/// The name a worker daemon's certificate is issued for (its only DNS
/// name): `<worker id>.worker.mtswarm`, lowercase. The leader checks a
/// worker's certificate against this name, not against the host of the
/// endpoint the worker registered, so a worker cannot send the leader (and
/// its token) to an endpoint that is not its own.
pub fn worker_tls_name(worker_id: &str) -> String {
    format!("{}.worker.mtswarm", worker_id.to_ascii_lowercase())
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca_pem.is_some())
            .field("plaintext_token", &self.plaintext_token)
            .finish()
    }
}

impl ClientAuth {
    /// No token, no CA: plain `http://` and anonymous calls.
    pub fn none() -> Self {
        Self::default()
    }

    /// Presents `token` on every call.
    pub fn with_token(mut self, token: &str) -> Result<Self, AuthError> {
        let token = token.trim();
        let value = format!("Bearer {token}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| AuthError::Tls("a token must be printable ASCII".into()))?;
        self.token = (!token.is_empty()).then_some(value);
        Ok(self)
    }

    /// Reads the token from a file (its whole content, trimmed).
    pub fn with_token_file(self, path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            what: "token file",
            path: path.to_path_buf(),
            source,
        })?;
        self.with_token(&text)
    }

    /// Trusts the CA certificate(s) of a PEM file for `https://` servers.
    pub fn with_ca_file(mut self, path: &Path) -> Result<Self, AuthError> {
        self.ca_pem = Some(read_pem("CA certificate", path)?);
        Ok(self)
    }

    /// Trusts the CA certificate(s) of PEM text.
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Allows sending the token over plain `http://` (anyone on the path
    /// can read it and act as this identity); refused otherwise.
    pub fn allow_plaintext_token(mut self, allow: bool) -> Self {
        self.plaintext_token = allow;
        self
    }

    /// A bearer token will be sent with every call.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// A CA certificate is set to verify `https://` servers (required for them).
    pub fn has_ca(&self) -> bool {
        self.ca_pem.is_some()
    }

    /// An endpoint for `url`, with TLS when it is `https://` (which then
    /// needs the CA), and the given connect timeout. A token over plain
    /// `http://` is refused unless [`ClientAuth::allow_plaintext_token`].
    pub fn endpoint(&self, url: &str, connect_timeout: Duration) -> Result<Endpoint, AuthError> {
        self.tls_endpoint(url, connect_timeout, None)
    }

    /// The endpoint of worker `worker_id` at `url` (its registration's),
    /// for the leader's calls. With a token or a CA configured, `url` must
    /// be `https://` and the server's certificate must be issued for
    /// [`worker_tls_name`] of `worker_id`; with neither (a deployment
    /// without credentials) nothing secret is sent and `http://` is fine.
    pub fn worker_endpoint(
        &self,
        worker_id: &str,
        url: &str,
        connect_timeout: Duration,
    ) -> Result<Endpoint, AuthError> {
        if self.token.is_none() && self.ca_pem.is_none() {
            return self.tls_endpoint(url, connect_timeout, None);
        }
        if !url.starts_with("https://") {
            return Err(AuthError::InsecureEndpoint {
                url: url.to_string(),
                reason: format!(
                    "worker {worker_id} registered an endpoint without TLS; the leader calls workers only over https with a certificate for {}",
                    worker_tls_name(worker_id)
                ),
            });
        }
        self.tls_endpoint(url, connect_timeout, Some(worker_tls_name(worker_id)))
    }

    fn tls_endpoint(
        &self,
        url: &str,
        connect_timeout: Duration,
        server_name: Option<String>,
    ) -> Result<Endpoint, AuthError> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| AuthError::Tls(format!("{url:?} is not a URL: {e}")))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true);
        if !url.starts_with("https://") {
            if self.token.is_some() && !self.plaintext_token {
                return Err(AuthError::InsecureEndpoint {
                    url: url.to_string(),
                    reason: "the bearer token would travel in clear text; use the https:// address (or allow plain text explicitly)".into(),
                });
            }
            return Ok(endpoint);
        }
        let Some(ca) = &self.ca_pem else {
            return Err(AuthError::Tls(format!(
                "{url} uses TLS but no CA certificate is configured to check it"
            )));
        };
        install_crypto_provider();
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(name) = server_name {
            tls = tls.domain_name(name);
        }
        endpoint
            .tls_config(tls)
            .map_err(|e| AuthError::Tls(format!("TLS for {url}: {e}")))
    }

    /// An interceptor that adds the token, then runs `inner`.
    pub fn interceptor<I>(&self, inner: I) -> BearerInterceptor<I> {
        BearerInterceptor {
            token: self.token.clone(),
            inner,
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call, then runs the
/// wrapped interceptor (e.g. trace-context injection).
#[derive(Clone)]
pub struct BearerInterceptor<I> {
    token: Option<MetadataValue<Ascii>>,
    inner: I,
}

impl<I> std::fmt::Debug for BearerInterceptor<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BearerInterceptor").finish_non_exhaustive()
    }
}

impl<I: tonic::service::Interceptor> tonic::service::Interceptor for BearerInterceptor<I> {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.token {
            request.metadata_mut().insert(AUTHORIZATION, token.clone());
        }
        self.inner.call(request)
    }
}
