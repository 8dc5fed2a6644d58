//! What one gRPC server enforces: the identities it accepts and the TLS
//! certificate it serves with. Both daemons take one of these in their
//! configuration; the default (nothing) is only for library tests.

use std::path::Path;
use std::sync::Arc;

use tonic::transport::Server;

use crate::error::AuthError;

use crate::identity::IdentityTable;

use crate::server::Authenticator;

use crate::tls::ServerTls;

/// Identities and TLS of one gRPC server; the default accepts anonymous
/// plaintext callers.
#[derive(Debug, Clone, Default)]
pub struct ServerSecurity {
    /// Accepted identities; `None` = every caller is anonymous.
    pub identities: Option<Arc<IdentityTable>>,
    /// Certificate and key; `None` = plaintext HTTP/2.
    pub tls: Option<ServerTls>,
}

impl ServerSecurity {
    /// Loads the identities file and, when both are given, the certificate
    /// and key.
    pub fn load(
        identities_file: Option<&Path>,
        tls: Option<(&Path, &Path)>,
    ) -> Result<Self, AuthError> {
        let identities = identities_file
            .map(IdentityTable::load)
            .transpose()?
            .map(Arc::new);
        let tls = tls
            .map(|(cert, key)| ServerTls::load(cert, key))
            .transpose()?;
        Ok(Self { identities, tls })
    }

    /// The interceptor for this server's services.
    pub fn authenticator(&self) -> Authenticator {
        Authenticator::from_table(self.identities.clone())
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// A server builder with TLS applied.
    pub fn server_builder(&self) -> Result<Server, AuthError> {
        let builder = Server::builder();
        match &self.tls {
            Some(tls) => builder
                .tls_config(tls.server_config())
                .map_err(|e| AuthError::Tls(e.to_string())),
            None => Ok(builder),
        }
    }
}
