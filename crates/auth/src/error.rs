//! The one error type of the auth crate; every variant names the file,
//! identity or setting involved.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path} is not a valid {what}: {reason}")]
    Parse {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },

    #[error("identity {name:?}: {reason}")]
    InvalidIdentity { name: String, reason: String },

    #[error("unknown role {0:?} (known: submit, approve, admin, leader)")]
    UnknownRole(String),

    #[error(
        "model endpoint {0:?} is not in the daemon's allowlist (--model-endpoint / MTSWARM_MODEL_ENDPOINTS)"
    )]
    EndpointNotAllowed(String),

    #[error("invalid TLS setting: {0}")]
    Tls(String),

    #[error("cannot generate {what}: {reason}")]
    Generate { what: &'static str, reason: String },
}
