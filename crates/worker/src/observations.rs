//! `job_observations`: what the other agents of this session's job have
//! measured, read from the results store, so that a job's agents search as
//! one (`mtswarm_policy::observations` is the reply's format and says how
//! the search uses it).
//!
//! Only records that prove where they come from count: with the leader's
//! key configured, a record must carry the leader's grant for its job,
//! task, session and worker and the granted worker's signature over the
//! stored bytes (`DecisionVerifier::verify_measurement`), as the leader
//! asks of a record before it counts in a job's outcome. A worker of
//! another job, or one that writes records in another's name, cannot reach
//! this job's search. A worker of the same job can still report its own
//! measurements falsely; the search only lets that change which candidate
//! is screened next (it never skips or prunes a candidate of its own on
//! another's word), and the job's best is always a record of its own task.
//!
//! Records of edited sources are left out (another kernel, as far as the
//! model of the parameters goes), and so are this session's own (its
//! conversation has them already). Measurements are kept fastest first, one
//! per configuration.

use std::collections::BTreeMap;

use mtswarm_auth::DecisionVerifier;
use mtswarm_bus::results::{CandidateStatus, ResultQuery, ResultRecord, ResultsStore};
use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use mtswarm_policy::observations::{MAX_OBSERVATIONS, OBSERVATIONS_TOOL, Observations};
use schemars::JsonSchema;
use serde::Deserialize;

/// Records of the job read per call at most (the newest).
const RECORDS_READ: usize = 4 * MAX_OBSERVATIONS;

/// The tool takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct JobObservationsArgs {}

static SPEC: ToolSpec = ToolSpec::new(
    OBSERVATIONS_TOOL,
    "What the other agents of this job have measured: each configuration's time (fastest first) \
     and the configurations that failed. Read-only; no arguments.",
    schema_of::<JobObservationsArgs>,
)
.concurrent();

/// The tool of one session.
pub(crate) struct JobObservationsTool {
    store: ResultsStore,
    job_id: String,
    session_id: String,
    kernel: String,
    leader: Option<DecisionVerifier>,
}

impl JobObservationsTool {
    pub(crate) fn new(
        store: ResultsStore,
        job_id: &str,
        session_id: &str,
        kernel: &str,
        leader: Option<DecisionVerifier>,
    ) -> Self {
        Self {
            store,
            job_id: job_id.to_owned(),
            session_id: session_id.to_owned(),
            kernel: kernel.to_owned(),
            leader,
        }
    }
}

#[async_trait::async_trait]
impl Tool for JobObservationsTool {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }

    async fn call(
        &self,
        args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        serde_json::from_value::<JobObservationsArgs>(args)
            .map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        if self.job_id.is_empty() {
            return Ok(ToolOutput::text(Observations::default().render()));
        }
        let records = self
            .store
            .query_signed(&ResultQuery {
                job_id: Some(self.job_id.clone()),
                kernel: (!self.kernel.is_empty()).then(|| self.kernel.clone()),
                limit: RECORDS_READ,
                ..ResultQuery::default()
            })
            .await
            .map_err(|e| ToolError::Failed(format!("the results store did not answer: {e}")))?;
        let mut refused = 0usize;
        let genuine = records.iter().filter(|signed| {
            let Some(leader) = &self.leader else {
                return true;
            };
            match leader.verify_measurement(signed) {
                Ok(()) => true,
                Err(error) => {
                    refused += 1;
                    tracing::debug!(%error, "record left out of the job's observations");
                    false
                }
            }
        });
        let observations = observations_of(genuine.map(|s| &s.record), &self.session_id);
        if refused > 0 {
            tracing::warn!(
                job.id = %self.job_id,
                refused,
                "records without a valid grant and signature left out of the job's observations"
            );
        }
        tracing::debug!(
            job.id = %self.job_id,
            measured = observations.measured.len(),
            failed = observations.failed.len(),
            "job observations read"
        );
        Ok(ToolOutput::text(observations.render()))
    }
}

/// The observations in `records` for a session other than `own_session`:
/// the fastest time of each configuration measured validly, and the
/// configurations that only failed.
fn observations_of<'a>(
    records: impl Iterator<Item = &'a ResultRecord>,
    own_session: &str,
) -> Observations {
    let mut fastest: BTreeMap<&BTreeMap<String, String>, f64> = BTreeMap::new();
    let mut failed: Vec<&BTreeMap<String, String>> = Vec::new();
    for record in records {
        if record.session_id == own_session
            || record.baseline
            || record.source_diff.as_deref().is_some_and(|d| !d.is_empty())
        {
            continue;
        }
        let seconds = record
            .stats
            .as_ref()
            .map(|s| s.median)
            .filter(|m| m.is_finite() && *m > 0.0);
        match (record.valid && record.flags.is_empty(), seconds) {
            (true, Some(seconds)) => {
                let best = fastest.entry(&record.params).or_insert(seconds);
                *best = best.min(seconds);
            }
            _ if matches!(
                record.status(),
                CandidateStatus::CompileFailed
                    | CandidateStatus::Invalid
                    | CandidateStatus::TimedOut
            ) =>
            {
                failed.push(&record.params);
            }
            _ => {}
        }
    }
    failed.retain(|p| !fastest.contains_key(p));
    failed.sort();
    failed.dedup();
    Observations {
        measured: fastest.into_iter().map(|(p, s)| (p.clone(), s)).collect(),
        failed: failed.into_iter().cloned().collect(),
        running: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::results::ResultStats;

    fn record(session: &str, mb: &str, median: Option<f64>) -> ResultRecord {
        ResultRecord {
            session_id: session.to_owned(),
            params: [("MB".to_owned(), mb.to_owned())].into(),
            valid: median.is_some(),
            stats: median.map(|m| ResultStats {
                median: m,
                ..ResultStats::default()
            }),
            status: if median.is_some() {
                CandidateStatus::Benchmarked
            } else {
                CandidateStatus::Invalid
            },
            ..ResultRecord::default()
        }
    }

    #[test]
    fn the_others_fastest_valid_figures_and_their_failures_are_observed() {
        let mut edited = record("s2", "8", Some(1e-4));
        edited.source_diff = Some("--- a\n+++ b\n".to_owned());
        let mut flagged = record("s2", "16", Some(1e-5));
        flagged.flags = vec!["implausible".to_owned()];
        flagged.status = CandidateStatus::Flagged;
        let records = [
            record("s1", "64", Some(1e-3)),
            record("s2", "32", Some(3e-3)),
            record("s3", "32", Some(2e-3)),
            record("s2", "128", None),
            record("s3", "32", None),
            edited,
            flagged,
        ];
        let seen = observations_of(records.iter(), "s1");
        let mb = |v: &str| -> BTreeMap<String, String> { [("MB".to_owned(), v.to_owned())].into() };
        assert_eq!(
            seen.measured,
            vec![(mb("32"), 2e-3)],
            "own, edited and flagged left out"
        );
        assert_eq!(seen.failed, vec![mb("128")], "a flagged figure is neither");
    }

    /// Against a real nats-server: the tool reads the job's records from
    /// the results store, and with the leader's key configured a record
    /// without the leader's grant and its worker's signature is left out.
    #[tokio::test]
    async fn the_tool_reads_the_jobs_records_and_only_proven_ones_with_a_leader_key() {
        let nats = mtswarm_bus::testing::start_nats().await;
        let bus = mtswarm_bus::testing::ready_bus(mtswarm_bus::BusConfig::new(nats.url())).await;
        let store = ResultsStore::open(&bus).await.expect("results store");
        for (job, session, mb, median) in [
            ("job1", "s2", "32", 2e-3),
            ("job1", "s1", "64", 1e-3),
            ("job2", "s9", "16", 1e-4),
        ] {
            let mut record = record(session, mb, Some(median));
            record.record_id = format!("{job}-{session}-{mb}");
            record.job_id = job.to_owned();
            record.kernel = "dgemm".to_owned();
            record.kernel_hash = "0123456789abcdef".to_owned();
            store.record(&record).await.expect("recorded");
        }
        let call = |leader: Option<DecisionVerifier>| {
            let tool = JobObservationsTool::new(store.clone(), "job1", "s1", "dgemm", leader);
            async move {
                let out = tool
                    .call(serde_json::json!({}), &ToolContext::new("s1", "c1", 1))
                    .await
                    .expect("answers");
                Observations::parse(&out.content).expect("reads")
            }
        };
        let open = call(None).await;
        let mb = |v: &str| -> BTreeMap<String, String> { [("MB".to_owned(), v.to_owned())].into() };
        assert_eq!(
            open.measured,
            vec![(mb("32"), 2e-3)],
            "job1's other session only"
        );
        let leader = mtswarm_auth::DecisionSigner::generate().verifier();
        let proven = call(Some(leader)).await;
        assert!(proven.is_empty(), "an unsigned record counts: {proven:?}");
    }
}
