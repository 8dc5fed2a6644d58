//! The one error type of the auth crate; every variant names the file,
//! identity or setting involved.

use std::path::PathBuf;

/// Everything that can go wrong loading, checking or generating credentials.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A credential or configuration file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file holds, e.g. `"token file"` or `"identities file"`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },

    /// A generated credential or configuration file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why writing failed.
        #[source]
        source: std::io::Error,
    },

    /// A file was read but its content is not what it should be.
    #[error("{path} is not a valid {what}: {reason}")]
    Parse {
        /// What the file should hold, e.g. `"identities file"`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// An identity entry is unusable (empty or duplicate name or token, no role, ...).
    #[error("identity {name:?}: {reason}")]
    InvalidIdentity {
        /// The identity's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A role name that is not one of the known roles.
    #[error("unknown role {0:?} (known: submit, read, approve, admin, leader)")]
    UnknownRole(String),

    /// A model endpoint outside the worker daemon's allowlist.
    #[error(
        "model endpoint {0:?} is not in the daemon's allowlist (--model-endpoint / MTSWARM_MODEL_ENDPOINTS)"
    )]
    EndpointNotAllowed(String),

    /// An endpoint a credential must not be sent to: plain text, or a
    /// worker endpoint that is not `https://`.
    #[error("refusing to connect to {url}: {reason}")]
    InsecureEndpoint {
        /// The endpoint as given.
        url: String,
        /// Why it is refused and what would be accepted.
        reason: String,
    },

    /// A TLS certificate, key or setting cannot be used.
    #[error("invalid TLS setting: {0}")]
    Tls(String),

    /// A profile was asked for that the client configuration does not have.
    #[error("no profile {name:?} in the client configuration {path} (profiles: {known})")]
    UnknownProfile {
        /// The profile asked for (`--profile`, `MTSWARM_PROFILE` or the file's `profile`).
        name: String,
        /// The client configuration file.
        path: PathBuf,
        /// The profiles the file has, comma-separated (`none` when it has none).
        known: String,
    },

    /// Generating a key, certificate or token failed.
    #[error("cannot generate {what}: {reason}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
}
