//! Metrics of every daemon, through the OpenTelemetry metrics API: what the
//! leader and the workers count, time and observe, recorded into typed
//! handles ([`Metrics`]) so that every name, unit and attribute is defined
//! once ([`catalog`]).
//!
//! Nothing here chooses where metrics go: [`provider::init_metrics`]
//! installs the process's meter provider (a Prometheus registry for the
//! daemon's `/metrics` endpoint, OTLP export when the standard variables
//! ask for it). Until it runs, the global meter is a no-op and recording
//! costs next to nothing, which is what library users and unit tests get.
//!
//! Series that exist from the start (a counter of quarantines at zero for
//! each slice) are initialized at zero by [`Metrics::init_leader_series`]
//! and [`Metrics::init_worker_series`], as Prometheus advises, so a rate
//! or a dashboard panel reads 0 rather than "no data" before the first
//! event.

pub mod catalog;
pub mod endpoint;
pub mod observe;
pub mod provider;

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};

use catalog::{
    ATTR_ATTEMPT, ATTR_DECISION, ATTR_ERROR_TYPE, ATTR_GENAI_MODEL, ATTR_GENAI_OPERATION,
    ATTR_GENAI_PROVIDER, ATTR_GENAI_TOKEN_TYPE, ATTR_OUTCOME, ATTR_SLICE, ATTR_STATE, ATTR_STATUS,
    ATTR_WORKER, InstrumentDef,
};

/// The instrumentation scope every instrument is created in.
pub const METER_NAME: &str = "mtswarm";

/// Final job states, as the `state` attribute spells them.
pub const FINAL_JOB_STATES: [&str; 3] = ["succeeded", "failed", "cancelled"];
/// Outcomes of a hardware run, as the `outcome` attribute spells them.
pub const KERNEL_RUN_OUTCOMES: [&str; 4] = ["valid", "invalid", "timeout", "error"];

/// Which attempt a fenced result belonged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedAttempt {
    /// The task's current attempt, which lost its slice.
    Current,
    /// An attempt the task has moved past.
    Stale,
}

impl FencedAttempt {
    fn as_str(self) -> &'static str {
        match self {
            Self::Current => "current",
            Self::Stale => "stale",
        }
    }
}

/// How an approval was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalDecisionKind {
    /// Approved by a person or a standing decision.
    Approved,
    /// Denied by a person or a standing decision.
    Denied,
    /// Nobody decided in time; the default verdict applied.
    TimedOut,
}

impl ApprovalDecisionKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::TimedOut => "timed_out",
        }
    }
}

/// One finished model call, for the GenAI client metrics.
#[derive(Debug, Clone, Copy)]
pub struct ModelCall<'a> {
    /// `gen_ai.provider.name`.
    pub provider: &'a str,
    /// `gen_ai.request.model`.
    pub model: &'a str,
    /// From the request to the whole answer.
    pub duration: Duration,
    /// Input and output tokens, when the model reported them.
    pub tokens: Option<(u64, u64)>,
    /// `error.type` of a failed call.
    pub error_type: Option<&'a str>,
}

/// The instruments the daemons record into (see [`catalog`] for each).
#[derive(Debug)]
pub struct Metrics {
    jobs_finished: Counter<u64>,
    tasks_assigned: Counter<u64>,
    tasks_completed: Counter<u64>,
    tasks_reassigned: Counter<u64>,
    tasks_fenced: Counter<u64>,
    task_duration: Histogram<f64>,
    slice_quarantines: Counter<u64>,
    kernel_runs: Counter<u64>,
    approvals_pending: UpDownCounter<i64>,
    approval_wait: Histogram<f64>,
    genai_duration: Histogram<f64>,
    genai_tokens: Histogram<u64>,
    model_cost: Counter<f64>,
}

fn counter(meter: &Meter, def: &InstrumentDef) -> Counter<u64> {
    meter
        .u64_counter(def.name)
        .with_unit(def.unit)
        .with_description(def.description)
        .build()
}

fn histogram(meter: &Meter, def: &InstrumentDef, buckets: &[f64]) -> Histogram<f64> {
    meter
        .f64_histogram(def.name)
        .with_unit(def.unit)
        .with_description(def.description)
        .with_boundaries(buckets.to_vec())
        .build()
}

impl Metrics {
    /// The instruments, created in `meter`.
    pub fn new(meter: &Meter) -> Self {
        Self {
            jobs_finished: counter(meter, &catalog::JOBS_FINISHED),
            tasks_assigned: counter(meter, &catalog::TASKS_ASSIGNED),
            tasks_completed: counter(meter, &catalog::TASKS_COMPLETED),
            tasks_reassigned: counter(meter, &catalog::TASKS_REASSIGNED),
            tasks_fenced: counter(meter, &catalog::TASKS_FENCED),
            task_duration: histogram(meter, &catalog::TASK_DURATION, catalog::WAIT_BUCKETS),
            slice_quarantines: counter(meter, &catalog::SLICE_QUARANTINES),
            kernel_runs: counter(meter, &catalog::KERNEL_RUNS),
            approvals_pending: meter
                .i64_up_down_counter(catalog::APPROVALS_PENDING.name)
                .with_unit(catalog::APPROVALS_PENDING.unit)
                .with_description(catalog::APPROVALS_PENDING.description)
                .build(),
            approval_wait: histogram(meter, &catalog::APPROVAL_WAIT, catalog::WAIT_BUCKETS),
            genai_duration: histogram(
                meter,
                &catalog::GENAI_OPERATION_DURATION,
                catalog::GENAI_DURATION_BUCKETS,
            ),
            genai_tokens: meter
                .u64_histogram(catalog::GENAI_TOKEN_USAGE.name)
                .with_unit(catalog::GENAI_TOKEN_USAGE.unit)
                .with_description(catalog::GENAI_TOKEN_USAGE.description)
                .with_boundaries(catalog::GENAI_TOKEN_BUCKETS.to_vec())
                .build(),
            model_cost: meter
                .f64_counter(catalog::MODEL_COST.name)
                .with_unit(catalog::MODEL_COST.unit)
                .with_description(catalog::MODEL_COST.description)
                .build(),
        }
    }

    /// Zero series of the leader's counters, so they read 0 before the
    /// first event.
    pub fn init_leader_series(&self) {
        for state in FINAL_JOB_STATES {
            self.jobs_finished
                .add(0, &[KeyValue::new(ATTR_STATE, state)]);
        }
        self.tasks_reassigned.add(0, &[]);
        for attempt in [FencedAttempt::Current, FencedAttempt::Stale] {
            self.tasks_fenced
                .add(0, &[KeyValue::new(ATTR_ATTEMPT, attempt.as_str())]);
        }
    }

    /// Zero series of a worker daemon's counters for each of its slices.
    pub fn init_worker_series<'a>(&self, worker: &str, slices: impl IntoIterator<Item = &'a str>) {
        self.approvals_pending
            .add(0, &[KeyValue::new(ATTR_WORKER, worker.to_string())]);
        for slice in slices {
            let attrs = slice_attrs(worker, slice);
            self.slice_quarantines.add(0, &attrs);
            for outcome in KERNEL_RUN_OUTCOMES {
                let mut attrs = attrs.to_vec();
                attrs.push(KeyValue::new(ATTR_OUTCOME, outcome));
                self.kernel_runs.add(0, &attrs);
            }
        }
    }

    /// A job reached final `state` (`succeeded`, `failed`, `cancelled`).
    pub fn job_finished(&self, state: &str) {
        self.jobs_finished
            .add(1, &[KeyValue::new(ATTR_STATE, state.to_string())]);
    }

    /// A task's first attempt was published to `worker`.
    pub fn task_assigned(&self, worker: &str) {
        self.tasks_assigned
            .add(1, &[KeyValue::new(ATTR_WORKER, worker.to_string())]);
    }

    /// A task's result was accepted with `status`, `latency` after its
    /// attempt was assigned (when known).
    pub fn task_completed(&self, status: &str, latency: Option<Duration>) {
        let attrs = [KeyValue::new(ATTR_STATUS, status.to_string())];
        self.tasks_completed.add(1, &attrs);
        if let Some(latency) = latency {
            self.task_duration.record(latency.as_secs_f64(), &attrs);
        }
    }

    /// A task was published again as a new attempt.
    pub fn task_reassigned(&self) {
        self.tasks_reassigned.add(1, &[]);
    }

    /// A result was fenced off.
    pub fn task_fenced(&self, attempt: FencedAttempt) {
        self.tasks_fenced
            .add(1, &[KeyValue::new(ATTR_ATTEMPT, attempt.as_str())]);
    }

    /// A hardware run on `slice` ended with `outcome` (one of
    /// [`KERNEL_RUN_OUTCOMES`]).
    pub fn kernel_run(&self, worker: &str, slice: &str, outcome: &'static str) {
        let mut attrs = slice_attrs(worker, slice).to_vec();
        attrs.push(KeyValue::new(ATTR_OUTCOME, outcome));
        self.kernel_runs.add(1, &attrs);
    }

    /// `slice` was quarantined by `worker`.
    pub fn slice_quarantined(&self, worker: &str, slice: &str) {
        self.slice_quarantines.add(1, &slice_attrs(worker, slice));
    }

    /// `delta` more (or, negative, fewer) tool calls of `worker`'s sessions
    /// wait for a decision.
    pub fn approvals_waiting(&self, worker: &str, delta: i64) {
        self.approvals_pending
            .add(delta, &[KeyValue::new(ATTR_WORKER, worker.to_string())]);
    }

    /// An approval was decided `wait` after it was requested.
    pub fn approval_decided(&self, decision: ApprovalDecisionKind, wait: Duration) {
        self.approval_wait.record(
            wait.as_secs_f64(),
            &[KeyValue::new(ATTR_DECISION, decision.as_str())],
        );
    }

    /// A model call ended (the GenAI client metrics).
    pub fn model_call(&self, call: ModelCall<'_>) {
        let mut attrs = vec![
            KeyValue::new(ATTR_GENAI_OPERATION, "chat"),
            KeyValue::new(ATTR_GENAI_PROVIDER, call.provider.to_string()),
            KeyValue::new(ATTR_GENAI_MODEL, call.model.to_string()),
        ];
        if let Some((input, output)) = call.tokens {
            for (kind, count) in [("input", input), ("output", output)] {
                let mut token_attrs = attrs.clone();
                token_attrs.push(KeyValue::new(ATTR_GENAI_TOKEN_TYPE, kind));
                self.genai_tokens.record(count, &token_attrs);
            }
        }
        if let Some(error_type) = call.error_type {
            attrs.push(KeyValue::new(ATTR_ERROR_TYPE, error_type.to_string()));
        }
        self.genai_duration
            .record(call.duration.as_secs_f64(), &attrs);
    }

    /// A finished job's tokens of `model` cost `cost` (estimated, in the
    /// price table's currency).
    pub fn model_cost(&self, model: &str, cost: f64) {
        if cost.is_finite() && cost > 0.0 {
            self.model_cost
                .add(cost, &[KeyValue::new(ATTR_GENAI_MODEL, model.to_string())]);
        }
    }
}

fn slice_attrs(worker: &str, slice: &str) -> [KeyValue; 2] {
    [
        KeyValue::new(ATTR_WORKER, worker.to_string()),
        KeyValue::new(ATTR_SLICE, slice.to_string()),
    ]
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's instruments, created from the global meter provider on
/// first use: [`provider::init_metrics`] must run before (it does, first
/// thing in the daemons' `main`), or they stay no-ops.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(|| Metrics::new(&opentelemetry::global::meter(METER_NAME)))
}

/// True once [`metrics`] created the instruments.
pub(crate) fn instruments_created() -> bool {
    METRICS.get().is_some()
}
