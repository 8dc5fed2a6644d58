//! The client side: the bearer token a process presents and the CA it
//! trusts, turned into a tonic endpoint (TLS for `https://` URLs) and an
//! interceptor that adds the token to every call.

use std::path::Path;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Request, Status};

use crate::AuthError;
use crate::server::AUTHORIZATION;
use crate::tls::{install_crypto_provider, read_pem};

/// How a client authenticates: a token (absent: anonymous calls) and the
/// CA certificate that signed the server's (needed for `https://`).
#[derive(Clone, Default)]
pub struct ClientAuth {
    token: Option<MetadataValue<Ascii>>,
    ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClientAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientAuth")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca_pem.is_some())
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

    /// A bearer token will be sent with every call.
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// A CA certificate is set to verify `https://` servers (required for them).
    pub fn has_ca(&self) -> bool {
        self.ca_pem.is_some()
    }

    /// An endpoint for `url`, with TLS when it is `https://` (which then
    /// needs the CA), and the given connect timeout.
    pub fn endpoint(&self, url: &str, connect_timeout: Duration) -> Result<Endpoint, AuthError> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| AuthError::Tls(format!("{url:?} is not a URL: {e}")))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true);
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        let Some(ca) = &self.ca_pem else {
            return Err(AuthError::Tls(format!(
                "{url} uses TLS but no CA certificate is configured to check it"
            )));
        };
        install_crypto_provider();
        endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))
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
