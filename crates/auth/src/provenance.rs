//! Provenance: who produced a record that counts, and for which placement.
//!
//! A farm runs a worker daemon on every board host, so one host taken
//! over must not be able to speak for another. Two signatures make every
//! record that counts (a measurement, a checkpoint, an approval request)
//! bound to its producer and to what it was placed for:
//!
//! - **The leader's grant.** When the leader places a task attempt it
//!   signs a [`v1::PlacementGrant`] with its decision key: job, task,
//!   attempt, agent, session, worker, slice and the worker's record key as
//!   the worker's own registration names it (only that worker's NATS
//!   identity may write its registration). The grant travels in the
//!   assignment, on the worker's own task subject.
//! - **The worker's record signature.** Each worker daemon signs what it
//!   produces for that attempt with its record key ([`WorkerKey`], an
//!   Ed25519 nkey derived from its NATS seed, so it survives restarts but
//!   never signs a NATS nonce itself).
//!
//! Whoever holds the leader's public key can then check a record alone: the
//! grant is the leader's, it names the record's job, task, attempt and
//! session, and the record's signature is by the key the grant names. A
//! worker can still lie, but only about its own slices' work.
//!
//! Each kind of record is signed under its own context ([`RecordKind`]), so
//! no signature of one kind passes for another.

use mtswarm_bus::v1;
use prost::Message as _;
use sha2::{Digest as _, Sha256};

use crate::decision::{DecisionSigner, DecisionVerifier};

use crate::error::AuthError;

mod batch;
mod signed;

use signed::{WorkerSigned as _, verify_worker_signed};

/// Domain separation of the leader's grants.
const GRANT_CONTEXT: &[u8] = b"mtswarm placement grant v1\0";
/// Domain separation of a worker record key's derivation from a NATS seed.
const DERIVE_CONTEXT: &[u8] = b"mtswarm worker record key v1\0";

/// What a record signature covers; each kind is signed under its own
/// context so that no signature of one kind passes for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A measurement record (its stored JSON, byte for byte).
    Measurement,
    /// A session checkpoint (its encoding without the signature).
    Checkpoint,
    /// An approval request (its encoding without the signature).
    ApprovalRequest,
    /// A task assignment (only ever checked for its grant, never signed
    /// by a worker).
    Assignment,
}

impl RecordKind {
    fn context(self) -> &'static [u8] {
        match self {
            RecordKind::Measurement => b"mtswarm measurement record v1\0",
            RecordKind::Checkpoint => b"mtswarm session checkpoint v1\0",
            RecordKind::ApprovalRequest => b"mtswarm approval request v1\0",
            RecordKind::Assignment => b"mtswarm task assignment v1\0",
        }
    }

    fn name(self) -> &'static str {
        match self {
            RecordKind::Measurement => "measurement record",
            RecordKind::Checkpoint => "checkpoint",
            RecordKind::ApprovalRequest => "approval request",
            RecordKind::Assignment => "task assignment",
        }
    }

    fn message(self, bytes: &[u8]) -> Vec<u8> {
        let context = self.context();
        let mut message = Vec::with_capacity(context.len() + bytes.len());
        message.extend_from_slice(context);
        message.extend_from_slice(bytes);
        message
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a record's provenance was refused. Every variant names the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvenanceError {
    /// The record carries no placement grant.
    #[error("{kind} {id} carries no placement grant")]
    NoGrant {
        /// What the record is.
        kind: RecordKind,
        /// The record's id (approval id, session id, record id).
        id: String,
    },
    /// The grant is not signed by the leader key.
    #[error("{kind} {id}: its placement grant is not signed by the leader key {leader_key}")]
    GrantNotSigned {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
        /// The leader public key it was checked against.
        leader_key: String,
    },
    /// The grant places another job, task, attempt, agent or session than
    /// the record names.
    #[error(
        "{kind} {id}: its placement grant names another {field} ({granted:?}, the record says {claimed:?})"
    )]
    GrantMismatch {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
        /// The field that differs.
        field: &'static str,
        /// What the grant says.
        granted: String,
        /// What the record says.
        claimed: String,
    },
    /// The record carries no signature.
    #[error("{kind} {id} is not signed")]
    Unsigned {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
    },
    /// The signature does not verify against the key it should be by.
    #[error("{kind} {id} is not signed by {signer} (key {key})")]
    BadSignature {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
        /// Whose key it was checked against (a worker id, or `the leader`).
        signer: String,
        /// The public key.
        key: String,
    },
    /// The key the grant names is not a worker record key.
    #[error("{kind} {id}: {key:?} is not a worker record key (an nkey starting with C)")]
    BadKey {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
        /// The key as given.
        key: String,
    },
    /// The leader's key could not sign a grant.
    #[error("cannot sign the placement grant of task {task_id} attempt {attempt}: {reason}")]
    SignGrant {
        /// The task placed.
        task_id: String,
        /// The attempt placed.
        attempt: u32,
        /// The signer's error.
        reason: String,
    },
    /// The key could not sign.
    #[error("cannot sign {kind} {id}: {reason}")]
    Sign {
        /// What the record is.
        kind: RecordKind,
        /// The record's id.
        id: String,
        /// The signer's error.
        reason: String,
    },
}

/// A worker daemon's record key (private; only that daemon holds it).
#[derive(Clone)]
pub struct WorkerKey {
    pair: nkeys::KeyPair,
}

impl std::fmt::Debug for WorkerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WorkerKey({})", self.pair.public_key())
    }
}

impl WorkerKey {
    /// A fresh key (a daemon without a NATS seed: it changes on restart).
    pub fn generate() -> Self {
        Self {
            pair: nkeys::KeyPair::new(nkeys::KeyPairType::Cluster),
        }
    }

    /// The key derived from the daemon's NATS nkey seed: the same on every
    /// start with the same credential, never the NATS key itself (that one
    /// signs whatever nonce a server sends).
    pub fn derive(nats_seed: &str) -> Result<Self, AuthError> {
        let (_, raw) =
            nkeys::decode_seed(nats_seed.trim()).map_err(|e| AuthError::InvalidIdentity {
                name: "worker record key".into(),
                reason: format!("the NATS seed does not decode: {e}"),
            })?;
        let mut hash = Sha256::new();
        hash.update(DERIVE_CONTEXT);
        hash.update(raw);
        let derived: [u8; 32] = hash.finalize().into();
        let pair =
            nkeys::KeyPair::new_from_raw(nkeys::KeyPairType::Cluster, derived).map_err(|e| {
                AuthError::Generate {
                    what: "a worker record key",
                    reason: e.to_string(),
                }
            })?;
        Ok(Self { pair })
    }

    /// The public key (`C...`) the daemon registers.
    pub fn public_key(&self) -> String {
        self.pair.public_key()
    }

    /// The signature of `bytes` as a record of `kind`; `id` names the
    /// record in the error.
    pub fn sign(
        &self,
        kind: RecordKind,
        id: &str,
        bytes: &[u8],
    ) -> Result<Vec<u8>, ProvenanceError> {
        self.pair
            .sign(&kind.message(bytes))
            .map_err(|e| ProvenanceError::Sign {
                kind,
                id: id.to_string(),
                reason: e.to_string(),
            })
    }
}

/// Checks that `signature` is `worker_key`'s over `bytes` as a record of
/// `kind`; `signer` names the key's owner in the error.
pub fn verify_record_signature(
    worker_key: &str,
    signer: &str,
    kind: RecordKind,
    id: &str,
    bytes: &[u8],
    signature: &[u8],
) -> Result<(), ProvenanceError> {
    if signature.is_empty() {
        return Err(ProvenanceError::Unsigned {
            kind,
            id: id.to_string(),
        });
    }
    if !worker_key.starts_with('C') {
        return Err(ProvenanceError::BadKey {
            kind,
            id: id.to_string(),
            key: worker_key.to_string(),
        });
    }
    let bad = || ProvenanceError::BadSignature {
        kind,
        id: id.to_string(),
        signer: signer.to_string(),
        key: worker_key.to_string(),
    };
    let pair =
        nkeys::KeyPair::from_public_key(worker_key).map_err(|_| ProvenanceError::BadKey {
            kind,
            id: id.to_string(),
            key: worker_key.to_string(),
        })?;
    pair.verify(&kind.message(bytes), signature)
        .map_err(|_| bad())
}

/// The bytes a grant's signature covers: every field but the signature,
/// each length-prefixed.
fn canonical_grant(grant: &v1::PlacementGrant) -> Vec<u8> {
    let mut out = Vec::with_capacity(GRANT_CONTEXT.len() + 256);
    out.extend_from_slice(GRANT_CONTEXT);
    for text in [&grant.job_id, &grant.task_id] {
        push_text(&mut out, text);
    }
    out.extend_from_slice(&grant.attempt.to_be_bytes());
    for text in [
        &grant.agent_id,
        &grant.session_id,
        &grant.worker_id,
        &grant.slice_id,
        &grant.worker_key,
    ] {
        push_text(&mut out, text);
    }
    out
}

pub(crate) fn push_text(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u64).to_be_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// The (unsigned) grant of `assignment` for the worker whose record key is
/// `worker_key`.
pub fn grant_for(assignment: &v1::TaskAssignment, worker_key: &str) -> v1::PlacementGrant {
    v1::PlacementGrant {
        job_id: assignment.job_id.clone(),
        task_id: assignment.task_id.clone(),
        attempt: assignment.attempt,
        agent_id: assignment.agent_id.clone(),
        session_id: assignment.session_id.clone(),
        worker_id: assignment.worker_id.clone(),
        slice_id: assignment.slice_id.clone(),
        worker_key: worker_key.to_string(),
        signature: Vec::new(),
    }
}

impl DecisionSigner {
    /// Signs a placement grant (sets `grant.signature`).
    pub fn sign_grant(&self, grant: &mut v1::PlacementGrant) -> Result<(), ProvenanceError> {
        let signed = canonical_grant(grant);
        grant.signature = self
            .pair()
            .sign(&signed)
            .map_err(|e| ProvenanceError::SignGrant {
                task_id: grant.task_id.clone(),
                attempt: grant.attempt,
                reason: e.to_string(),
            })?;
        self.grants.insert(&signed, &grant.signature);
        Ok(())
    }

    /// Signs the leader loop's own approval request (it has no grant).
    pub fn sign_own_request(
        &self,
        request: &mut v1::ApprovalRequest,
    ) -> Result<(), ProvenanceError> {
        request.grant = None;
        request.signature = Vec::new();
        let bytes = RecordKind::ApprovalRequest.message(&request.encode_to_vec());
        request.signature = self
            .pair()
            .sign(&bytes)
            .map_err(|e| ProvenanceError::Sign {
                kind: RecordKind::ApprovalRequest,
                id: request.approval_id.clone(),
                reason: e.to_string(),
            })?;
        Ok(())
    }
}

impl DecisionVerifier {
    /// Checks that `grant` carries the leader's signature; `kind` and `id`
    /// name the record it came with. A grant this key's signer signed, or
    /// one this verifier checked before, passes without verifying the
    /// signature again (`crate::grant_memo`).
    pub fn verify_grant(
        &self,
        grant: &v1::PlacementGrant,
        kind: RecordKind,
        id: &str,
    ) -> Result<(), ProvenanceError> {
        let signed = canonical_grant(grant);
        if self.grants.contains(&signed, &grant.signature) {
            return Ok(());
        }
        self.pair().verify(&signed, &grant.signature).map_err(|_| {
            ProvenanceError::GrantNotSigned {
                kind,
                id: id.to_string(),
                leader_key: self.public_key().to_string(),
            }
        })?;
        self.grants.insert(&signed, &grant.signature);
        Ok(())
    }

    /// Checks a checkpoint: the leader's grant names its job, session,
    /// agent, task and attempt, and the worker the grant names signed it.
    pub fn verify_checkpoint(
        &self,
        checkpoint: &v1::SessionCheckpoint,
    ) -> Result<(), ProvenanceError> {
        let kind = RecordKind::Checkpoint;
        let id = &checkpoint.session_id;
        let grant = checkpoint
            .grant
            .as_ref()
            .ok_or_else(|| ProvenanceError::NoGrant {
                kind,
                id: id.clone(),
            })?;
        self.verify_grant(grant, kind, id)?;
        let attempt = checkpoint.attempt.to_string();
        let granted_attempt = grant.attempt.to_string();
        for (field, granted, claimed) in [
            ("job", &grant.job_id, &checkpoint.job_id),
            ("session", &grant.session_id, &checkpoint.session_id),
            ("agent", &grant.agent_id, &checkpoint.agent_id),
            ("task", &grant.task_id, &checkpoint.task_id),
            ("attempt", &granted_attempt, &attempt),
        ] {
            same(kind, id, field, granted, claimed)?;
        }
        verify_worker_signed(grant, checkpoint)
    }

    /// Checks an approval request: a worker's is signed by the worker its
    /// grant names, and the grant (the leader's) names the request's job,
    /// agent and session; the leader loop's own (no grant) is signed by
    /// the leader key.
    pub fn verify_approval_request(
        &self,
        request: &v1::ApprovalRequest,
    ) -> Result<(), ProvenanceError> {
        let kind = RecordKind::ApprovalRequest;
        let id = &request.approval_id;
        let Some(grant) = &request.grant else {
            if request.signature.is_empty() {
                return Err(ProvenanceError::NoGrant {
                    kind,
                    id: id.clone(),
                });
            }
            return self
                .pair()
                .verify(&kind.message(&request.unsigned_bytes()), &request.signature)
                .map_err(|_| ProvenanceError::BadSignature {
                    kind,
                    id: id.clone(),
                    signer: "the leader".into(),
                    key: self.public_key().to_string(),
                });
        };
        self.verify_grant(grant, kind, id)?;
        for (field, granted, claimed) in [
            ("job", &grant.job_id, &request.job_id),
            ("agent", &grant.agent_id, &request.agent_id),
            ("session", &grant.session_id, &request.session_id),
        ] {
            same(kind, id, field, granted, claimed)?;
        }
        verify_worker_signed(grant, request)
    }
}

impl DecisionVerifier {
    /// Checks a stored measurement record: it carries the leader's grant,
    /// the grant names the record's job, task, attempt, session, worker
    /// and slice, and the granted worker signed the stored bytes.
    pub fn verify_measurement(
        &self,
        signed: &mtswarm_bus::results::SignedRecord,
    ) -> Result<(), ProvenanceError> {
        let grant = self.granted_measurement(signed)?;
        verify_record_signature(
            &grant.worker_key,
            &grant.worker_id,
            RecordKind::Measurement,
            &signed.record.record_id,
            &signed.payload,
            signed.signature.as_deref().unwrap_or_default(),
        )
    }

    /// Everything [`DecisionVerifier::verify_measurement`] checks but the
    /// worker's signature: the record's grant, once it is the leader's and
    /// names the record's job, task, attempt, session, worker and slice.
    fn granted_measurement(
        &self,
        signed: &mtswarm_bus::results::SignedRecord,
    ) -> Result<v1::PlacementGrant, ProvenanceError> {
        use mtswarm_bus::results::canonical_slice_id;
        let kind = RecordKind::Measurement;
        let record = &signed.record;
        let id = &record.record_id;
        let grant = record
            .grant
            .as_ref()
            .map(mtswarm_bus::results::RecordGrant::to_grant)
            .ok_or_else(|| ProvenanceError::NoGrant {
                kind,
                id: id.clone(),
            })?;
        self.verify_grant(&grant, kind, id)?;
        let attempt = record.attempt.to_string();
        let granted_attempt = grant.attempt.to_string();
        let slice = canonical_slice_id(&record.slice_id);
        let granted_slice = canonical_slice_id(&grant.slice_id);
        for (field, granted, claimed) in [
            ("job", &grant.job_id, &record.job_id),
            ("task", &grant.task_id, &record.task_id),
            ("attempt", &granted_attempt, &attempt),
            ("session", &grant.session_id, &record.session_id),
            ("worker", &grant.worker_id, &record.worker_id),
            ("slice", &granted_slice, &slice),
        ] {
            same(kind, id, field, granted, claimed)?;
        }
        Ok(grant)
    }
}

fn same(
    kind: RecordKind,
    id: &str,
    field: &'static str,
    granted: &str,
    claimed: &str,
) -> Result<(), ProvenanceError> {
    if granted == claimed {
        return Ok(());
    }
    Err(ProvenanceError::GrantMismatch {
        kind,
        id: id.to_string(),
        field,
        granted: granted.to_string(),
        claimed: claimed.to_string(),
    })
}

/// A tool call's arguments in canonical form: the JSON text parsed and
/// written again with every object's keys sorted and no spaces, so two
/// spellings of the same arguments compare equal. Text that is not JSON is
/// its own canonical form.
pub fn canonical_arguments(arguments_json: &str) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    if let Some(item) = map.get(key) {
                        write(item, out);
                    }
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    match serde_json::from_str::<serde_json::Value>(arguments_json) {
        Ok(value) => {
            let mut out = String::with_capacity(arguments_json.len());
            write(&value, &mut out);
            out
        }
        Err(_) => arguments_json.to_string(),
    }
}

/// SHA-256 (hex) of [`canonical_arguments`]: what a decision names of the
/// call it decides.
pub fn arguments_digest(arguments_json: &str) -> String {
    hex::encode(Sha256::digest(
        canonical_arguments(arguments_json).as_bytes(),
    ))
}

#[cfg(test)]
mod tests;
