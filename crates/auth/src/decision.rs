//! Approval decisions signed by the leader.
//!
//! Approval records move with sessions between workers, so every worker
//! identity may write the approvals bucket; NATS permissions alone cannot
//! tell a worker's forged "APPROVED" from the leader's decision. The leader
//! therefore signs every decision it makes (Ed25519, its dedicated decision
//! key, an nkey seed `mtswarm credentials` writes) over a canonical
//! encoding of the fields that matter, and a worker applies a decision,
//! from the decision subject or from the stored record alike, only when it
//! verifies against the leader's public key from its configuration.
//!
//! The key is not the leader's NATS nkey: that one signs whatever nonce a
//! NATS server sends, and a signature must never be obtainable that way.

use std::path::Path;

use mtswarm_bus::v1;

use crate::error::AuthError;
use crate::grant_memo::GrantMemo;

/// Domain separation: no other signature of this key can be mistaken for a
/// decision's.
const CONTEXT: &[u8] = b"mtswarm approval decision v2\0";

/// Why a decision's signature was refused.
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    /// The decision has no signature at all.
    #[error("approval decision {approval_id} carries no signature")]
    Unsigned {
        /// The approval the decision is for.
        approval_id: String,
    },
    /// The signature does not verify against the leader's key (forged,
    /// altered after signing, or signed by another key).
    #[error("approval decision {approval_id} is not signed by the leader key {public_key}")]
    Invalid {
        /// The approval the decision is for.
        approval_id: String,
        /// The leader public key (`N...`) it was checked against.
        public_key: String,
    },
    /// The signing key could not sign the decision.
    #[error("cannot sign approval decision {approval_id}: {reason}")]
    Sign {
        /// The approval the decision is for.
        approval_id: String,
        /// The signer's error.
        reason: String,
    },
}

/// The bytes a decision's signature covers: every field but the signature,
/// each length-prefixed so no two decisions encode alike.
pub fn canonical_decision(decision: &v1::ApprovalDecision) -> Vec<u8> {
    fn text(out: &mut Vec<u8>, value: &str) {
        out.extend_from_slice(&(value.len() as u64).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    let mut out = Vec::with_capacity(CONTEXT.len() + 256);
    out.extend_from_slice(CONTEXT);
    text(&mut out, &decision.approval_id);
    text(&mut out, &decision.job_id);
    text(&mut out, &decision.session_id);
    text(&mut out, &decision.call_id);
    out.extend_from_slice(&decision.verdict.to_be_bytes());
    text(&mut out, &decision.reason);
    text(&mut out, &decision.decided_by);
    match &decision.decided_at {
        Some(at) => {
            out.push(1);
            out.extend_from_slice(&at.seconds.to_be_bytes());
            out.extend_from_slice(&at.nanos.to_be_bytes());
        }
        None => out.push(0),
    }
    out.push(u8::from(decision.timed_out));
    // How far the decision reaches is signed too: a standing approval of
    // one tool must not be widened to another tool, agent or job.
    out.extend_from_slice(&decision.scope.to_be_bytes());
    text(&mut out, &decision.tool_name);
    text(&mut out, &decision.agent_id);
    text(&mut out, &decision.standing_approval_id);
    // The call itself: a decision applies only to the call whose
    // arguments and risk it names.
    text(&mut out, &decision.arguments_sha256);
    out.extend_from_slice(&decision.risk.to_be_bytes());
    out
}

/// The leader's decision key (private; only the leader holds it).
#[derive(Clone)]
pub struct DecisionSigner {
    pair: nkeys::KeyPair,
    /// The grants this key signed, shared with its verifiers.
    pub(crate) grants: GrantMemo,
}

impl std::fmt::Debug for DecisionSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DecisionSigner({})", self.pair.public_key())
    }
}

impl DecisionSigner {
    /// A fresh key.
    pub fn generate() -> Self {
        Self {
            pair: nkeys::KeyPair::new_server(),
            grants: GrantMemo::default(),
        }
    }

    /// Reads a decision key file (an nkey seed, as `mtswarm credentials`
    /// writes it).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            what: "decision key file",
            path: path.to_path_buf(),
            source,
        })?;
        let pair = nkeys::KeyPair::from_seed(text.trim()).map_err(|e| AuthError::Parse {
            what: "decision key file",
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            pair,
            grants: GrantMemo::default(),
        })
    }

    /// The seed (the key file's content; a secret).
    pub fn seed(&self) -> Result<String, AuthError> {
        self.pair.seed().map_err(|e| AuthError::Generate {
            what: "a decision key seed",
            reason: e.to_string(),
        })
    }

    /// The public key workers verify with (`N...`).
    pub fn public_key(&self) -> String {
        self.pair.public_key()
    }

    pub(crate) fn pair(&self) -> &nkeys::KeyPair {
        &self.pair
    }

    /// The verifier of this key's signatures; it knows the grants this
    /// signer signed, before and after, without verifying them.
    pub fn verifier(&self) -> DecisionVerifier {
        DecisionVerifier {
            public_key: self.public_key(),
            pair: self.pair.clone(),
            grants: self.grants.clone(),
        }
    }

    /// Sets `decision.signature` over the decision's other fields.
    pub fn sign(&self, decision: &mut v1::ApprovalDecision) -> Result<(), SignatureError> {
        let signature =
            self.pair
                .sign(&canonical_decision(decision))
                .map_err(|e| SignatureError::Sign {
                    approval_id: decision.approval_id.clone(),
                    reason: e.to_string(),
                })?;
        decision.signature = signature;
        Ok(())
    }
}

/// The leader's public decision key, as a worker holds it.
#[derive(Clone)]
pub struct DecisionVerifier {
    public_key: String,
    pair: nkeys::KeyPair,
    /// The grants known to carry this key's signature.
    pub(crate) grants: GrantMemo,
}

impl std::fmt::Debug for DecisionVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DecisionVerifier({})", self.public_key)
    }
}

impl DecisionVerifier {
    /// A verifier from the leader's public decision key (`N...`, as
    /// `mtswarm credentials` writes it to `decision.pub`).
    pub fn from_public_key(public_key: &str) -> Result<Self, AuthError> {
        let public_key = public_key.trim();
        let invalid = |reason: String| AuthError::InvalidIdentity {
            name: "leader decision key".into(),
            reason,
        };
        // A user nkey here would be the leader's NATS identity, which
        // never signs decisions: refuse the mix-up at start-up.
        if !public_key.starts_with('N') {
            return Err(invalid(format!(
                "{public_key:?} is not a decision public key (an nkey starting with N)"
            )));
        }
        let pair =
            nkeys::KeyPair::from_public_key(public_key).map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            public_key: public_key.to_string(),
            pair,
            grants: GrantMemo::default(),
        })
    }

    /// Reads a public key file (`decision.pub`).
    pub fn load(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
            what: "leader public key file",
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_public_key(&text)
    }

    pub(crate) fn pair(&self) -> &nkeys::KeyPair {
        &self.pair
    }

    /// The leader public key (`N...`) decisions are checked against.
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// Ok when `decision` carries this key's signature over its fields.
    pub fn verify(&self, decision: &v1::ApprovalDecision) -> Result<(), SignatureError> {
        if decision.signature.is_empty() {
            return Err(SignatureError::Unsigned {
                approval_id: decision.approval_id.clone(),
            });
        }
        self.pair
            .verify(&canonical_decision(decision), &decision.signature)
            .map_err(|_| SignatureError::Invalid {
                approval_id: decision.approval_id.clone(),
                public_key: self.public_key.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Tamper = Box<dyn Fn(&mut v1::ApprovalDecision)>;

    fn decision() -> v1::ApprovalDecision {
        v1::ApprovalDecision {
            approval_id: "ap-1".into(),
            job_id: "job-1".into(),
            session_id: "s-1".into(),
            call_id: "c-1".into(),
            verdict: v1::ApprovalVerdict::Deny as i32,
            reason: "no".into(),
            decided_by: "approver".into(),
            decided_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            }),
            timed_out: false,
            signature: Vec::new(),
            scope: v1::ApprovalScope::ToolForJob as i32,
            tool_name: "benchmark".into(),
            agent_id: "tuner-1".into(),
            standing_approval_id: String::new(),
            arguments_sha256: "ab".repeat(32),
            risk: v1::RiskLevel::Medium as i32,
        }
    }

    #[test]
    fn a_signed_decision_verifies_and_every_tampered_field_is_refused() {
        let signer = DecisionSigner::generate();
        let verifier = DecisionVerifier::from_public_key(&signer.public_key()).expect("public key");
        let mut signed = decision();
        signer.sign(&mut signed).expect("sign");
        verifier.verify(&signed).expect("genuine decision verifies");

        let tampered: Vec<(&str, Tamper)> = vec![
            ("approval_id", Box::new(|d| d.approval_id = "ap-2".into())),
            ("job_id", Box::new(|d| d.job_id = "job-2".into())),
            ("session_id", Box::new(|d| d.session_id = "s-2".into())),
            ("call_id", Box::new(|d| d.call_id = "c-2".into())),
            (
                "verdict",
                Box::new(|d| d.verdict = v1::ApprovalVerdict::Approve as i32),
            ),
            ("reason", Box::new(|d| d.reason = "yes".into())),
            ("decided_by", Box::new(|d| d.decided_by = "mallory".into())),
            ("decided_at", Box::new(|d| d.decided_at = None)),
            (
                "decided_at nanos",
                Box::new(|d| {
                    if let Some(at) = d.decided_at.as_mut() {
                        at.nanos += 1;
                    }
                }),
            ),
            ("timed_out", Box::new(|d| d.timed_out = true)),
            (
                "scope",
                Box::new(|d| d.scope = v1::ApprovalScope::ToolForAgent as i32),
            ),
            ("tool_name", Box::new(|d| d.tool_name = "shell".into())),
            ("agent_id", Box::new(|d| d.agent_id = "tuner-2".into())),
            (
                "standing_approval_id",
                Box::new(|d| d.standing_approval_id = "ap-9".into()),
            ),
            (
                "arguments_sha256",
                Box::new(|d| d.arguments_sha256 = "cd".repeat(32)),
            ),
            ("risk", Box::new(|d| d.risk = v1::RiskLevel::Low as i32)),
            ("signature", Box::new(|d| d.signature[0] ^= 1)),
            ("signature length", Box::new(|d| d.signature.truncate(63))),
        ];
        for (field, change) in tampered {
            let mut forged = signed.clone();
            change(&mut forged);
            let error = verifier.verify(&forged).expect_err(field);
            assert!(
                matches!(error, SignatureError::Invalid { ref approval_id, .. } if approval_id == &forged.approval_id),
                "{field}: {error}"
            );
        }

        let mut unsigned = signed.clone();
        unsigned.signature.clear();
        assert!(matches!(
            verifier.verify(&unsigned),
            Err(SignatureError::Unsigned { .. })
        ));
        // Another key's signature is refused too.
        let mut other = decision();
        DecisionSigner::generate().sign(&mut other).expect("sign");
        assert!(verifier.verify(&other).is_err());
    }

    #[test]
    fn fields_do_not_run_into_each_other() {
        let mut a = decision();
        a.job_id = "ab".into();
        a.session_id = "c".into();
        let mut b = decision();
        b.job_id = "a".into();
        b.session_id = "bc".into();
        assert_ne!(canonical_decision(&a), canonical_decision(&b));
    }

    #[test]
    fn keys_round_trip_through_their_files_and_wrong_keys_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let signer = DecisionSigner::generate();
        let seed_file = dir.path().join("decision.nk");
        std::fs::write(&seed_file, signer.seed().expect("seed")).expect("write");
        let pub_file = dir.path().join("decision.pub");
        std::fs::write(&pub_file, format!("{}\n", signer.public_key())).expect("write");
        let loaded = DecisionSigner::load(&seed_file).expect("seed file");
        let verifier = DecisionVerifier::load(&pub_file).expect("public key file");
        let mut signed = decision();
        loaded.sign(&mut signed).expect("sign");
        verifier.verify(&signed).expect("verifies");

        // A user nkey (a NATS identity) is not a decision key.
        let user = nkeys::KeyPair::new_user().public_key();
        assert!(DecisionVerifier::from_public_key(&user).is_err());
        assert!(DecisionVerifier::from_public_key("Nnot-a-key").is_err());
        std::fs::write(&seed_file, "junk").expect("write");
        assert!(matches!(
            DecisionSigner::load(&seed_file),
            Err(AuthError::Parse { .. })
        ));
    }
}
