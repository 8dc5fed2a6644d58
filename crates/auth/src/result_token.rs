//! Result tokens: the capability that makes a task result count.
//!
//! The leader derives one token per (job, task, attempt) with HMAC-SHA256
//! under a key only it holds and sends it inside the assignment, which NATS
//! permissions deliver only to the worker the task was placed on. The
//! worker returns it in the result; the leader recomputes it and drops a
//! result whose token does not match. A restarted leader with the same key
//! verifies the results of attempts its predecessor published.

use sha2::{Digest as _, Sha256};
use std::path::Path;

use crate::error::AuthError;

const BLOCK: usize = 64;

/// A leader's result key (32 bytes).
#[derive(Clone)]
pub struct ResultKey([u8; 32]);

impl std::fmt::Debug for ResultKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResultKey(<redacted>)")
    }
}

impl ResultKey {
    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        use rand::RngCore as _;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The key as 64 hex digits (the key file's content).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Reads a key file (64 hex digits).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            what: "result key file",
            path: path.to_path_buf(),
            source,
        })?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text.trim(), &mut bytes).map_err(|_| AuthError::Parse {
            what: "result key file",
            path: path.to_path_buf(),
            reason: "not 64 hex digits".into(),
        })?;
        Ok(Self(bytes))
    }

    fn hmac(&self, message: &[u8]) -> [u8; 32] {
        let mut key = [0u8; BLOCK];
        key[..32].copy_from_slice(&self.0);
        let mut inner = Sha256::new();
        inner.update(key.map(|b| b ^ 0x36));
        inner.update(message);
        let mut outer = Sha256::new();
        outer.update(key.map(|b| b ^ 0x5c));
        outer.update(inner.finalize());
        outer.finalize().into()
    }

    /// The token of one task attempt (32 hex digits).
    pub fn token(&self, job_id: &str, task_id: &str, attempt: u32) -> String {
        let message = format!("mtswarm-result\0{job_id}\0{task_id}\0{attempt}");
        hex::encode(&self.hmac(message.as_bytes())[..16])
    }

    /// True when `token` is the one of this attempt (compared in constant
    /// time).
    pub fn verify(&self, job_id: &str, task_id: &str, attempt: u32, token: &str) -> bool {
        let expected = self.token(job_id, task_id, attempt);
        expected.len() == token.len()
            && expected
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_a_known_vector_and_tokens_bind_every_field() {
        // HMAC-SHA256 with an all-zero (= empty) key of the empty message.
        let key = ResultKey::from_bytes([0u8; 32]);
        assert_eq!(
            hex::encode(key.hmac(b"")),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad"
        );
        let key = ResultKey::generate();
        let token = key.token("j", "t", 1);
        assert!(key.verify("j", "t", 1, &token));
        assert!(!key.verify("j", "t", 2, &token));
        assert!(!key.verify("j", "u", 1, &token));
        assert!(!key.verify("k", "t", 1, &token));
        assert!(!key.verify("j", "t", 1, ""));
        assert!(!ResultKey::generate().verify("j", "t", 1, &token));
    }
}
