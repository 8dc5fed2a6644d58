//! query_results: what earlier sessions measured for the same kernel code
//! (same kernel hash) or for similar kernels (same kernel name, other code),
//! so an agent starts from known-good parameters and skips known failures.
//!
//! The history lives in the bus's results store, but this crate does not
//! depend on the bus: the tool reads through the [`ResultsSource`] trait,
//! which the worker daemon implements over `mtswarm_bus::ResultsStore`
//! ([`PastResult`] has the field names of `mtswarm_bus::ResultRecord`, so a
//! record converts through serde). [`InMemoryResults`] serves tests and
//! sessions without a bus.
//!
//! The tool is low risk, read-only and concurrency-safe. Attach it to a
//! session's tools with [`crate::ToolSet::with_results`] or build it with
//! [`QueryResultsTool::new`].

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use mtswarm_core::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec, schema_of};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ToolSet;
use crate::env::parse_args;
use crate::normalize::Shape;

/// Results shown per group when the call does not say.
pub const DEFAULT_LIMIT: i64 = 10;
/// Most results shown per group.
pub const MAX_LIMIT: i64 = 50;
/// Records fetched from the source per query; ranking happens on these.
pub const SOURCE_LIMIT: usize = 2_000;

/// Statistics of a past measurement, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PastStats {
    /// Timed executions the statistics cover.
    pub count: u64,
    /// Median execution time.
    pub median: f64,
    /// Mean after trimming the outliers.
    pub trimmed_mean: f64,
    /// Fastest execution.
    pub min: f64,
    /// Slowest execution.
    pub max: f64,
}

/// One earlier measurement. Field names match `mtswarm_bus::ResultRecord`,
/// so `serde_json::from_value(serde_json::to_value(&record)?)` converts one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PastResult {
    /// The record's id (deduplicates retries).
    pub record_id: String,
    /// Job that measured it.
    pub job_id: String,
    /// Slice it ran on (bus spelling, e.g. `board0-c1`).
    pub slice_id: String,
    /// Backend that ran it (`emulator`, `sdk`, `host`).
    pub backend: String,
    /// Kernel name.
    pub kernel: String,
    /// Content hash of the kernel directory that was built.
    pub kernel_hash: String,
    /// The `-D` parameters of the candidate.
    pub params: BTreeMap<String, String>,
    /// DSP cores the launch used.
    pub cores: u32,
    /// Timing statistics; `None` when it was not benchmarked.
    pub stats: Option<PastStats>,
    /// Achieved GFLOPS; `None` when not measured.
    pub gflops: Option<f64>,
    /// Fraction of the slice's peak GFLOPS; `None` when not measured.
    pub peak_fraction: Option<f64>,
    /// Whether its output matched the reference.
    pub valid: bool,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// Plausibility flags raised on the measurement.
    pub flags: Vec<String>,
    /// Who measured it: the model or builtin policy of the session.
    pub model: String,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
}

impl PastResult {
    /// Valid, unflagged, with a figure.
    pub fn trustworthy(&self) -> bool {
        self.valid && self.flags.is_empty() && self.gflops.is_some_and(f64::is_finite)
    }
}

/// What the tool asks a [`ResultsSource`] for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsQuery {
    /// Exact kernel name.
    pub kernel: Option<String>,
    /// Kernel hash or a prefix of it.
    pub kernel_hash: Option<String>,
    /// At most this many records (the most recent ones when more match).
    pub limit: usize,
}

/// The source could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("results store unavailable: {0}")]
pub struct ResultsSourceError(pub String);

/// Where earlier results come from (the bus's results store in a worker).
#[async_trait::async_trait]
pub trait ResultsSource: Send + Sync {
    /// Records matching every `Some` filter of `query`, at most `query.limit`.
    async fn query(&self, query: &ResultsQuery) -> Result<Vec<PastResult>, ResultsSourceError>;
}

/// A [`ResultsSource`] held in memory (tests, sessions without a bus).
#[derive(Debug, Default)]
pub struct InMemoryResults {
    records: RwLock<Vec<PastResult>>,
}

impl InMemoryResults {
    /// A source holding `records`.
    pub fn new(records: Vec<PastResult>) -> Self {
        Self {
            records: RwLock::new(records),
        }
    }

    /// Adds a record (kept in arrival order).
    pub fn push(&self, record: PastResult) {
        match self.records.write() {
            Ok(mut records) => records.push(record),
            Err(poisoned) => poisoned.into_inner().push(record),
        }
    }
}

#[async_trait::async_trait]
impl ResultsSource for InMemoryResults {
    async fn query(&self, query: &ResultsQuery) -> Result<Vec<PastResult>, ResultsSourceError> {
        let records = self
            .records
            .read()
            .map_err(|_| ResultsSourceError("the in-memory store was poisoned".into()))?;
        let matching: Vec<PastResult> = records
            .iter()
            .filter(|r| query.kernel.as_deref().is_none_or(|k| r.kernel == k))
            .filter(|r| {
                query
                    .kernel_hash
                    .as_deref()
                    .is_none_or(|h| r.kernel_hash.starts_with(h))
            })
            .cloned()
            .collect();
        let skip = matching.len().saturating_sub(query.limit);
        Ok(matching.into_iter().skip(skip).collect())
    }
}

/// Arguments of query_results.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryResultsArgs {
    /// Kernel name, e.g. "dgemm" (default: this session's kernel).
    #[serde(default)]
    pub kernel: Option<String>,
    /// Hash of the kernel code (from compile), or a prefix of at least 4
    /// characters: results of exactly this code come first.
    #[serde(default)]
    pub kernel_hash: Option<String>,
    /// Only results of the same code (the given hash), not of other
    /// versions of the kernel (default false).
    #[serde(default)]
    pub same_kernel_only: Option<bool>,
    /// Results shown per group, 1..=50 (default 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    pub limit: Option<i64>,
}

const QUERY_RESULTS_SHAPE: Shape = Shape {
    integers: &["limit"],
    bools: &["same_kernel_only"],
    aliases: &[
        ("name", "kernel"),
        ("kernel_name", "kernel"),
        ("hash", "kernel_hash"),
        ("n", "limit"),
        ("max_results", "limit"),
        ("exact", "same_kernel_only"),
    ],
    ..Shape::NONE
};

/// The query_results tool.
pub struct QueryResultsTool {
    source: Arc<dyn ResultsSource>,
    default_kernel: Option<String>,
}

impl QueryResultsTool {
    /// The tool over `source`, with no default kernel.
    pub fn new(source: Arc<dyn ResultsSource>) -> Self {
        Self {
            source,
            default_kernel: None,
        }
    }

    /// The kernel asked about when a call names neither kernel nor hash.
    pub fn with_default_kernel(mut self, kernel: impl Into<String>) -> Self {
        let kernel = kernel.into();
        self.default_kernel = (!kernel.trim().is_empty()).then_some(kernel);
        self
    }
}

impl ToolSet {
    /// Adds query_results over `source` to this session's tools;
    /// `default_kernel` is the session's kernel name (asked about when a call
    /// names none).
    pub fn with_results(
        mut self,
        source: Arc<dyn ResultsSource>,
        default_kernel: Option<String>,
    ) -> ToolSet {
        let mut tool = QueryResultsTool::new(source);
        if let Some(kernel) = default_kernel {
            tool = tool.with_default_kernel(kernel);
        }
        self.tools.retain(|t| t.spec().name != "query_results");
        self.tools.push(Arc::new(tool));
        self
    }
}

/// Best trustworthy figures first (highest GFLOPS), then the rest (invalid
/// or flagged), newest first.
fn rank(results: &mut [PastResult]) {
    results.sort_by(|a, b| {
        b.trustworthy()
            .cmp(&a.trustworthy())
            .then_with(|| {
                let figure = |r: &PastResult| r.gflops.unwrap_or(f64::NEG_INFINITY);
                figure(b).total_cmp(&figure(a))
            })
            .then_with(|| b.timestamp_ms.cmp(&a.timestamp_ms))
    });
}

fn params_text(params: &BTreeMap<String, String>) -> String {
    if params.is_empty() {
        return "(no -D parameters)".to_string();
    }
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn short_hash(hash: &str) -> String {
    hash.chars().take(12).collect()
}

fn line(index: usize, r: &PastResult, show_hash: bool) -> String {
    let mut text = format!("  {}. ", index + 1);
    if r.trustworthy() {
        text.push_str(&format!("{:.2} GFLOPS", r.gflops.unwrap_or_default()));
        if let Some(p) = r.peak_fraction {
            text.push_str(&format!(" ({:.1}% of peak)", p * 100.0));
        }
    } else if r.valid {
        text.push_str("valid but FLAGGED");
        if let Some(g) = r.gflops {
            text.push_str(&format!(" ({g:.2} GFLOPS)"));
        }
    } else {
        text.push_str("INVALID");
    }
    text.push_str(&format!("  {}", params_text(&r.params)));
    let mut context = vec![format!("{} {}", r.backend, r.slice_id)];
    if show_hash {
        context.push(format!("code {}", short_hash(&r.kernel_hash)));
    }
    context.push(format!("job {}", r.job_id));
    text.push_str(&format!("  [{}]", context.join(", ")));
    if !r.valid
        && let Some(error) = &r.error
    {
        let error: String = error.chars().take(160).collect();
        text.push_str(&format!(": {error}"));
    }
    if let Some(flag) = r.flags.first() {
        let flag: String = flag.chars().take(160).collect();
        text.push_str(&format!(": {flag}"));
    }
    text
}

fn summary(r: &PastResult) -> Value {
    json!({
        "record_id": r.record_id,
        "job_id": r.job_id,
        "kernel": r.kernel,
        "kernel_hash": r.kernel_hash,
        "params": r.params,
        "gflops": r.gflops,
        "peak_fraction": r.peak_fraction,
        "median_seconds": r.stats.as_ref().map(|s| s.median),
        "valid": r.valid,
        "trustworthy": r.trustworthy(),
        "error": r.error,
        "flags": r.flags,
        "slice_id": r.slice_id,
        "backend": r.backend,
        "cores": r.cores,
        "model": r.model,
        "timestamp_ms": r.timestamp_ms,
    })
}

/// What `query_results` declares: the one description of the tool.
static SPEC: ToolSpec = ToolSpec::new(
    "query_results",
    "Earlier benchmark results for this kernel: results of the same code (kernel_hash from compile) first, then of other versions of the same kernel (same name, other hash). Best trustworthy figures first, then invalid or flagged candidates, with their -D parameters. Read-only.",
    schema_of::<QueryResultsArgs>,
)
.concurrent();

#[async_trait::async_trait]
impl Tool for QueryResultsTool {
    fn spec(&self) -> &ToolSpec {
        &SPEC
    }
    fn normalize(&self, args: Value) -> Result<Value, mtswarm_core::NormalizeError> {
        crate::normalize::normalize_args(args, &QUERY_RESULTS_SHAPE)
    }

    async fn call(&self, args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args: QueryResultsArgs = parse_args(args)?;
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ToolError::InvalidArgs(format!(
                "limit must be in 1..={MAX_LIMIT}, got {limit}"
            )));
        }
        let limit = usize::try_from(limit).unwrap_or(1);
        let clean = |v: Option<String>| v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        let hash = clean(args.kernel_hash);
        if let Some(h) = &hash
            && (h.len() < 4 || !h.chars().all(|c| c.is_ascii_alphanumeric()))
        {
            return Err(ToolError::InvalidArgs(format!(
                "kernel_hash must be at least 4 letters or digits of the hash compile reported, got {h:?}"
            )));
        }
        let mut kernel = clean(args.kernel).or_else(|| self.default_kernel.clone());
        if kernel.is_none() && hash.is_none() {
            return Err(ToolError::InvalidArgs(
                "give `kernel` (the kernel name) or `kernel_hash` (from compile)".into(),
            ));
        }
        let same_kernel_only = args.same_kernel_only.unwrap_or(false);
        let fetch = |kernel: Option<String>, kernel_hash: Option<String>| {
            let query = ResultsQuery {
                kernel,
                kernel_hash,
                limit: SOURCE_LIMIT,
            };
            let source = self.source.clone();
            async move {
                source
                    .query(&query)
                    .await
                    .map_err(|e| ToolError::Failed(e.to_string()))
            }
        };

        let (mut same, mut similar) = match &hash {
            Some(h) => {
                let same = fetch(kernel.clone(), Some(h.clone())).await?;
                if kernel.is_none() {
                    kernel = same.first().map(|r| r.kernel.clone());
                }
                let similar = match (&kernel, same_kernel_only) {
                    (Some(k), false) => fetch(Some(k.clone()), None)
                        .await?
                        .into_iter()
                        .filter(|r| !r.kernel_hash.starts_with(h.as_str()))
                        .collect(),
                    _ => Vec::new(),
                };
                (same, similar)
            }
            None => (fetch(kernel.clone(), None).await?, Vec::new()),
        };
        rank(&mut same);
        rank(&mut similar);
        let (same_total, similar_total) = (same.len(), similar.len());
        same.truncate(limit);
        similar.truncate(limit);

        let subject = match (&kernel, &hash) {
            (Some(k), Some(h)) => format!("kernel {k} (code {})", short_hash(h)),
            (Some(k), None) => format!("kernel {k}"),
            (None, Some(h)) => format!("code {}", short_hash(h)),
            (None, None) => String::new(),
        };
        let mut text = if same_total + similar_total == 0 {
            format!("no earlier results for {subject}")
        } else if hash.is_some() {
            format!(
                "{} earlier result(s) for {subject}: {same_total} of the same code, {similar_total} of other versions (same name)",
                same_total + similar_total
            )
        } else {
            format!("{same_total} earlier result(s) for {subject}")
        };
        if !same.is_empty() {
            text.push_str(if hash.is_some() {
                "\nsame code:"
            } else {
                "\nresults:"
            });
            for (i, r) in same.iter().enumerate() {
                text.push('\n');
                text.push_str(&line(i, r, hash.is_none()));
            }
            if same_total > same.len() {
                text.push_str(&format!("\n  ... {} more", same_total - same.len()));
            }
        }
        if !similar.is_empty() {
            text.push_str("\nsimilar (same kernel name, other code):");
            for (i, r) in similar.iter().enumerate() {
                text.push('\n');
                text.push_str(&line(i, r, true));
            }
            if similar_total > similar.len() {
                text.push_str(&format!("\n  ... {} more", similar_total - similar.len()));
            }
        }
        let data = json!({
            "kernel": kernel,
            "kernel_hash": hash,
            "same_kernel_only": same_kernel_only,
            "same_total": same_total,
            "similar_total": similar_total,
            "same": same.iter().map(summary).collect::<Vec<_>>(),
            "similar": similar.iter().map(summary).collect::<Vec<_>>(),
        });
        Ok(ToolOutput::text(text).with_data(data))
    }
}
