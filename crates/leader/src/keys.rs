//! The leader's two secrets, and what it makes with them: a task attempt's
//! result token (only the session the attempt was placed on gets it) and
//! the signed placement grant a worker's records must carry
//! ([`mtswarm_auth::provenance`]), and the check of a measurement record's
//! provenance against that grant. Without them (a development stack) the
//! tokens are empty, no grant is issued and every record is believed.
//!
//! A record's check is two ed25519 verifications (the leader's grant, the
//! worker's signature), and a job's records are checked several times (its
//! outcome, the confirmation of its best): the leader remembers a digest of
//! each record that passed, over its stored bytes and signature, and
//! passes the same bytes again without verifying them again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use mtswarm_auth::{DecisionSigner, DecisionVerifier, ProvenanceError, ResultKey};
use mtswarm_bus::results::SignedRecord;
use mtswarm_bus::v1;
use sha2::{Digest as _, Sha256};

/// Digests of verified records the leader keeps at most; past it the set
/// starts again (it only saves work).
const VERIFIED_CAPACITY: usize = 1 << 17;

/// The result key and the decision signer, as configured.
#[derive(Clone, Default)]
pub(crate) struct LeaderKeys {
    result: Option<ResultKey>,
    decision: Option<DecisionSigner>,
    verifier: Option<DecisionVerifier>,
    verified: Arc<Mutex<HashSet<[u8; 32]>>>,
}

impl LeaderKeys {
    pub(crate) fn new(result: Option<ResultKey>, decision: Option<DecisionSigner>) -> Self {
        Self {
            result,
            verifier: decision.as_ref().map(DecisionSigner::verifier),
            decision,
            verified: Arc::default(),
        }
    }

    /// Whether each of `records` was produced by the worker its attempt
    /// was placed on ([`DecisionVerifier::verify_measurement`]), in their
    /// order; always `Ok` without a decision key. The records not verified
    /// before are verified as one batch
    /// ([`DecisionVerifier::verify_measurements`]); a record whose stored
    /// bytes and signature passed before passes without being verified
    /// again: the store decodes the record from those bytes, so they
    /// decide the check.
    pub(crate) fn check_measurements(
        &self,
        records: &[SignedRecord],
    ) -> Vec<Result<(), ProvenanceError>> {
        let Some(verifier) = &self.verifier else {
            return records.iter().map(|_| Ok(())).collect();
        };
        let digests: Vec<[u8; 32]> = records.iter().map(record_digest).collect();
        let fresh: Vec<usize> = {
            let verified = self.verified_set();
            (0..records.len())
                .filter(|&i| !verified.contains(&digests[i]))
                .collect()
        };
        let checked =
            verifier.verify_measurements(&fresh.iter().map(|&i| &records[i]).collect::<Vec<_>>());
        let mut results: Vec<Result<(), ProvenanceError>> =
            records.iter().map(|_| Ok(())).collect();
        for (index, result) in fresh.into_iter().zip(checked) {
            if result.is_ok() {
                self.remember(digests[index]);
            }
            results[index] = result;
        }
        results
    }

    fn remember(&self, digest: [u8; 32]) {
        let mut verified = self.verified_set();
        if verified.len() >= VERIFIED_CAPACITY {
            verified.clear();
        }
        verified.insert(digest);
    }

    fn verified_set(&self) -> std::sync::MutexGuard<'_, HashSet<[u8; 32]>> {
        // A panic elsewhere cannot leave the set half-written.
        self.verified
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The signer of the leader's decisions and grants (`None`: unsigned).
    pub(crate) fn decision(&self) -> Option<&DecisionSigner> {
        self.decision.as_ref()
    }

    /// The key result tokens are checked with (`None`: not checked).
    pub(crate) fn result(&self) -> Option<&ResultKey> {
        self.result.as_ref()
    }

    /// The result token of one task attempt (empty without a result key).
    pub(crate) fn result_token(&self, job_id: &str, task_id: &str, attempt: u32) -> String {
        self.result
            .as_ref()
            .map(|key| key.token(job_id, task_id, attempt))
            .unwrap_or_default()
    }

    /// The leader's signed placement grant of `assignment` on the worker
    /// whose record key is `worker_key`; `None` without a decision key, or
    /// for a worker that registered no key (its records then carry nothing
    /// the leader would accept).
    pub(crate) fn grant(
        &self,
        assignment: &v1::TaskAssignment,
        worker_key: &str,
    ) -> Option<v1::PlacementGrant> {
        let signer = self.decision.as_ref()?;
        if worker_key.is_empty() {
            tracing::warn!(worker_id = %assignment.worker_id, task_id = %assignment.task_id, "the worker registered no record key; its records for this task will be refused");
            return None;
        }
        let mut grant = mtswarm_auth::grant_for(assignment, worker_key);
        match signer.sign_grant(&mut grant) {
            Ok(()) => Some(grant),
            Err(error) => {
                tracing::warn!(%error, "placement grant not signed");
                None
            }
        }
    }
}

/// SHA-256 over a record's stored bytes (length-prefixed) and its signature.
fn record_digest(signed: &SignedRecord) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update((signed.payload.len() as u64).to_le_bytes());
    hasher.update(&signed.payload);
    hasher.update(signed.signature.as_deref().unwrap_or_default());
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use mtswarm_auth::{RecordKind, WorkerKey};
    use mtswarm_bus::results::{RecordGrant, ResultRecord};

    use super::*;

    fn check(keys: &LeaderKeys, record: &SignedRecord) -> Result<(), ProvenanceError> {
        keys.check_measurements(std::slice::from_ref(record))
            .remove(0)
    }

    /// A measurement record of attempt 1 placed on `worker`, signed by
    /// `signer` over its stored bytes.
    fn signed_record(keys: &LeaderKeys, worker: &WorkerKey, signer: &WorkerKey) -> SignedRecord {
        let assignment = v1::TaskAssignment {
            task_id: "t1".into(),
            job_id: "j1".into(),
            attempt: 1,
            agent_id: "a1".into(),
            session_id: "s1".into(),
            worker_id: "w1".into(),
            slice_id: "b0-c0".into(),
            ..Default::default()
        };
        let grant = keys
            .grant(&assignment, &worker.public_key())
            .expect("a signed grant");
        let record = ResultRecord {
            record_id: "r1".into(),
            job_id: "j1".into(),
            task_id: "t1".into(),
            attempt: 1,
            session_id: "s1".into(),
            worker_id: "w1".into(),
            slice_id: "b0-c0".into(),
            grant: Some(RecordGrant::of(&grant)),
            ..Default::default()
        };
        let payload = serde_json::to_vec(&record).expect("json");
        let signature = signer
            .sign(RecordKind::Measurement, "r1", &payload)
            .expect("signed");
        SignedRecord {
            record,
            payload: payload.into(),
            signature: Some(signature),
        }
    }

    #[test]
    fn a_verified_record_passes_again_and_changed_bytes_are_verified_anew() {
        let keys = LeaderKeys::new(None, Some(DecisionSigner::generate()));
        let worker = WorkerKey::generate();
        let honest = signed_record(&keys, &worker, &worker);
        check(&keys, &honest).expect("the worker's own record");
        check(&keys, &honest).expect("the same bytes again");
        assert_eq!(keys.verified_set().len(), 1, "remembered once");

        // The same signature over other bytes is not the remembered record.
        let mut changed = honest.clone();
        let mut bytes = changed.payload.to_vec();
        bytes.push(b' ');
        changed.payload = bytes.into();
        assert!(check(&keys, &changed).is_err());
        // Another worker's signature over the same bytes is refused too.
        let forged = signed_record(&keys, &worker, &WorkerKey::generate());
        assert!(check(&keys, &forged).is_err());
        assert_eq!(keys.verified_set().len(), 1, "refusals are not remembered");
    }

    #[test]
    fn a_batch_names_each_bad_record_and_keeps_the_good_ones() {
        let keys = LeaderKeys::new(None, Some(DecisionSigner::generate()));
        let (a, b) = (WorkerKey::generate(), WorkerKey::generate());
        let honest_a = signed_record(&keys, &a, &a);
        let honest_b = signed_record(&keys, &b, &b);
        let forged = signed_record(&keys, &a, &WorkerKey::generate());
        let mut changed = honest_b.clone();
        let mut bytes = changed.payload.to_vec();
        bytes.push(b' ');
        changed.payload = bytes.into();
        let batch = [forged, honest_a.clone(), changed, honest_b.clone()];
        let verdicts: Vec<bool> = keys
            .check_measurements(&batch)
            .iter()
            .map(Result::is_ok)
            .collect();
        assert_eq!(verdicts, [false, true, false, true]);
        assert_eq!(keys.verified_set().len(), 2, "the good ones are remembered");
        // A record signed by another worker than its grant names fails
        // among remembered ones.
        let stray = signed_record(&keys, &WorkerKey::generate(), &a);
        let verdicts: Vec<bool> = keys
            .check_measurements(&[honest_a, stray, honest_b])
            .iter()
            .map(Result::is_ok)
            .collect();
        assert_eq!(verdicts, [true, false, true]);
        // Good records not seen before pass as one batch.
        let other = LeaderKeys::new(None, Some(DecisionSigner::generate()));
        let good = [signed_record(&other, &a, &a), signed_record(&other, &b, &b)];
        assert!(other.check_measurements(&good).iter().all(Result::is_ok));
        assert_eq!(other.verified_set().len(), 2);
    }

    #[test]
    fn without_a_decision_key_every_record_is_believed() {
        let keys = LeaderKeys::default();
        let worker = WorkerKey::generate();
        let signing = LeaderKeys::new(None, Some(DecisionSigner::generate()));
        let mut record = signed_record(&signing, &worker, &worker);
        record.signature = None;
        check(&keys, &record).expect("believed");
        assert!(keys.verified_set().is_empty());
    }
}
