//! Identities and the table that maps a presented token to one.
//!
//! The server keeps only the SHA-256 digest of each token: looking a
//! presented token up by its digest needs no secret comparison, and the
//! identities file can be mounted without exposing any credential.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::AuthError;

use crate::role::Role;

/// An authenticated caller: a name (recorded as `submitted_by`,
/// `decided_by`) and its roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Name from the identities file (`anonymous` without authentication).
    pub name: String,
    /// What the caller may do.
    pub roles: BTreeSet<Role>,
    /// False for [`Identity::anonymous`]: the server checks no credential.
    pub authenticated: bool,
}

impl Identity {
    /// An authenticated identity with these roles.
    pub fn new(name: impl Into<String>, roles: impl IntoIterator<Item = Role>) -> Self {
        Self {
            name: name.into(),
            roles: roles.into_iter().collect(),
            authenticated: true,
        }
    }

    /// The caller of a server that runs without authentication: every role,
    /// recorded as `anonymous`.
    pub fn anonymous() -> Self {
        Self {
            authenticated: false,
            ..Self::new("anonymous", Role::ALL)
        }
    }

    /// The identity holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

/// One `[[identity]]` of an identities file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityEntry {
    /// Unique name of the caller (a person or a daemon).
    pub name: String,
    /// Role names (`submit`, `approve`, `admin`, `leader`); at least one.
    pub roles: Vec<String>,
    /// Hex SHA-256 of the identity's bearer token ([`token_digest`]).
    pub token_sha256: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct IdentitiesFile {
    #[serde(default)]
    identity: Vec<IdentityEntry>,
}

/// Hex SHA-256 of a token, as stored in identities files.
pub fn token_digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Token digest -> identity.
#[derive(Debug, Clone, Default)]
pub struct IdentityTable {
    by_digest: HashMap<[u8; 32], Identity>,
}

impl IdentityTable {
    /// A table of the given entries; names must be unique and non-empty,
    /// roles known and digests 64 hex digits.
    pub fn from_entries(entries: &[IdentityEntry]) -> Result<Self, AuthError> {
        let mut by_digest = HashMap::new();
        let mut names = BTreeSet::new();
        for entry in entries {
            let invalid = |reason: &str| AuthError::InvalidIdentity {
                name: entry.name.clone(),
                reason: reason.to_string(),
            };
            if entry.name.trim().is_empty() {
                return Err(invalid("the name is empty"));
            }
            if !names.insert(entry.name.clone()) {
                return Err(invalid("the name appears twice"));
            }
            let roles = entry
                .roles
                .iter()
                .map(|r| r.parse::<Role>())
                .collect::<Result<BTreeSet<_>, _>>()?;
            if roles.is_empty() {
                return Err(invalid("it has no role"));
            }
            let mut digest = [0u8; 32];
            hex::decode_to_slice(entry.token_sha256.trim(), &mut digest)
                .map_err(|_| invalid("token_sha256 is not 64 hex digits"))?;
            if by_digest
                .insert(digest, Identity::new(entry.name.clone(), roles))
                .is_some()
            {
                return Err(invalid("its token is also another identity's"));
            }
        }
        Ok(Self { by_digest })
    }

    /// Reads an identities file (TOML, `[[identity]]` entries).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            what: "identities file",
            path: path.to_path_buf(),
            source,
        })?;
        let file: IdentitiesFile = toml::from_str(&text).map_err(|e| AuthError::Parse {
            what: "identities file",
            path: path.to_path_buf(),
            reason: e.message().to_string(),
        })?;
        Self::from_entries(&file.identity)
    }

    /// The identities file text for `entries`.
    pub fn to_toml(entries: &[IdentityEntry]) -> String {
        let file = IdentitiesFile {
            identity: entries.to_vec(),
        };
        toml::to_string(&file).unwrap_or_default()
    }

    /// The identity a presented token belongs to.
    pub fn verify(&self, token: &str) -> Option<&Identity> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest)
    }

    /// Number of identities.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    /// The table has no identities (no token is accepted).
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, roles: &[&str], token: &str) -> IdentityEntry {
        IdentityEntry {
            name: name.into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            token_sha256: token_digest(token),
        }
    }

    #[test]
    fn a_token_maps_to_its_identity_and_nothing_else_does() {
        let table = IdentityTable::from_entries(&[
            entry("alice", &["submit"], "t-alice"),
            entry("ops", &["admin", "approve"], "t-ops"),
        ])
        .expect("valid");
        let alice = table.verify("t-alice").expect("alice");
        assert_eq!(alice.name, "alice");
        assert!(alice.has(Role::Submit) && !alice.has(Role::Admin));
        assert!(table.verify("t-alic").is_none());
        assert!(table.verify("").is_none());
    }

    #[test]
    fn bad_entries_are_refused_with_the_name() {
        let dup = IdentityTable::from_entries(&[
            entry("a", &["submit"], "x"),
            entry("a", &["submit"], "y"),
        ]);
        assert!(dup.unwrap_err().to_string().contains("\"a\""));
        let role = IdentityTable::from_entries(&[entry("b", &["root"], "x")]);
        assert!(role.unwrap_err().to_string().contains("root"));
        let mut short = entry("c", &["submit"], "x");
        short.token_sha256 = "abc".into();
        assert!(IdentityTable::from_entries(&[short]).is_err());
    }

    #[test]
    fn the_file_format_round_trips() {
        let entries = vec![entry("alice", &["submit", "approve"], "t")];
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("identities.toml");
        std::fs::write(&path, IdentityTable::to_toml(&entries)).expect("write");
        let table = IdentityTable::load(&path).expect("load");
        assert_eq!(table.verify("t").expect("found").name, "alice");
    }
}
