//! The records a worker signs in place (checkpoints, approval requests):
//! signing one with the worker's key and checking that the worker a
//! placement grant names signed it, for both kinds alike.

use mtswarm_bus::v1;
use prost::Message;

use super::{ProvenanceError, RecordKind, WorkerKey, verify_record_signature};

/// A record a worker signs in place: its kind, its id, and its signature
/// field, which covers the record's encoding with that field empty.
pub(super) trait WorkerSigned: Message + Clone {
    /// The kind the signature is made for.
    const KIND: RecordKind;
    /// The record's id, for errors.
    fn id(&self) -> &str;
    /// The signature field.
    fn signature_mut(&mut self) -> &mut Vec<u8>;
    /// The signature as stored.
    fn signature(&self) -> &[u8];
    /// The bytes the signature covers.
    fn unsigned_bytes(&self) -> Vec<u8> {
        let mut unsigned = self.clone();
        *unsigned.signature_mut() = Vec::new();
        unsigned.encode_to_vec()
    }
}

impl WorkerSigned for v1::SessionCheckpoint {
    const KIND: RecordKind = RecordKind::Checkpoint;
    fn id(&self) -> &str {
        &self.session_id
    }
    fn signature_mut(&mut self) -> &mut Vec<u8> {
        &mut self.signature
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
}

impl WorkerSigned for v1::ApprovalRequest {
    const KIND: RecordKind = RecordKind::ApprovalRequest;
    fn id(&self) -> &str {
        &self.approval_id
    }
    fn signature_mut(&mut self) -> &mut Vec<u8> {
        &mut self.signature
    }
    fn signature(&self) -> &[u8] {
        &self.signature
    }
}

/// Checks that the worker `grant` names signed `record`.
pub(super) fn verify_worker_signed<R: WorkerSigned>(
    grant: &v1::PlacementGrant,
    record: &R,
) -> Result<(), ProvenanceError> {
    verify_record_signature(
        &grant.worker_key,
        &grant.worker_id,
        R::KIND,
        record.id(),
        &record.unsigned_bytes(),
        record.signature(),
    )
}

impl WorkerKey {
    /// Signs `record` in place (sets its signature over the rest).
    fn sign_record<R: WorkerSigned>(&self, record: &mut R) -> Result<(), ProvenanceError> {
        let signature = self.sign(R::KIND, record.id(), &record.unsigned_bytes())?;
        *record.signature_mut() = signature;
        Ok(())
    }

    /// Signs a checkpoint (sets `checkpoint.signature` over the rest).
    pub fn sign_checkpoint(
        &self,
        checkpoint: &mut v1::SessionCheckpoint,
    ) -> Result<(), ProvenanceError> {
        self.sign_record(checkpoint)
    }

    /// Signs an approval request (sets `request.signature` over the rest).
    pub fn sign_approval_request(
        &self,
        request: &mut v1::ApprovalRequest,
    ) -> Result<(), ProvenanceError> {
        self.sign_record(request)
    }
}
