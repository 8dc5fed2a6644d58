//! The worker's side of the results store: every benchmark a session runs is
//! recorded with its provenance in the bus's `MTSWARM_MEASUREMENTS` stream
//! (so `mtswarm results`, reports and later jobs can find it), and the
//! `query_results` tool reads earlier records back through the same store.

use std::sync::Arc;

use mtswarm_bus::results::{Provenance, ResultQuery, ResultRecord, ResultsStore};
use mtswarm_core::event::{Event, EventKind};
use mtswarm_proto::v1;
use mtswarm_tools::results::{PastResult, ResultsQuery, ResultsSource, ResultsSourceError};

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

/// Records the measurements of one task attempt.
pub(crate) struct MeasurementRecorder {
    store: ResultsStore,
    provenance: Provenance,
}

impl MeasurementRecorder {
    pub(crate) fn new(
        store: ResultsStore,
        task: &v1::TaskAssignment,
        worker_id: &str,
        kernel: &str,
        model: &str,
    ) -> Self {
        Self {
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
            },
        }
    }

    /// Store the measurement carried by a benchmark result event, if any.
    /// A failure to record is logged, never fatal: the task's own result
    /// still carries the figures.
    pub(crate) async fn observe(&self, event: &Event) {
        let EventKind::ToolResult {
            call_id,
            name,
            data: Some(data),
            ..
        } = &event.kind
        else {
            return;
        };
        if name != BENCHMARK_TOOL {
            return;
        }
        let Some(measurement) = data.get("measurement") else {
            return;
        };
        let provenance = Provenance {
            call_id: call_id.clone(),
            ..self.provenance.clone()
        };
        match ResultRecord::from_measurement_json(measurement, &provenance) {
            Ok(record) => {
                if let Err(error) = self.store.record(&record).await {
                    tracing::warn!(%error, record_id = %record.record_id, "could not store the measurement");
                }
            }
            Err(error) => tracing::warn!(%error, "benchmark result is not a measurement record"),
        }
    }
}
