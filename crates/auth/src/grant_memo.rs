//! The placement grants one decision key is known to have signed: those it
//! signed itself, and those a verifier of it already checked. A job's
//! measurement records carry their attempt's grant, a task has several
//! records, and the leader checks every record of a job of a thousand
//! agents; each check of the grant's signature is an Ed25519
//! verification, while the grant is one of the leader's own. A grant is
//! remembered by a SHA-256 digest of its signed bytes and its signature,
//! so only those exact bytes with that exact signature pass unchecked;
//! the memo belongs to one key, so the digest need not name it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use sha2::{Digest, Sha256};

/// Grants remembered at most; past it the memo starts again (it only saves
/// work, it never decides).
const CAPACITY: usize = 1 << 17;

/// Shared by a signer and the verifiers it hands out; cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct GrantMemo {
    known: Arc<Mutex<HashSet<[u8; 32]>>>,
}

impl GrantMemo {
    fn digest(signed_bytes: &[u8], signature: &[u8]) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update((signed_bytes.len() as u64).to_be_bytes());
        hasher.update(signed_bytes);
        hasher.update(signature);
        hasher.finalize().into()
    }

    fn known(&self) -> MutexGuard<'_, HashSet<[u8; 32]>> {
        // A panic elsewhere cannot leave the set half-written.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `signature` over `signed_bytes` was signed or verified
    /// under this memo's key before.
    pub(crate) fn contains(&self, signed_bytes: &[u8], signature: &[u8]) -> bool {
        self.known()
            .contains(&Self::digest(signed_bytes, signature))
    }

    /// Remembers a signature the key made, or one that verified.
    pub(crate) fn insert(&self, signed_bytes: &[u8], signature: &[u8]) {
        let digest = Self::digest(signed_bytes, signature);
        let mut known = self.known();
        if known.len() >= CAPACITY {
            known.clear();
        }
        known.insert(digest);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.known().len()
    }
}
