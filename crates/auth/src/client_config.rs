//! The client configuration file, like a kubeconfig: where the leader is,
//! the token to present and the CA to trust (and the NATS settings of the
//! commands that read the bus). `mtswarm up` writes it; every client
//! command reads it when its flags and environment say nothing else, so a
//! newcomer types nothing extra.
//!
//! Location: `$MTSWARM_CONFIG`, else `$HOME/.mtswarm/config.toml`. The file
//! holds a secret and is written with mode 0600.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::AuthError;

/// Environment variable naming the client configuration file.
pub const CLIENT_CONFIG_ENV: &str = "MTSWARM_CONFIG";

/// `$MTSWARM_CONFIG`, else `$HOME/.mtswarm/config.toml` (`None` without
/// either).
pub fn default_client_config_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(CLIENT_CONFIG_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".mtswarm").join("config.toml"))
}

/// One deployment as a client sees it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientConfig {
    /// Leader URL (`https://127.0.0.1:7700`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Bearer token presented to the leader. Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the leader's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// NATS URL, for the commands that read the bus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<String>,
    /// File holding the client's NATS nkey seed. Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_nkey_file: Option<PathBuf>,
    /// CA certificate (PEM) of the NATS server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats_ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("leader", &self.leader)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("nats", &self.nats)
            .field("nats_nkey_file", &self.nats_nkey_file)
            .field("nats_ca_file", &self.nats_ca_file)
            .finish()
    }
}

impl ClientConfig {
    /// Reads a client configuration; `Ok(None)` when the file does not exist.
    pub fn load(path: &Path) -> Result<Option<Self>, AuthError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(AuthError::Read {
                    what: "client configuration",
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        toml::from_str(&text)
            .map(Some)
            .map_err(|e| AuthError::Parse {
                what: "client configuration",
                path: path.to_path_buf(),
                reason: e.message().to_string(),
            })
    }

    /// Writes the file (mode 0600, directories created), replacing it whole.
    pub fn save(&self, path: &Path) -> Result<(), AuthError> {
        let text = toml::to_string(self).map_err(|e| AuthError::Generate {
            what: "client configuration",
            reason: e.to_string(),
        })?;
        write_secret(path, text.as_bytes())
    }
}

/// Writes `contents` to `path` with mode 0600 through a temporary file and a
/// rename, creating the parent directory (mode 0700) when needed.
pub(crate) fn write_secret(path: &Path, contents: &[u8]) -> Result<(), AuthError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let failed = |source| AuthError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(failed)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)
        .map_err(failed)?;
    file.write_all(contents).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    std::fs::rename(&temp, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn saved_configs_load_back_and_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("config.toml");
        assert!(ClientConfig::load(&path).expect("absent is fine").is_none());
        let config = ClientConfig {
            leader: Some("https://127.0.0.1:7700".into()),
            token: Some("secret-token".into()),
            ca_file: Some(dir.path().join("ca.pem")),
            ..Default::default()
        };
        config.save(&path).expect("save");
        assert_eq!(
            ClientConfig::load(&path).expect("load"),
            Some(config.clone())
        );
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!format!("{config:?}").contains("secret-token"));
    }
}
