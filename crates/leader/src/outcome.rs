//! The typed job outcome: what a job achieved, computed by the leader from
//! the measurement records of the task results it accepted, never from the
//! model's text. A model (builtin or real) can summarize wrongly, truncate
//! or invent; the records in the results store are what the workers
//! measured, so the job's state and its best configuration come from them.
//!
//! Which records count: those of a task's accepted attempt (the fencing rule
//! of [`crate::results`] applies to measurements too: a record of a stale
//! attempt is not the job's), and, when the leader signs placements, only
//! those the worker the attempt was placed on produced: each record carries
//! the leader's grant of its attempt and the granted worker's signature
//! over its stored bytes (`mtswarm_auth::provenance`). Others are refused,
//! logged and counted (`JobOutcome.refused_records`).
//!
//! The best is the fastest usable record
//! (valid, unflagged, benchmarked with a median time; ranked by GFLOPS,
//! then by median time), whether it was built from the pristine kernel or
//! from sources an agent edited (the outcome then names the edit: its
//! diff, and the hash of the edited sources); its speed-up is
//! over the kernel's tune.toml baseline measured in the same job on the
//! same kind of slice (backend and cores), when such a record exists.

use std::collections::{BTreeMap, HashMap, HashSet};

use mtswarm_bus::results::{
    CandidateStatus, ResultQuery, ResultRecord, ResultsStore, SignedRecord,
};
use mtswarm_bus::v1;

use crate::job::JobContext;
use crate::keys::LeaderKeys;
use crate::results::TaskView;
use crate::stores::Stores;

/// Records read for one job's outcome at most.
const MAX_OUTCOME_RECORDS: usize = 100_000;

/// How long the outcome keeps trying to read the results store. A replicated
/// stream briefly has no leader after a node dies; a job whose results are
/// stored must not fail for that.
const READ_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Reads the job's records from the results store and computes its outcome.
/// A store that cannot be read yields an outcome without a best whose
/// reason says so (the job then fails rather than claiming a result).
/// Leaves out the tasks `tasks_left_out` (and their records: the leader's
/// confirming tasks are not the job's candidates) and, as candidates for
/// the best, the records `disputed` (figures another worker did not
/// reproduce).
pub(crate) async fn compute_excluding(
    stores: &Stores,
    keys: &LeaderKeys,
    context: &JobContext,
    tasks_left_out: &HashSet<String>,
    disputed: &HashSet<String>,
) -> v1::JobOutcome {
    let tasks: Vec<TaskView> = context
        .results
        .snapshot()
        .into_iter()
        .filter(|t| !tasks_left_out.contains(&t.task_id))
        .collect();
    match believed_records(stores, keys, &context.job_id).await {
        Ok((records, refused)) => {
            let records: Vec<ResultRecord> = records
                .into_iter()
                .filter(|r| !tasks_left_out.contains(&r.task_id))
                .collect();
            let mut outcome = from_records_disputed(&tasks, &records, disputed);
            outcome.refused_records = refused;
            outcome
        }
        Err(error) => {
            let mut outcome = from_records(&tasks, &[]);
            outcome.best = None;
            outcome.failure_reason = format!("the results store could not be read: {error}");
            outcome
        }
    }
}

/// The job's records the leader believes, and how many it refused (see the
/// module docs).
pub(crate) async fn believed_records(
    stores: &Stores,
    keys: &LeaderKeys,
    job_id: &str,
) -> Result<(Vec<ResultRecord>, u32), mtswarm_bus::BusError> {
    let signed = read_records(stores, job_id).await?;
    Ok(believed(keys, signed))
}

/// The records of `signed` whose provenance verifies (all of them without
/// a decision key), and the number refused (each logged).
pub(crate) fn believed(keys: &LeaderKeys, signed: Vec<SignedRecord>) -> (Vec<ResultRecord>, u32) {
    let mut refused = 0u32;
    let checks = keys.check_measurements(&signed);
    let records = signed
        .into_iter()
        .zip(checks)
        .filter_map(|(signed, check)| match check {
            Ok(()) => Some(signed.record),
            Err(error) => {
                refused = refused.saturating_add(1);
                tracing::warn!(
                    job_id = %signed.record.job_id,
                    record_id = %signed.record.record_id,
                    worker_id = %signed.record.worker_id,
                    slice_id = %signed.record.slice_id,
                    %error,
                    "measurement record refused: not produced by the worker its attempt was placed on"
                );
                None
            }
        })
        .collect();
    (records, refused)
}

/// The job's records, read again with backoff for up to [`READ_PATIENCE`]
/// while the store cannot answer; the last error after that.
async fn read_records(
    stores: &Stores,
    job_id: &str,
) -> Result<Vec<SignedRecord>, mtswarm_bus::BusError> {
    let deadline = tokio::time::Instant::now() + READ_PATIENCE;
    let mut backoff = mtswarm_bus::Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(5),
    );
    loop {
        let attempt = async {
            let store = ResultsStore::open(&stores.bus).await?;
            store
                .query_signed(&ResultQuery {
                    job_id: Some(job_id.to_string()),
                    limit: MAX_OUTCOME_RECORDS,
                    ..ResultQuery::default()
                })
                .await
        };
        match attempt.await {
            Ok(records) => return Ok(records),
            Err(error) if tokio::time::Instant::now() < deadline => {
                let delay = backoff.next_delay();
                tracing::warn!(%error, %job_id, delay_ms = delay.as_millis() as u64, "results store unreadable; reading again");
                tokio::time::sleep(delay).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// The records of `records` that belong to an accepted attempt of `tasks`.
pub(crate) fn accepted_records<'a>(
    tasks: &[TaskView],
    records: &'a [ResultRecord],
) -> Vec<&'a ResultRecord> {
    let accepted: HashMap<&str, u32> = tasks
        .iter()
        .filter_map(|t| t.result.as_ref().map(|r| (t.task_id.as_str(), r.attempt)))
        .collect();
    records
        .iter()
        .filter(|r| accepted.get(r.task_id.as_str()) == Some(&r.attempt))
        .collect()
}

/// The outcome of a job whose tasks are `tasks` (with their accepted
/// results) and whose stored records are `records` (any attempt).
pub(crate) fn from_records(tasks: &[TaskView], records: &[ResultRecord]) -> v1::JobOutcome {
    from_records_disputed(tasks, records, &HashSet::new())
}

/// [`from_records`] where the records `disputed` count (as records of
/// their status) but cannot be the best.
pub(crate) fn from_records_disputed(
    tasks: &[TaskView],
    records: &[ResultRecord],
    disputed: &HashSet<String>,
) -> v1::JobOutcome {
    let mut outcome = v1::JobOutcome::default();
    for task in tasks {
        match task.result.as_ref().map(|r| r.status()) {
            None => outcome.tasks_pending += 1,
            Some(v1::TaskStatus::Ok) => outcome.tasks_ok += 1,
            Some(v1::TaskStatus::Cancelled) => outcome.tasks_cancelled += 1,
            Some(_) => outcome.tasks_failed += 1,
        }
    }
    // The baseline is the harness's reference, not a candidate of an agent.
    let accepted: Vec<&ResultRecord> = accepted_records(tasks, records)
        .into_iter()
        .filter(|r| !r.baseline)
        .collect();
    outcome.records = count(accepted.len());
    let mut by_status: BTreeMap<String, u32> = BTreeMap::new();
    for record in &accepted {
        *by_status
            .entry(record.status().as_str().to_string())
            .or_default() += 1;
    }
    outcome.candidates_by_status = by_status.into_iter().collect();
    let trusted: Vec<&ResultRecord> = accepted.iter().copied().filter(|r| usable(r)).collect();
    outcome.valid_records = count(trusted.len());
    let best = trusted
        .iter()
        .copied()
        .filter(|r| !r.baseline && !disputed.contains(&r.record_id))
        .max_by(|a, b| {
            let ga = a.gflops.unwrap_or(f64::NEG_INFINITY);
            let gb = b.gflops.unwrap_or(f64::NEG_INFINITY);
            ga.total_cmp(&gb)
                // Without a flop count (a kernel the counters do not see),
                // the faster median wins.
                .then(median_of(b).total_cmp(&median_of(a)))
                // Equal figures: the earliest record, so the pick is stable.
                .then(b.timestamp_ms.cmp(&a.timestamp_ms))
        });
    // The baseline is measured once per job and slice kind by whichever
    // task was first there; a later attempt of that task resumes past it, so
    // a baseline record of any attempt counts.
    let baselines: Vec<&ResultRecord> =
        records.iter().filter(|r| r.baseline && usable(r)).collect();
    match best {
        Some(best) => outcome.best = Some(best_candidate(best, &trusted, &baselines)),
        None => outcome.failure_reason = failure_reason(&outcome, tasks, &accepted),
    }
    outcome
}

/// A valid, unflagged, benchmarked figure: fit to be a job's result. A
/// GFLOPS figure is not required (a kernel whose flops the counters do not
/// see still has a median time).
pub(crate) fn usable(record: &ResultRecord) -> bool {
    record.valid
        && record.flags.is_empty()
        && record.gflops.is_none_or(f64::is_finite)
        && matches!(
            record.status(),
            CandidateStatus::Benchmarked | CandidateStatus::Unknown
        )
        && median_of(record).is_finite()
}

fn median_of(record: &ResultRecord) -> f64 {
    record
        .stats
        .as_ref()
        .map(|s| s.median)
        .filter(|m| *m > 0.0)
        .unwrap_or(f64::INFINITY)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn best_candidate(
    best: &ResultRecord,
    trusted: &[&ResultRecord],
    baselines: &[&ResultRecord],
) -> v1::BestCandidate {
    // Every record of the same build on the same slice backs the figure.
    let backing: Vec<&&ResultRecord> = trusted
        .iter()
        .filter(|r| {
            r.params == best.params
                && r.kernel_hash == best.kernel_hash
                && r.slice_id == best.slice_id
        })
        .collect();
    let record_ids = backing.iter().map(|r| r.record_id.clone()).collect();
    let reproduced = backing.iter().any(|r| r.reproduced);
    let baseline = baselines
        .iter()
        .filter(|r| r.backend == best.backend && r.cores == best.cores)
        .filter_map(|r| Some((*r, r.stats.as_ref()?.median)))
        .filter(|(_, median)| *median > 0.0)
        .min_by_key(|(r, _)| r.timestamp_ms);
    let median = best.stats.as_ref().map_or(0.0, |s| s.median);
    let speedup = baseline
        .filter(|_| median > 0.0)
        .map(|(_, base)| base / median)
        .filter(|s| s.is_finite());
    v1::BestCandidate {
        params: best.params.clone().into_iter().collect(),
        gflops: best.gflops.unwrap_or_default(),
        median_seconds: median,
        peak_percent: best.peak_fraction.unwrap_or_default() * 100.0,
        cores: best.cores,
        slice_id: best.slice_id.clone(),
        backend: best.backend.clone(),
        kernel: best.kernel.clone(),
        kernel_hash: best.kernel_hash.clone(),
        harness_hash: best.harness_hash.clone(),
        agent_id: best.agent_id.clone(),
        task_id: best.task_id.clone(),
        record_ids,
        speedup_over_baseline: speedup,
        baseline_record_id: baseline
            .filter(|_| speedup.is_some())
            .map(|(r, _)| r.record_id.clone())
            .unwrap_or_default(),
        source_edited: best.source_edited(),
        source_diff: best.source_diff.clone().unwrap_or_default(),
        reproduced,
        confirmation: None,
    }
}

/// Why a job has no best, in the order a person would look.
fn failure_reason(
    outcome: &v1::JobOutcome,
    tasks: &[TaskView],
    accepted: &[&ResultRecord],
) -> String {
    let first_error = || crate::results::first_error_note(tasks);
    if tasks.is_empty() {
        return "no task was assigned".to_string();
    }
    let finished = outcome.tasks_ok + outcome.tasks_failed + outcome.tasks_cancelled;
    if finished == 0 {
        return format!(
            "budget exhausted before any result: {} task(s) still pending",
            outcome.tasks_pending
        );
    }
    if outcome.tasks_ok == 0 && outcome.tasks_failed > 0 {
        return format!(
            "every agent failed: {} task(s) failed, {} cancelled, {} pending{}",
            outcome.tasks_failed,
            outcome.tasks_cancelled,
            outcome.tasks_pending,
            first_error()
        );
    }
    if accepted.is_empty() {
        return format!(
            "no candidate was measured: {} task(s) finished without a measurement record{}",
            finished,
            first_error()
        );
    }
    let statuses: Vec<String> = outcome
        .candidates_by_status
        .iter()
        .map(|(status, n)| format!("{n} {status}"))
        .collect();
    let reason = accepted
        .iter()
        .filter_map(|r| r.reason.as_deref().or(r.error.as_deref()))
        .map(str::trim)
        .find(|r| !r.is_empty())
        .map(|r| format!("; e.g. {}", r.chars().take(300).collect::<String>()))
        .unwrap_or_default();
    format!(
        "no candidate valid: {} candidate record(s), none a valid benchmarked figure ({}){reason}",
        accepted.len(),
        statuses.join(", ")
    )
}

/// One line for people: the best configuration and its figures with units.
pub(crate) fn summary_line(best: &v1::BestCandidate) -> String {
    let mut params: Vec<(&String, &String)> = best.params.iter().collect();
    params.sort();
    let params = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let speedup = best
        .speedup_over_baseline
        .map(|s| format!(", {s:.1}x over the tune.toml baseline"))
        .unwrap_or_default();
    let source = if best.source_edited {
        format!(
            ", built from edited sources (kernel hash {})",
            best.kernel_hash.chars().take(16).collect::<String>()
        )
    } else {
        String::new()
    };
    format!(
        "Best {params}: {:.2} GFLOPS, median {:.4e} s, {:.1}% of the peak of {} cores{speedup}, on slice {} ({}) by {}{source}",
        best.gflops,
        best.median_seconds,
        best.peak_percent,
        best.cores,
        best.slice_id,
        best.backend,
        best.agent_id
    )
}

/// The status name counts of an outcome as a map.
#[cfg(test)]
fn status_counts(outcome: &v1::JobOutcome) -> BTreeMap<String, u32> {
    outcome
        .candidates_by_status
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::results::ResultStats;

    fn task(id: &str, attempt: u32, status: Option<v1::TaskStatus>) -> TaskView {
        TaskView {
            task_id: id.into(),
            agent_id: format!("agent-{id}"),
            attempt,
            result: status.map(|s| v1::TaskResult {
                task_id: id.into(),
                attempt,
                status: s as i32,
                error: if s == v1::TaskStatus::Failed {
                    "compile failed".into()
                } else {
                    String::new()
                },
                ..Default::default()
            }),
            delivered: true,
        }
    }

    fn record(
        id: &str,
        task: &str,
        attempt: u32,
        gflops: Option<f64>,
        valid: bool,
    ) -> ResultRecord {
        ResultRecord {
            record_id: id.into(),
            job_id: "j".into(),
            task_id: task.into(),
            attempt,
            slice_id: "board0-c0".into(),
            backend: "emulator".into(),
            cores: 8,
            kernel: "dgemm".into(),
            kernel_hash: "abc".into(),
            params: [("MB".to_string(), id.to_string())].into(),
            stats: gflops.map(|g| ResultStats {
                count: 3,
                median: 1.0 / g,
                ..Default::default()
            }),
            gflops,
            peak_fraction: gflops.map(|g| g / 100.0),
            valid,
            ..Default::default()
        }
        .with_derived_status()
    }

    #[test]
    fn the_best_is_the_fastest_trustworthy_record_of_an_accepted_attempt() {
        let tasks = [
            task("t1", 1, Some(v1::TaskStatus::Ok)),
            task("t2", 2, Some(v1::TaskStatus::Ok)),
        ];
        // Measured by t2's first attempt before it was moved: the baseline
        // of the job whatever the attempt, and no candidate.
        let mut baseline = record("base", "t2", 1, Some(1.0), true);
        baseline.baseline = true;
        let records = [
            record("a", "t1", 1, Some(5.0), true),
            // A stale attempt's record does not count, however fast.
            record("stale", "t2", 1, Some(50.0), true),
            record("b", "t2", 2, Some(7.0), true),
            record("bad", "t2", 2, None, false),
            baseline,
        ];
        let outcome = from_records(&tasks, &records);
        let best = outcome.best.clone().expect("a best");
        assert_eq!(best.record_ids, vec!["b".to_string()]);
        assert_eq!(best.gflops, 7.0);
        assert!((best.peak_percent - 7.0).abs() < 1e-9);
        assert_eq!(best.speedup_over_baseline, Some(7.0));
        assert_eq!(best.baseline_record_id, "base");
        assert_eq!(outcome.records, 3);
        assert_eq!(outcome.valid_records, 2);
        assert_eq!(
            status_counts(&outcome),
            [("benchmarked".to_string(), 2), ("invalid".to_string(), 1)].into()
        );
        assert!(outcome.failure_reason.is_empty());
    }

    #[test]
    fn an_edited_kernel_can_be_the_best_and_the_outcome_names_its_edit() {
        let tasks = [task("t1", 1, Some(v1::TaskStatus::Ok))];
        let pristine = record("p", "t1", 1, Some(5.0), true);
        let mut edited = record("e", "t1", 1, Some(9.0), true).with_source_diff(Some(
            "--- a/kernel.c\n+++ b/kernel.c\n@@ -1 +1 @@\n-a\n+b\n".into(),
        ));
        edited.kernel_hash = "edited-hash".into();
        // The same defines built from the pristine source do not back the
        // edited figure.
        edited.params = pristine.params.clone();
        let outcome = from_records(&tasks, &[pristine.clone(), edited.clone()]);
        let best = outcome.best.expect("a best");
        assert!(best.source_edited, "{best:?}");
        assert_eq!(best.kernel_hash, "edited-hash");
        assert_eq!(best.record_ids, vec!["e".to_string()]);
        assert_eq!(
            best.source_diff,
            edited.source_diff.clone().unwrap_or_default()
        );
        assert!(
            summary_line(&best).contains("built from edited sources (kernel hash edited-hash)")
        );
        // Pristine and faster: the outcome says nothing of edits.
        let faster = record("f", "t1", 1, Some(20.0), true);
        let best = from_records(&tasks, &[pristine, edited, faster])
            .best
            .expect("a best");
        assert!(!best.source_edited && best.source_diff.is_empty());
        assert!(!summary_line(&best).contains("edited"));
    }

    #[test]
    fn no_valid_measurement_is_a_failure_with_its_reason() {
        let failed = [task("t1", 1, Some(v1::TaskStatus::Failed))];
        let outcome = from_records(&failed, &[]);
        assert!(outcome.best.is_none());
        assert!(
            outcome.failure_reason.starts_with("every agent failed")
                && outcome.failure_reason.contains("compile failed"),
            "{}",
            outcome.failure_reason
        );
        let ok = [task("t1", 1, Some(v1::TaskStatus::Ok))];
        let invalid = [record("x", "t1", 1, None, false)];
        let outcome = from_records(&ok, &invalid);
        assert!(outcome.best.is_none());
        assert!(
            outcome.failure_reason.starts_with("no candidate valid"),
            "{}",
            outcome.failure_reason
        );
        let pending = [task("t1", 1, None)];
        assert!(
            from_records(&pending, &[])
                .failure_reason
                .starts_with("budget exhausted")
        );
        assert_eq!(
            from_records(&[], &[]).failure_reason,
            "no task was assigned"
        );
    }
}
