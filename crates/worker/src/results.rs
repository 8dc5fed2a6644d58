//! The worker's side of the results store: every candidate a session
//! touches (benchmarked, or compiled, failed, invalid, screened, pruned, not
//! run, with its reason) is recorded with its provenance in the bus's
//! `MTSWARM_MEASUREMENTS` stream
//! (so `mtswarm results`, reports and later jobs can find it), and the
//! `query_results` tool reads earlier records back through the same store.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use mtswarm_bus::results::{
    CandidateStatus, Provenance, ResultQuery, ResultRecord, ResultsStore, canonical_slice_id,
    unix_millis,
};
use mtswarm_core::event::{Event, EventKind};
use mtswarm_proto::v1;
use mtswarm_tools::results::{PastResult, ResultsQuery, ResultsSource, ResultsSourceError};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::text::first_line;

/// How long a record is retried while NATS is unreachable.
const RECORD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The benchmark tool's name: its `data.measurement` is what gets recorded.
const BENCHMARK_TOOL: &str = "benchmark";

/// `query_results` over the bus store.
pub(crate) struct BusResults {
    store: ResultsStore,
}

impl BusResults {
    pub(crate) fn new(store: ResultsStore) -> Arc<Self> {
        Arc::new(Self { store })
    }
}

#[async_trait::async_trait]
impl ResultsSource for BusResults {
    async fn query(&self, query: &ResultsQuery) -> Result<Vec<PastResult>, ResultsSourceError> {
        let records = self
            .store
            .query(&ResultQuery {
                kernel: query.kernel.clone(),
                kernel_hash: query.kernel_hash.clone(),
                limit: query.limit.max(1),
                ..ResultQuery::default()
            })
            .await
            .map_err(|e| ResultsSourceError(e.to_string()))?;
        // Both types describe the same record with the same field names; the
        // tools crate does not depend on the bus, so convert through JSON.
        records
            .into_iter()
            .map(|record| {
                serde_json::to_value(&record)
                    .and_then(serde_json::from_value)
                    .map_err(|e| ResultsSourceError(format!("result record shape: {e}")))
            })
            .collect()
    }
}

/// Records every candidate of one task attempt: each benchmark as it
/// happens (a measurement record), and at the end of the attempt one record
/// per other candidate the agent touched (compiled, failed to compile,
/// invalid, screened) or that its answer lists as skipped (pruned, not
/// run), each with its status and reason. A candidate is its `-D` map and
/// its source (the diff of the kernel sources it was built from against the
/// pristine kernel, empty for the pristine one); one that was benchmarked
/// gets no second record.
pub(crate) struct MeasurementRecorder {
    store: ResultsStore,
    provenance: Provenance,
    ledger: Mutex<Ledger>,
    /// The session's tools: the diff of a failed build of edited sources
    /// (its error names only the build).
    tools: Arc<mtswarm_tools::ToolEnv>,
}

/// What the attempt did to each candidate so far.
#[derive(Default)]
struct Ledger {
    /// Tool call id -> (tool, arguments), for results that do not repeat
    /// their arguments (a failed compile).
    calls: HashMap<String, (String, Value)>,
    /// Artifact id -> the candidate it builds.
    artifacts: HashMap<String, CandidateId>,
    candidates: BTreeMap<CandidateId, Touched>,
    /// Backend and cores seen in measurements (the other records have none).
    backend: String,
    cores: u32,
}

/// One candidate: its `-D` map and its source diff (empty = pristine).
type CandidateId = (BTreeMap<String, String>, String);

#[derive(Debug, Clone)]
struct Touched {
    status: CandidateStatus,
    reason: Option<String>,
    kernel_hash: String,
    /// A measurement record exists (benchmarked, flagged or invalid).
    recorded: bool,
}

fn defines_of(value: &Value) -> Option<BTreeMap<String, String>> {
    let map = value.as_object()?;
    Some(
        map.iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect(),
    )
}

/// `cand-<16 hex>`: a stable id of a candidate (defines and source) within
/// an attempt.
fn candidate_key((defines, source): &CandidateId) -> String {
    let mut text: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
    if !source.is_empty() {
        text.push_str(source);
    }
    let digest = Sha256::digest(text.as_bytes());
    format!("cand-{}", hex_prefix(&digest, 8))
}

fn hex_prefix(bytes: &[u8], n: usize) -> String {
    bytes.iter().take(n).map(|b| format!("{b:02x}")).collect()
}

impl Ledger {
    /// Notes what `status` says about `defines`; a measured candidate keeps
    /// its measurement's status.
    fn touch(
        &mut self,
        candidate: CandidateId,
        status: CandidateStatus,
        reason: Option<String>,
        kernel_hash: &str,
    ) {
        let entry = self.candidates.entry(candidate).or_insert(Touched {
            status,
            reason: None,
            kernel_hash: String::new(),
            recorded: false,
        });
        if !kernel_hash.is_empty() {
            entry.kernel_hash = kernel_hash.to_string();
        }
        if entry.recorded {
            return;
        }
        entry.status = status;
        entry.reason = reason;
    }

    /// The candidate a call worked on, from its arguments: its artifact's,
    /// else its defines with the pristine source (a failed compile says
    /// nothing about its source).
    fn call_candidate(&self, call_id: &str) -> Option<CandidateId> {
        let (_, args) = self.calls.get(call_id)?;
        if let Some(known) = args["artifact"]
            .as_str()
            .and_then(|a| self.artifacts.get(a))
        {
            return Some(known.clone());
        }
        defines_of(&args["defines"]).map(|d| (d, String::new()))
    }

    /// The candidate of a tool result's data: its artifact's when known,
    /// else its defines (and `source_diff`, when it says) or the call's.
    fn data_candidate(&self, call_id: &str, data: Option<&Value>) -> Option<CandidateId> {
        if let Some(known) = data
            .and_then(|d| d["artifact"].as_str())
            .and_then(|a| self.artifacts.get(a))
        {
            return Some(known.clone());
        }
        let source = data
            .and_then(|d| d["source_diff"].as_str())
            .unwrap_or_default()
            .to_owned();
        match data.and_then(|d| defines_of(&d["defines"])) {
            Some(defines) => Some((defines, source)),
            None => self.call_candidate(call_id),
        }
    }
}

impl MeasurementRecorder {
    pub(crate) fn new(
        store: ResultsStore,
        task: &v1::TaskAssignment,
        worker_id: &str,
        kernel: &str,
        model: &str,
        tools: Arc<mtswarm_tools::ToolEnv>,
    ) -> Self {
        Self {
            tools,
            store,
            provenance: Provenance {
                job_id: task.job_id.clone(),
                task_id: task.task_id.clone(),
                attempt: task.attempt,
                agent_id: task.agent_id.clone(),
                session_id: task.session_id.clone(),
                worker_id: worker_id.to_owned(),
                slice_id: task.slice_id.clone(),
                kernel: kernel.to_owned(),
                model: model.to_owned(),
                call_id: String::new(),
                timestamp_ms: None,
                grant: task
                    .grant
                    .as_ref()
                    .map(mtswarm_bus::results::RecordGrant::of),
            },
            ledger: Mutex::new(Ledger::default()),
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes what one engine event says about the candidates, and stores
    /// the measurement a benchmark result carries (retried through NATS
    /// outages; a record that still fails is logged, never fatal).
    pub(crate) async fn observe(&self, event: &Event) {
        let (call_id, name, ok, content, data) = match &event.kind {
            EventKind::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                self.ledger()
                    .calls
                    .insert(call_id.clone(), (name.clone(), arguments.clone()));
                return;
            }
            EventKind::ToolResult {
                call_id,
                name,
                ok,
                content,
                data,
                ..
            } => (call_id, name, *ok, content, data.as_ref()),
            _ => return,
        };
        match name.as_str() {
            BENCHMARK_TOOL => self.benchmarked(call_id, ok, content, data).await,
            "compile" | "wait_build" => self.compiled(call_id, ok, content, data),
            "validate" => self.validated(call_id, content, data),
            _ => {}
        }
    }

    fn compiled(&self, call_id: &str, ok: bool, content: &str, data: Option<&Value>) {
        let mut ledger = self.ledger();
        let artifact = data.and_then(|d| d["artifact"].as_str()).map(str::to_owned);
        let source = data
            .and_then(|d| d["source_diff"].as_str())
            .unwrap_or_default()
            .to_owned();
        let defines = data
            .and_then(|d| defines_of(&d["defines"]))
            .map(|d| (d, source))
            .or_else(|| ledger.call_candidate(call_id));
        let Some(defines) = defines else { return };
        if let Some(artifact) = artifact {
            ledger.artifacts.insert(artifact, defines.clone());
        }
        let background = data.is_some_and(|d| d["background"] == true);
        if ok && !background {
            let hash = data
                .and_then(|d| d["kernel_hash"].as_str())
                .unwrap_or_default()
                .to_owned();
            ledger.touch(defines, CandidateStatus::Compiled, None, &hash);
        } else if !ok && !content.contains("unknown artifact") {
            // An edited kernel that did not build is that edit's candidate.
            let mut defines = defines;
            if let Some(source) = mtswarm_tools::source_diff::failed_edit_build(content)
                .and_then(|build| self.tools.failed_build_source(build))
            {
                defines.1 = source.diff;
            }
            ledger.touch(
                defines,
                CandidateStatus::CompileFailed,
                Some(first_line(content)),
                "",
            );
        }
    }

    fn validated(&self, call_id: &str, content: &str, data: Option<&Value>) {
        let mut ledger = self.ledger();
        let defines = ledger.data_candidate(call_id, data);
        let Some(defines) = defines else { return };
        let hash = data
            .and_then(|d| d["kernel_hash"].as_str())
            .unwrap_or_default()
            .to_owned();
        match data.map(|d| d["valid"] == true) {
            Some(true) => ledger.touch(defines, CandidateStatus::Screened, None, &hash),
            Some(false) => {
                let reason = data
                    .and_then(|d| d["error"].as_str())
                    .map(first_line)
                    .unwrap_or_else(|| first_line(content));
                ledger.touch(defines, CandidateStatus::Invalid, Some(reason), &hash);
            }
            // Not run (denied, refused, artifact lost): nothing learned.
            None => {}
        }
    }

    async fn benchmarked(&self, call_id: &str, ok: bool, content: &str, data: Option<&Value>) {
        let Some(measurement) = data.and_then(|d| d.get("measurement")) else {
            if !ok && let Some(defines) = self.ledger().call_candidate(call_id) {
                let status = if content.contains("timed out") {
                    CandidateStatus::TimedOut
                } else {
                    CandidateStatus::Invalid
                };
                self.ledger()
                    .touch(defines, status, Some(first_line(content)), "");
            }
            return;
        };
        let provenance = Provenance {
            call_id: call_id.to_owned(),
            ..self.provenance.clone()
        };
        // The diff of the sources the artifact was built from (none for
        // the pristine kernel).
        let source = data
            .and_then(|d| d.pointer("/source/diff"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        match ResultRecord::from_measurement_json(measurement, &provenance) {
            Ok(record) => {
                let record = record.with_source_diff(Some(source.clone()));
                {
                    let mut ledger = self.ledger();
                    ledger.backend = record.backend.clone();
                    ledger.cores = record.cores;
                    let candidate = (record.params.clone(), source);
                    ledger.touch(
                        candidate.clone(),
                        record.status,
                        record.reason.clone(),
                        &record.kernel_hash,
                    );
                    if let Some(entry) = ledger.candidates.get_mut(&candidate) {
                        entry.recorded = true;
                    }
                }
                self.store_patiently(&record).await;
            }
            Err(error) => tracing::warn!(%error, "benchmark result is not a measurement record"),
        }
    }

    /// Stores the tune.toml baseline's measurement, marked as the baseline
    /// (not a candidate of the agent's).
    pub(crate) async fn baseline(&self, measurement: &mtswarm_hw::Measurement) {
        let value = match serde_json::to_value(measurement) {
            Ok(value) => value,
            Err(error) => {
                tracing::warn!(%error, "baseline measurement not serializable");
                return;
            }
        };
        let provenance = Provenance {
            call_id: "baseline".to_owned(),
            ..self.provenance.clone()
        };
        match ResultRecord::from_measurement_json(&value, &provenance) {
            Ok(mut record) => {
                record.baseline = true;
                self.store_patiently(&record).await;
            }
            Err(error) => tracing::warn!(%error, "baseline measurement is not a record"),
        }
    }

    /// The attempt ended: one record per candidate it touched without a
    /// measurement, and per candidate its answer lists as skipped.
    pub(crate) async fn finish(&self, answer: Option<&Value>) {
        let records: Vec<ResultRecord> = {
            let mut ledger = self.ledger();
            for candidate in answer
                .and_then(|a| a["candidates"].as_array())
                .into_iter()
                .flatten()
            {
                let Some(defines) = defines_of(&candidate["defines"]) else {
                    continue;
                };
                let status = CandidateStatus::of_candidate_json(candidate);
                // What the tools saw wins over the answer's account, except
                // that a candidate built ahead and then never run is better
                // described by why it was not run (pruned, budget spent).
                let defines = (defines, String::new());
                let seen = ledger.candidates.get(&defines).map(|t| t.status);
                let overrides = matches!(seen, None | Some(CandidateStatus::Compiled));
                if !overrides
                    || matches!(
                        status,
                        CandidateStatus::Unknown | CandidateStatus::Benchmarked
                    )
                {
                    continue;
                }
                let reason = ["skipped", "failure"]
                    .iter()
                    .filter_map(|k| candidate[*k].as_str())
                    .map(first_line)
                    .find(|r| !r.is_empty());
                ledger.touch(defines, status, reason, "");
            }
            let now = unix_millis(std::time::SystemTime::now());
            ledger
                .candidates
                .iter()
                .filter(|(_, t)| !t.recorded)
                .map(|(candidate, touched)| {
                    ResultRecord {
                        record_id: Provenance {
                            call_id: candidate_key(candidate),
                            ..self.provenance.clone()
                        }
                        .record_id(),
                        job_id: self.provenance.job_id.clone(),
                        task_id: self.provenance.task_id.clone(),
                        attempt: self.provenance.attempt,
                        agent_id: self.provenance.agent_id.clone(),
                        session_id: self.provenance.session_id.clone(),
                        worker_id: self.provenance.worker_id.clone(),
                        slice_id: canonical_slice_id(&self.provenance.slice_id),
                        backend: ledger.backend.clone(),
                        kernel: self.provenance.kernel.clone(),
                        kernel_hash: touched.kernel_hash.clone(),
                        params: candidate.0.clone(),
                        cores: ledger.cores,
                        // A screened candidate ran with a right answer.
                        valid: touched.status == CandidateStatus::Screened,
                        error: touched.reason.clone().filter(|_| {
                            matches!(
                                touched.status,
                                CandidateStatus::CompileFailed
                                    | CandidateStatus::Invalid
                                    | CandidateStatus::TimedOut
                            )
                        }),
                        model: if self.provenance.model.is_empty() {
                            "builtin".to_string()
                        } else {
                            self.provenance.model.clone()
                        },
                        timestamp_ms: now,
                        status: touched.status,
                        reason: touched.reason.clone(),
                        grant: self.provenance.grant.clone(),
                        ..ResultRecord::default()
                    }
                    .with_source_diff(Some(candidate.1.clone()))
                })
                .collect()
        };
        for record in records {
            self.store_patiently(&record).await;
        }
    }

    /// Stores a record, retrying with backoff through a NATS outage: the
    /// job's outcome is computed from these records, so one lost to a
    /// restart would turn a measured job into a failed one. Gives up (and
    /// logs) after [`RECORD_PATIENCE`]; the record id deduplicates retries.
    async fn store_patiently(&self, record: &ResultRecord) {
        let give_up = tokio::time::Instant::now() + RECORD_PATIENCE;
        let mut backoff = mtswarm_bus::Backoff::new(
            std::time::Duration::from_millis(100),
            std::time::Duration::from_secs(2),
        );
        loop {
            match self.store.record(record).await {
                Ok(_) => return,
                Err(error) if tokio::time::Instant::now() < give_up => {
                    tracing::debug!(%error, record_id = %record.record_id, "record not stored yet; retrying");
                    backoff.sleep().await;
                }
                Err(error) => {
                    tracing::warn!(%error, record_id = %record.record_id, "could not store the candidate record");
                    return;
                }
            }
        }
    }
}
