//! The leader's two secrets, and what it makes with them: a task attempt's
//! result token (only the session the attempt was placed on gets it) and
//! the signed placement grant a worker's records must carry
//! ([`mtswarm_auth::provenance`]). Without them (a development stack) the
//! tokens are empty and no grant is issued.

use mtswarm_auth::{DecisionSigner, ResultKey};
use mtswarm_bus::v1;

/// The result key and the decision signer, as configured.
#[derive(Clone, Default)]
pub(crate) struct LeaderKeys {
    result: Option<ResultKey>,
    decision: Option<DecisionSigner>,
}

impl LeaderKeys {
    pub(crate) fn new(result: Option<ResultKey>, decision: Option<DecisionSigner>) -> Self {
        Self { result, decision }
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
