//! Many measurement records checked at once. A job's outcome is drawn from
//! every record it stored (two or more per agent), and each record's
//! worker signature is an Ed25519 verification. Verified as one batch
//! (`ed25519_dalek::verify_batch`: one multi-scalar multiplication with
//! random weights) they cost about half as much; a batch that fails says
//! only that one signature is bad, so its records are then verified one by
//! one to name which, with the errors a single check gives. The batch
//! equation is the cofactored one; a signature it takes that the single
//! check would not can only be made by the key's own holder (who may sign
//! that record anyway), and small-order keys are always checked alone.

use ed25519_dalek::{Signature, VerifyingKey};
use mtswarm_bus::results::SignedRecord;
use mtswarm_bus::v1;

use super::{ProvenanceError, RecordKind, verify_record_signature};
use crate::decision::DecisionVerifier;

/// A worker signature ready for the batch: the message it covers, the
/// signature and the worker's key.
struct Batched {
    index: usize,
    grant: v1::PlacementGrant,
    message: Vec<u8>,
    signature: Signature,
    key: VerifyingKey,
}

impl DecisionVerifier {
    /// [`DecisionVerifier::verify_measurement`] of each of `records`, in
    /// their order, with the workers' signatures verified as one batch.
    pub fn verify_measurements(
        &self,
        records: &[&SignedRecord],
    ) -> Vec<Result<(), ProvenanceError>> {
        let mut results = Vec::with_capacity(records.len());
        let mut batch = Vec::with_capacity(records.len());
        for (index, signed) in records.iter().enumerate() {
            let grant = match self.granted_measurement(signed) {
                Ok(grant) => grant,
                Err(error) => {
                    results.push(Err(error));
                    continue;
                }
            };
            match batched(index, &grant, signed) {
                Some(entry) => {
                    batch.push(entry);
                    results.push(Ok(()));
                }
                // Not even well-formed: the single check gives its error.
                None => results.push(single(&grant.worker_key, &grant.worker_id, signed)),
            }
        }
        let messages: Vec<&[u8]> = batch.iter().map(|b| b.message.as_slice()).collect();
        let signatures: Vec<Signature> = batch.iter().map(|b| b.signature).collect();
        let keys: Vec<VerifyingKey> = batch.iter().map(|b| b.key).collect();
        if !batch.is_empty() && ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_err()
        {
            for entry in &batch {
                let grant = &entry.grant;
                results[entry.index] =
                    single(&grant.worker_key, &grant.worker_id, records[entry.index]);
            }
        }
        results
    }
}

/// The record's worker signature in the batch's terms; `None` when the key
/// is not a worker's or the signature is not one (the single check then
/// names what is wrong).
fn batched(index: usize, grant: &v1::PlacementGrant, signed: &SignedRecord) -> Option<Batched> {
    if !grant.worker_key.starts_with('C') {
        return None;
    }
    let (_, raw) = nkeys::from_public_key(&grant.worker_key).ok()?;
    let key = VerifyingKey::from_bytes(&raw).ok()?;
    // A small-order key is left to the single check, whose verdict on it
    // is the one every other reader of the record gets.
    if key.is_weak() {
        return None;
    }
    let signature = Signature::from_slice(signed.signature.as_deref()?).ok()?;
    Some(Batched {
        index,
        grant: grant.clone(),
        message: RecordKind::Measurement.message(&signed.payload),
        signature,
        key,
    })
}

/// The worker signature of one record, checked alone.
fn single(worker_key: &str, worker_id: &str, signed: &SignedRecord) -> Result<(), ProvenanceError> {
    verify_record_signature(
        worker_key,
        worker_id,
        RecordKind::Measurement,
        &signed.record.record_id,
        &signed.payload,
        signed.signature.as_deref().unwrap_or_default(),
    )
}
