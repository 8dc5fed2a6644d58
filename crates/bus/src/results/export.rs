//! Records out of the store for analysis: JSONL both ways, CSV with the
//! `-D` parameters flattened into `param.<NAME>` columns.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};

use super::record::{ResultRecord, ResultStats};

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Writing to (or reading from) the output failed.
    #[error("writing results: {0}")]
    Io(#[from] std::io::Error),
    /// A record could not be encoded as JSON.
    #[error("encoding results as JSON: {0}")]
    Json(serde_json::Error),
    /// A record could not be written as CSV.
    #[error("encoding results as CSV: {0}")]
    Csv(csv::Error),
    /// A line of JSONL input is not a [`ResultRecord`].
    #[error("line {line} of the JSONL input is not a result record: {source}")]
    BadLine {
        /// Line number, from 1.
        line: usize,
        /// The JSON parser's error.
        #[source]
        source: serde_json::Error,
    },
}

/// A failed write through the encoder is an I/O error (so that a caller
/// sees, say, a closed pipe for what it is), anything else an encoding one.
impl From<serde_json::Error> for ExportError {
    fn from(error: serde_json::Error) -> Self {
        if error.is_io() {
            ExportError::Io(error.into())
        } else {
            ExportError::Json(error)
        }
    }
}

impl From<csv::Error> for ExportError {
    fn from(error: csv::Error) -> Self {
        match error.kind() {
            csv::ErrorKind::Io(io) => {
                ExportError::Io(std::io::Error::new(io.kind(), io.to_string()))
            }
            _ => ExportError::Csv(error),
        }
    }
}

/// Writes one JSON object per line.
pub fn to_jsonl(records: &[ResultRecord], mut out: impl Write) -> Result<(), ExportError> {
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads records written by [`to_jsonl`] (blank lines are skipped).
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<ResultRecord>, ExportError> {
    let mut records = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|source| ExportError::BadLine {
            line: index + 1,
            source,
        })?;
        records.push(record);
    }
    Ok(records)
}

/// Fixed CSV columns, before the `param.<NAME>` columns.
pub const CSV_COLUMNS: &[&str] = &[
    "record_id",
    "job_id",
    "task_id",
    "attempt",
    "agent_id",
    "session_id",
    "worker_id",
    "slice_id",
    "backend",
    "toolchain",
    "kernel",
    "kernel_hash",
    "model",
    "timestamp_ms",
    "valid",
    "error",
    "flags",
    "cores",
    "count",
    "median_s",
    "trimmed_mean_s",
    "min_s",
    "max_s",
    "stddev_s",
    "flops",
    "gflops",
    "peak_fraction",
    "speedup_over_baseline",
    "wall_seconds",
    "samples_s",
    "status",
    "reason",
    "harness_hash",
    "baseline",
    "source_edited",
];

/// Writes a header and one row per record: the [`CSV_COLUMNS`], then one
/// `param.<NAME>` column per parameter name found in any record (sorted;
/// empty where a record lacks it). Flags are joined with `; `, samples with
/// spaces; absent figures are empty cells.
pub fn to_csv(records: &[ResultRecord], out: impl Write) -> Result<(), ExportError> {
    let param_names: BTreeSet<&str> = records
        .iter()
        .flat_map(|r| r.params.keys().map(String::as_str))
        .collect();
    let mut writer = csv::Writer::from_writer(out);
    let header = CSV_COLUMNS
        .iter()
        .map(|c| (*c).to_string())
        .chain(param_names.iter().map(|name| format!("param.{name}")));
    writer.write_record(header)?;
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in records {
        let stat = |pick: fn(&ResultStats) -> f64| opt(r.stats.as_ref().map(pick));
        let mut row: Vec<String> = vec![
            r.record_id.clone(),
            r.job_id.clone(),
            r.task_id.clone(),
            r.attempt.to_string(),
            r.agent_id.clone(),
            r.session_id.clone(),
            r.worker_id.clone(),
            r.slice_id.clone(),
            r.backend.clone(),
            r.toolchain.clone(),
            r.kernel.clone(),
            r.kernel_hash.clone(),
            r.model.clone(),
            r.timestamp_ms.to_string(),
            r.valid.to_string(),
            r.error.clone().unwrap_or_default(),
            r.flags.join("; "),
            r.cores.to_string(),
            r.stats
                .as_ref()
                .map(|s| s.count.to_string())
                .unwrap_or_default(),
            stat(|s| s.median),
            stat(|s| s.trimmed_mean),
            stat(|s| s.min),
            stat(|s| s.max),
            stat(|s| s.stddev),
            r.flops.map(|f| f.to_string()).unwrap_or_default(),
            opt(r.gflops),
            opt(r.peak_fraction),
            opt(r.speedup_over_baseline),
            r.wall_seconds.to_string(),
            r.samples
                .iter()
                .map(f64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            r.status().as_str().to_string(),
            r.reason.clone().unwrap_or_default(),
            r.harness_hash.clone(),
            r.baseline.to_string(),
            r.source_edited().to_string(),
        ];
        row.extend(
            param_names
                .iter()
                .map(|name| r.params.get(*name).cloned().unwrap_or_default()),
        );
        writer.write_record(&row)?;
    }
    writer.flush()?;
    Ok(())
}
