//! The client configuration file, like a kubeconfig: where the leader is,
//! the token to present and the CA to trust (and the NATS settings of the
//! commands that read the bus). `mtswarm up` writes it; every client
//! command reads it when its flags and environment say nothing else, so a
//! newcomer types nothing extra.
//!
//! Location: `$MTSWARM_CONFIG`, else `$HOME/.mtswarm/config.toml`. The file
//! holds a secret and is written with mode 0600.
//!
//! Like kubectl contexts, one file can name several deployments. The
//! top-level fields are the local stack (what `mtswarm up` writes and
//! removes); each `[profiles.NAME]` table is another deployment with the
//! same fields. `--profile` / `MTSWARM_PROFILE`, else the file's `profile`
//! key, selects one; flags and environment variables still override each
//! field of it.
//!
//! ```toml
//! profile = "farm"              # used when --profile says nothing
//! leader = "https://127.0.0.1:7700"
//!
//! [profiles.farm]
//! leader = "https://mtswarm.farm.example:7700"
//! token = "..."
//! ca_file = "/etc/mtswarm/ca.pem"
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::AuthError;

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

/// Environment variable selecting a profile of the client configuration.
pub const CLIENT_PROFILE_ENV: &str = "MTSWARM_PROFILE";

/// The client configuration file: the local stack's deployment and any
/// number of named ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientConfig {
    /// The profile used when the command line names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The local stack (`mtswarm up` writes and removes these fields).
    #[serde(flatten)]
    pub local: ClientProfile,
    /// Named deployments, `[profiles.NAME]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, ClientProfile>,
}

/// One deployment as a client sees it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientProfile {
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

impl std::fmt::Debug for ClientProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientProfile")
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

    /// The deployment `requested` names (`--profile` / `MTSWARM_PROFILE`),
    /// else the file's `profile`, else the local stack. `path` is the
    /// file's, for the error naming an unknown profile.
    pub fn select(
        &self,
        requested: Option<&str>,
        path: &Path,
    ) -> Result<&ClientProfile, AuthError> {
        let name = requested.map(str::trim).filter(|n| !n.is_empty()).or(self
            .profile
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty()));
        let Some(name) = name else {
            return Ok(&self.local);
        };
        self.profiles
            .get(name)
            .ok_or_else(|| AuthError::UnknownProfile {
                name: name.to_string(),
                path: path.to_path_buf(),
                known: if self.profiles.is_empty() {
                    "none".to_string()
                } else {
                    self.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                },
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
            local: ClientProfile {
                leader: Some("https://127.0.0.1:7700".into()),
                token: Some("secret-token".into()),
                ca_file: Some(dir.path().join("ca.pem")),
                ..Default::default()
            },
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

    #[test]
    fn profiles_select_a_deployment_and_unknown_ones_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(
            &path,
            r#"
profile = "farm"
leader = "https://127.0.0.1:7700"

[profiles.farm]
leader = "https://farm.example:7700"
token = "farm-token"

[profiles.lab]
leader = "http://lab.example:7700"
"#,
        )
        .expect("write");
        let config = ClientConfig::load(&path).expect("load").expect("present");
        let leader = |name: Option<&str>| {
            config
                .select(name, &path)
                .map(|p| p.leader.clone().unwrap_or_default())
        };
        // The file's `profile` is the default; a name on the command line wins.
        assert_eq!(leader(None).expect("farm"), "https://farm.example:7700");
        assert_eq!(leader(Some("lab")).expect("lab"), "http://lab.example:7700");
        let error = leader(Some("prod")).expect_err("unknown profile");
        let text = error.to_string();
        assert!(
            text.contains("\"prod\"") && text.contains("farm, lab"),
            "{text}"
        );
        // Saving keeps every profile.
        config.save(&path).expect("save");
        assert_eq!(
            ClientConfig::load(&path).expect("load"),
            Some(config.clone())
        );
        // Without a `profile` key the local stack's fields apply.
        let local = ClientConfig {
            profile: None,
            ..config.clone()
        };
        assert_eq!(
            local.select(None, &path).expect("local").leader.as_deref(),
            Some("https://127.0.0.1:7700")
        );
    }
}
