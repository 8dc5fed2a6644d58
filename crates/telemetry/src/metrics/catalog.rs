//! Every metric the daemons export, in one table: the OpenTelemetry name,
//! kind, unit and description each instrument is built with, and the name
//! the Prometheus endpoint gives it (the OpenTelemetry-to-Prometheus rules:
//! dots become underscores, the unit becomes a suffix, counters end in
//! `_total`; a unit in braces such as `{task}` is an annotation and adds
//! nothing). Dashboards, alert rules and the tests read the names from here,
//! and a test checks the Prometheus names against a real scrape.
//!
//! Attributes stay bounded: states, outcomes, model names, worker and slice
//! ids, never job, task or session ids.

/// The kind of an instrument (the OpenTelemetry API's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstrumentKind {
    /// A monotonic sum recorded as it happens (Prometheus counter).
    Counter,
    /// A monotonic sum read by a callback (Prometheus counter).
    ObservableCounter,
    /// A sum that goes up and down (Prometheus gauge).
    UpDownCounter,
    /// A value read by a callback (Prometheus gauge).
    ObservableGauge,
    /// A distribution (Prometheus histogram: `_bucket`, `_sum`, `_count`).
    Histogram,
}

/// One instrument's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstrumentDef {
    /// The OpenTelemetry instrument name.
    pub name: &'static str,
    /// Its kind.
    pub kind: InstrumentKind,
    /// Its UCUM unit (`s`, `1`, or an annotation such as `{task}`).
    pub unit: &'static str,
    /// What it measures.
    pub description: &'static str,
    /// The attribute keys it is recorded with.
    pub attributes: &'static [&'static str],
    /// The metric family name on the Prometheus endpoint.
    pub prometheus: &'static str,
}

impl InstrumentDef {
    /// The series names a Prometheus query can use for it: the family
    /// itself, and for a histogram its `_bucket`, `_sum` and `_count`.
    pub fn prometheus_series(&self) -> Vec<String> {
        match self.kind {
            InstrumentKind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|suffix| format!("{}{suffix}", self.prometheus))
                .collect(),
            _ => vec![self.prometheus.to_string()],
        }
    }
}

/// Attribute: a job's state (`queued`, `running`, `succeeded`, `failed`,
/// `cancelled`).
pub const ATTR_STATE: &str = "state";
/// Attribute: how a task attempt ended (`ok`, `failed`, `cancelled`).
pub const ATTR_STATUS: &str = "status";
/// Attribute: which attempt a fenced result belonged to (`current`, `stale`).
pub const ATTR_ATTEMPT: &str = "attempt";
/// Attribute: how a hardware run ended (`valid`, `invalid`, `timeout`,
/// `error`).
pub const ATTR_OUTCOME: &str = "outcome";
/// Attribute: how an approval was decided (`approved`, `denied`,
/// `timed_out`).
pub const ATTR_DECISION: &str = "decision";
/// Attribute: the worker daemon's id.
pub const ATTR_WORKER: &str = "worker.id";
/// Attribute: the slice's bus id (`board0-c1`).
pub const ATTR_SLICE: &str = "slice.id";
/// GenAI attribute: the operation (`chat`).
pub const ATTR_GENAI_OPERATION: &str = "gen_ai.operation.name";
/// GenAI attribute: who serves the model.
pub const ATTR_GENAI_PROVIDER: &str = "gen_ai.provider.name";
/// GenAI attribute: the model asked for.
pub const ATTR_GENAI_MODEL: &str = "gen_ai.request.model";
/// GenAI attribute: `input` or `output` tokens.
pub const ATTR_GENAI_TOKEN_TYPE: &str = "gen_ai.token.type";
/// Attribute: a failure's low-cardinality kind.
pub const ATTR_ERROR_TYPE: &str = "error.type";

/// Jobs this leader holds, by state (`queued`, `running`).
pub const JOBS: InstrumentDef = InstrumentDef {
    name: "mtswarm.jobs",
    kind: InstrumentKind::ObservableGauge,
    unit: "{job}",
    description: "Jobs this leader runs or holds queued, by state.",
    attributes: &[ATTR_STATE],
    prometheus: "mtswarm_jobs",
};

/// Jobs that reached a final state, by that state.
pub const JOBS_FINISHED: InstrumentDef = InstrumentDef {
    name: "mtswarm.jobs.finished",
    kind: InstrumentKind::Counter,
    unit: "{job}",
    description: "Jobs that reached a final state on this leader, by state.",
    attributes: &[ATTR_STATE],
    prometheus: "mtswarm_jobs_finished_total",
};

/// Tasks published to a worker (first attempts).
pub const TASKS_ASSIGNED: InstrumentDef = InstrumentDef {
    name: "mtswarm.tasks.assigned",
    kind: InstrumentKind::Counter,
    unit: "{task}",
    description: "Tasks assigned to worker agents (first attempts), by worker.",
    attributes: &[ATTR_WORKER],
    prometheus: "mtswarm_tasks_assigned_total",
};

/// Task results accepted, by the attempt's status.
pub const TASKS_COMPLETED: InstrumentDef = InstrumentDef {
    name: "mtswarm.tasks.completed",
    kind: InstrumentKind::Counter,
    unit: "{task}",
    description: "Task results accepted, by the attempt's status.",
    attributes: &[ATTR_STATUS],
    prometheus: "mtswarm_tasks_completed_total",
};

/// Tasks published again as a new attempt.
pub const TASKS_REASSIGNED: InstrumentDef = InstrumentDef {
    name: "mtswarm.tasks.reassigned",
    kind: InstrumentKind::Counter,
    unit: "{task}",
    description: "Tasks published again as a new attempt on another slice or session.",
    attributes: &[],
    prometheus: "mtswarm_tasks_reassigned_total",
};

/// Results dropped by fencing: a stale attempt's, or a fenced current one.
pub const TASKS_FENCED: InstrumentDef = InstrumentDef {
    name: "mtswarm.tasks.fenced",
    kind: InstrumentKind::Counter,
    unit: "{result}",
    description: "Task results fenced off: of a stale attempt, or a current attempt that lost its slice.",
    attributes: &[ATTR_ATTEMPT],
    prometheus: "mtswarm_tasks_fenced_total",
};

/// From a task's publish to its accepted result.
pub const TASK_DURATION: InstrumentDef = InstrumentDef {
    name: "mtswarm.task.assign_to_result.duration",
    kind: InstrumentKind::Histogram,
    unit: "s",
    description: "Time from a task attempt's assignment to its accepted result.",
    attributes: &[ATTR_STATUS],
    prometheus: "mtswarm_task_assign_to_result_duration_seconds",
};

/// Sessions a worker daemon runs.
pub const WORKER_SESSIONS: InstrumentDef = InstrumentDef {
    name: "mtswarm.worker.sessions",
    kind: InstrumentKind::ObservableGauge,
    unit: "{session}",
    description: "Agent sessions the worker daemon holds.",
    attributes: &[ATTR_WORKER],
    prometheus: "mtswarm_worker_sessions",
};

/// Time a slice's hardware lock was held (its rate is the busy ratio).
pub const SLICE_LOCK_BUSY: InstrumentDef = InstrumentDef {
    name: "mtswarm.slice.lock.busy_time",
    kind: InstrumentKind::ObservableCounter,
    unit: "s",
    description: "Time the slice's hardware lock was held; its rate is the slice's busy ratio.",
    attributes: &[ATTR_WORKER, ATTR_SLICE],
    prometheus: "mtswarm_slice_lock_busy_time_seconds_total",
};

/// Time callers queued for a slice's hardware lock.
pub const SLICE_LOCK_WAIT: InstrumentDef = InstrumentDef {
    name: "mtswarm.slice.lock.wait_time",
    kind: InstrumentKind::ObservableCounter,
    unit: "s",
    description: "Time callers queued for the slice's hardware lock, summed over acquisitions.",
    attributes: &[ATTR_WORKER, ATTR_SLICE],
    prometheus: "mtswarm_slice_lock_wait_time_seconds_total",
};

/// Acquisitions of a slice's hardware lock.
pub const SLICE_LOCK_ACQUISITIONS: InstrumentDef = InstrumentDef {
    name: "mtswarm.slice.lock.acquisitions",
    kind: InstrumentKind::ObservableCounter,
    unit: "{acquisition}",
    description: "Acquisitions of the slice's hardware lock.",
    attributes: &[ATTR_WORKER, ATTR_SLICE],
    prometheus: "mtswarm_slice_lock_acquisitions_total",
};

/// Slices quarantined after failed runs in a row.
pub const SLICE_QUARANTINES: InstrumentDef = InstrumentDef {
    name: "mtswarm.slice.quarantines",
    kind: InstrumentKind::Counter,
    unit: "{quarantine}",
    description: "Quarantines of a slice by its worker after failed hardware runs in a row.",
    attributes: &[ATTR_WORKER, ATTR_SLICE],
    prometheus: "mtswarm_slice_quarantines_total",
};

/// Hardware runs of kernels, by outcome.
pub const KERNEL_RUNS: InstrumentDef = InstrumentDef {
    name: "mtswarm.kernel.runs",
    kind: InstrumentKind::Counter,
    unit: "{run}",
    description: "Kernel runs on a slice, by outcome (valid, invalid, timeout, error).",
    attributes: &[ATTR_WORKER, ATTR_SLICE, ATTR_OUTCOME],
    prometheus: "mtswarm_kernel_runs_total",
};

/// Tool calls waiting for a human decision.
pub const APPROVALS_PENDING: InstrumentDef = InstrumentDef {
    name: "mtswarm.approvals.pending",
    kind: InstrumentKind::UpDownCounter,
    unit: "{approval}",
    description: "Tool calls of the worker's sessions waiting for an approval decision.",
    attributes: &[ATTR_WORKER],
    prometheus: "mtswarm_approvals_pending",
};

/// From an approval request to its decision.
pub const APPROVAL_WAIT: InstrumentDef = InstrumentDef {
    name: "mtswarm.approval.wait.duration",
    kind: InstrumentKind::Histogram,
    unit: "s",
    description: "Time from an approval request to its decision, by decision.",
    attributes: &[ATTR_DECISION],
    prometheus: "mtswarm_approval_wait_duration_seconds",
};

/// GenAI client metric: duration of a model call (semantic conventions).
pub const GENAI_OPERATION_DURATION: InstrumentDef = InstrumentDef {
    name: "gen_ai.client.operation.duration",
    kind: InstrumentKind::Histogram,
    unit: "s",
    description: "GenAI operation duration.",
    attributes: &[
        ATTR_GENAI_OPERATION,
        ATTR_GENAI_PROVIDER,
        ATTR_GENAI_MODEL,
        ATTR_ERROR_TYPE,
    ],
    prometheus: "gen_ai_client_operation_duration_seconds",
};

/// GenAI client metric: tokens per model call (semantic conventions).
pub const GENAI_TOKEN_USAGE: InstrumentDef = InstrumentDef {
    name: "gen_ai.client.token.usage",
    kind: InstrumentKind::Histogram,
    unit: "{token}",
    description: "Number of input and output tokens used.",
    attributes: &[
        ATTR_GENAI_OPERATION,
        ATTR_GENAI_PROVIDER,
        ATTR_GENAI_MODEL,
        ATTR_GENAI_TOKEN_TYPE,
    ],
    prometheus: "gen_ai_client_token_usage",
};

/// Estimated cost of the model tokens of finished jobs (the leader's price
/// table), by model. Only models the table prices are recorded, so the
/// label's values are bounded by that table.
pub const MODEL_COST: InstrumentDef = InstrumentDef {
    name: "mtswarm.model.cost",
    kind: InstrumentKind::Counter,
    unit: "{currency}",
    description: "Estimated cost of the model tokens of finished jobs, in the price table's currency, by model.",
    attributes: &[ATTR_GENAI_MODEL],
    prometheus: "mtswarm_model_cost_total",
};

/// Every instrument, leader's, worker's and the model calls'.
pub const ALL: &[InstrumentDef] = &[
    JOBS,
    JOBS_FINISHED,
    TASKS_ASSIGNED,
    TASKS_COMPLETED,
    TASKS_REASSIGNED,
    TASKS_FENCED,
    TASK_DURATION,
    WORKER_SESSIONS,
    SLICE_LOCK_BUSY,
    SLICE_LOCK_WAIT,
    SLICE_LOCK_ACQUISITIONS,
    SLICE_QUARANTINES,
    KERNEL_RUNS,
    APPROVALS_PENDING,
    APPROVAL_WAIT,
    GENAI_OPERATION_DURATION,
    GENAI_TOKEN_USAGE,
    MODEL_COST,
];

/// Every series name a query may use (see [`InstrumentDef::prometheus_series`]).
pub fn prometheus_series() -> Vec<String> {
    ALL.iter()
        .flat_map(InstrumentDef::prometheus_series)
        .collect()
}

/// Bucket bounds of the GenAI operation duration, seconds (the semantic
/// conventions' advice).
pub const GENAI_DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// Bucket bounds of GenAI token usage (the semantic conventions' advice).
pub const GENAI_TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// Bucket bounds of the waits people and tasks cause, seconds: a task or
/// an approval takes from a fraction of a second to an hour.
pub const WAIT_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
