//! The daemon's side of provenance (`mtswarm_auth::provenance`): the record
//! key it signs with (derived from its NATS seed, registered in its worker
//! record), the seal of its checkpoints (signed with that key; a stored
//! checkpoint counts only with the leader's grant and the granted worker's
//! signature) and the signer of its measurement records. Also the check of
//! the grant a task arrives with.

use std::sync::Arc;

use mtswarm_auth::{DecisionVerifier, RecordKind, WorkerKey};
use mtswarm_bus::results::RecordSigner;
use mtswarm_bus::{CheckpointSeal, v1};

/// The daemon's record key: derived from its NATS nkey seed when it has
/// one (the same key on every start), else fresh for this process.
pub(crate) fn record_key(nkey_seed: Option<&str>) -> WorkerKey {
    match nkey_seed.map(WorkerKey::derive) {
        Some(Ok(key)) => key,
        Some(Err(error)) => {
            tracing::warn!(%error, "record key not derived from the NATS seed; using a fresh one");
            WorkerKey::generate()
        }
        None => WorkerKey::generate(),
    }
}

/// Signs checkpoints with the daemon's key; with the leader's public key,
/// trusts a stored checkpoint only when it verifies.
#[derive(Debug)]
pub(crate) struct WorkerSeal {
    pub(crate) key: WorkerKey,
    pub(crate) leader: Option<DecisionVerifier>,
}

impl CheckpointSeal for WorkerSeal {
    fn sign(&self, checkpoint: &mut v1::SessionCheckpoint) {
        if let Err(error) = self.key.sign_checkpoint(checkpoint) {
            tracing::warn!(%error, "checkpoint not signed");
        }
    }

    fn refusal(&self, checkpoint: &v1::SessionCheckpoint) -> Option<String> {
        let leader = self.leader.as_ref()?;
        leader
            .verify_checkpoint(checkpoint)
            .err()
            .map(|e| e.to_string())
    }
}

/// Signs the daemon's measurement records (the stored JSON, byte for byte).
#[derive(Debug)]
pub(crate) struct MeasurementSigner(pub(crate) WorkerKey);

impl RecordSigner for MeasurementSigner {
    fn sign(&self, record_id: &str, payload: &[u8]) -> Option<Vec<u8>> {
        match self.0.sign(RecordKind::Measurement, record_id, payload) {
            Ok(signature) => Some(signature),
            Err(error) => {
                tracing::warn!(%error, "measurement record not signed");
                None
            }
        }
    }
}

/// The seal and signer of a daemon with `key`.
pub(crate) fn seal_and_signer(
    key: &WorkerKey,
    leader: Option<&DecisionVerifier>,
) -> (Arc<WorkerSeal>, Arc<MeasurementSigner>) {
    (
        Arc::new(WorkerSeal {
            key: key.clone(),
            leader: leader.cloned(),
        }),
        Arc::new(MeasurementSigner(key.clone())),
    )
}

/// Why a task's grant does not place it here, when the leader's key is
/// configured: the records this attempt signs would not be accepted. The
/// task still runs (it came over the leader's own task subject); the
/// mismatch is logged with what is wrong.
pub(crate) fn grant_problem(
    leader: Option<&DecisionVerifier>,
    task: &v1::TaskAssignment,
    worker_id: &str,
    worker_key: &str,
) -> Option<String> {
    let leader = leader?;
    let Some(grant) = &task.grant else {
        return Some("the task carries no placement grant".into());
    };
    if let Err(error) = leader.verify_grant(grant, RecordKind::Assignment, &short(&task.task_id)) {
        return Some(error.to_string());
    }
    let attempt = task.attempt.to_string();
    let granted_attempt = grant.attempt.to_string();
    let fields = [
        ("job", &grant.job_id, &task.job_id),
        ("task", &grant.task_id, &task.task_id),
        ("attempt", &granted_attempt, &attempt),
        ("session", &grant.session_id, &task.session_id),
        ("agent", &grant.agent_id, &task.agent_id),
        ("slice", &grant.slice_id, &task.slice_id),
    ];
    for (field, granted, assigned) in fields {
        if granted != assigned {
            return Some(format!(
                "the grant names {field} {:?}, the assignment {:?}",
                short(granted),
                short(assigned)
            ));
        }
    }
    if grant.worker_id != worker_id {
        return Some(format!(
            "the grant places worker {:?}",
            short(&grant.worker_id)
        ));
    }
    if grant.worker_key != worker_key {
        return Some(format!(
            "the grant names record key {:?}, this daemon signs with {worker_key:?} (was it restarted with another NATS credential?)",
            short(&grant.worker_key)
        ));
    }
    None
}

/// At most 128 characters of `text` (no id or key is longer), so that a
/// problem quoting a field the sender made huge stays one short line.
fn short(text: &str) -> String {
    let mut kept: String = text.chars().take(128).collect();
    if kept.len() < text.len() {
        kept.push_str("...");
    }
    kept
}
