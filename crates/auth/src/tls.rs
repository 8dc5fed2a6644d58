//! TLS settings of the gRPC servers, read from PEM files, on the one rustls
//! crypto provider of the workspace (aws-lc-rs).

use std::path::{Path, PathBuf};

use tonic::transport::{Identity as TlsIdentity, ServerTlsConfig};

use crate::error::AuthError;

/// Makes aws-lc-rs the process's rustls provider (idempotent). tonic,
/// async-nats and reqwest all build on it; installing it explicitly keeps a
/// TLS connection from depending on which crate happened to pick first.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

pub(crate) fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, AuthError> {
    let bytes = std::fs::read(path).map_err(|source| AuthError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
        return Err(AuthError::Parse {
            what,
            path: path.to_path_buf(),
            reason: "no PEM block".into(),
        });
    }
    Ok(bytes)
}

/// A server certificate chain and its key.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    cert_file: PathBuf,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.cert_file)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads a PEM certificate (chain) and its PEM private key.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, AuthError> {
        Ok(Self {
            cert_pem: read_pem("TLS certificate", cert_file)?,
            key_pem: read_pem("TLS private key", key_file)?,
            cert_file: cert_file.to_path_buf(),
        })
    }

    /// The tonic server setting.
    pub fn server_config(&self) -> ServerTlsConfig {
        install_crypto_provider();
        ServerTlsConfig::new().identity(TlsIdentity::from_pem(&self.cert_pem, &self.key_pem))
    }
}
