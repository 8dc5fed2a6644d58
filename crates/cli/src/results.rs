//! `mtswarm results`: every measured candidate from the results store (the
//! `MTSWARM_MEASUREMENTS` stream, read over NATS with
//! `mtswarm_bus::results::ResultsStore`), filtered by job, kernel, kernel
//! hash, slice, backend, time and validity, printed as a table or exported
//! as JSON lines or CSV to stdout or a file. The store outlives jobs and
//! leaders, so this reads NATS directly rather than asking the leader.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use mtswarm_bus::Bus;
use mtswarm_bus::results::{self, CandidateStatus, ResultQuery, ResultRecord, ResultsStore};
use serde_json::json;

use crate::credentials::NatsSecurityArgs;
use crate::daemons::{DEFAULT_NATS, NatsArgs};
use crate::render;

/// How `mtswarm results` prints the records (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// A table for people.
    Table,
    /// One JSON object per record and line.
    Jsonl,
    /// A header and one row per record; parameters as `param.<NAME>` columns.
    Csv,
    /// A Kernel Tuner cache file of one kernel's candidates: what was
    /// measured, as the autotuning ecosystem reads it.
    KernelTuner,
}

/// Arguments of `mtswarm results`: the record filters, the output and the
/// NATS connection to the results store.
#[derive(Debug, Args)]
pub struct ResultsCmd {
    /// Only records of this job (same as --job).
    pub job_id: Option<String>,
    /// Only records of this job.
    #[arg(long = "job", env = "MTSWARM_RESULTS_JOB", conflicts_with = "job_id")]
    pub job: Option<String>,
    /// Only this kernel (the kernel directory's name, e.g. dgemm).
    #[arg(long, env = "MTSWARM_RESULTS_KERNEL")]
    pub kernel: Option<String>,
    /// Only this kernel source: the full hash or a prefix of at least 4 characters.
    #[arg(long, env = "MTSWARM_RESULTS_KERNEL_HASH")]
    pub kernel_hash: Option<String>,
    /// Only this slice (board0-c1; board0/c1 is read the same).
    #[arg(long, env = "MTSWARM_RESULTS_SLICE")]
    pub slice: Option<String>,
    /// Only this backend (emulator, sdk, host).
    #[arg(long, env = "MTSWARM_RESULTS_BACKEND")]
    pub backend: Option<String>,
    /// Only records measured since then: an RFC 3339 time
    /// (2026-01-02T03:04:05Z) or an age (90s, 15m, 2h, 7d).
    #[arg(long, env = "MTSWARM_RESULTS_SINCE")]
    pub since: Option<String>,
    /// Only valid measurements (the kernel's answer was right).
    #[arg(long, env = "MTSWARM_RESULTS_VALID_ONLY")]
    pub valid_only: bool,
    /// Only candidates with these statuses, comma-separated: benchmarked,
    /// flagged, screened, compiled, pruned, not_run, invalid,
    /// compile_failed, timed_out, unknown.
    #[arg(long, env = "MTSWARM_RESULTS_STATUS", value_delimiter = ',')]
    pub status: Vec<String>,
    /// At most this many records (the most recently stored ones).
    #[arg(long, env = "MTSWARM_RESULTS_LIMIT", default_value_t = results::DEFAULT_QUERY_LIMIT)]
    pub limit: usize,
    /// Output format.
    #[arg(long, value_enum, env = "MTSWARM_RESULTS_FORMAT", default_value_t = ExportFormat::Table)]
    pub format: ExportFormat,
    /// Write the export to this file instead of stdout.
    #[arg(long, short = 'o', env = "MTSWARM_RESULTS_OUTPUT")]
    pub output: Option<PathBuf>,
    /// One JSON object `{"count": N, "records": [...]}` (instead of --format).
    #[arg(long, env = "MTSWARM_JSON", conflicts_with = "format")]
    pub json: bool,
    /// The NATS servers of the results store and how to authenticate.
    #[command(flatten)]
    pub bus: NatsArgs,
}

impl ResultsCmd {
    /// The store query these flags describe.
    pub fn query(&self, now: SystemTime) -> anyhow::Result<ResultQuery> {
        let nonempty = |value: &Option<String>| {
            value
                .as_ref()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if self.limit == 0 || self.limit > results::MAX_QUERY_LIMIT {
            bail!("--limit must be between 1 and {}", results::MAX_QUERY_LIMIT);
        }
        let since = match nonempty(&self.since) {
            None => None,
            Some(text) => Some(parse_since(&text, now)?),
        };
        let mut statuses = Vec::new();
        for name in self.status.iter().filter(|s| !s.trim().is_empty()) {
            let status = CandidateStatus::parse(name).with_context(|| {
                format!(
                    "--status {name:?} is not a candidate status (one of: {})",
                    CandidateStatus::ALL.map(CandidateStatus::as_str).join(", ")
                )
            })?;
            statuses.push(status);
        }
        Ok(ResultQuery {
            job_id: nonempty(&self.job_id).or_else(|| nonempty(&self.job)),
            kernel: nonempty(&self.kernel),
            kernel_hash: nonempty(&self.kernel_hash),
            slice: nonempty(&self.slice).map(|s| results::canonical_slice_id(&s)),
            backend: nonempty(&self.backend),
            valid_only: self.valid_only,
            statuses,
            since,
            limit: self.limit,
        })
    }
}

/// `--since`: an RFC 3339 instant, or an age before `now` (`90s`, `15m`,
/// `2h`, `7d`, `1w`).
pub(crate) fn parse_since(text: &str, now: SystemTime) -> anyhow::Result<SystemTime> {
    let text = text.trim();
    if let Some(age) = parse_age(text) {
        return Ok(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH));
    }
    let parsed = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .with_context(|| {
            format!(
                "--since {text:?} is neither an RFC 3339 time (2026-01-02T03:04:05Z) nor an age (90s, 15m, 2h, 7d)"
            )
        })?;
    let nanos = parsed.unix_timestamp_nanos();
    if nanos < 0 {
        return Ok(SystemTime::UNIX_EPOCH);
    }
    let nanos = u64::try_from(nanos).context("--since is too far in the future")?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos))
}

fn parse_age(text: &str) -> Option<Duration> {
    let unit_at = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return None,
    };
    number.checked_mul(seconds).map(Duration::from_secs)
}

/// Records a report reads at most.
const REPORT_RECORD_LIMIT: usize = 100_000;

/// The records of `job_id` in the results store (at most
/// [`REPORT_RECORD_LIMIT`]), as `mtswarm report` and the MCP server's
/// `get_report` read them: connect, query, close.
pub(crate) async fn job_records(
    job_id: &str,
    nats: &[String],
    nats_creds: Option<PathBuf>,
    nats_security: &NatsSecurityArgs,
) -> anyhow::Result<Vec<ResultRecord>> {
    let (bus, store) = connect_store(nats, nats_creds, nats_security).await?;
    let records = store
        .query(&ResultQuery {
            job_id: Some(job_id.to_owned()),
            limit: REPORT_RECORD_LIMIT,
            ..ResultQuery::default()
        })
        .await
        .context("reading the job's records from the results store");
    if let Err(error) = bus.drain().await {
        tracing::debug!(%error, "closing the NATS connection");
    }
    records
}

/// Connects to NATS for a one-shot read of the results store (also used by
/// `mtswarm report`). The caller drains the bus when done.
pub(crate) async fn connect_store(
    nats: &[String],
    nats_creds: Option<PathBuf>,
    nats_security: &NatsSecurityArgs,
) -> anyhow::Result<(Bus, ResultsStore)> {
    let mut config = crate::daemons::bus_config(nats, &nats_creds, "mtswarm-cli")?;
    // What the flags leave open comes from the client configuration that
    // `mtswarm up` writes (its NATS URL, nkey and CA).
    let mut security = nats_security.clone();
    if security.nats_nkey_file.is_none()
        && nats_creds.is_none()
        && let Some(client) = crate::common::client_config()
    {
        if config.servers == [DEFAULT_NATS.to_string()]
            && let Some(url) = client.nats.clone()
        {
            config.servers = vec![url];
        }
        security.nats_nkey_file = client.nats_nkey_file.clone();
        if security.nats_tls_ca.is_none() {
            security.nats_tls_ca = client.nats_ca_file.clone();
        }
    }
    let servers = config.servers.clone();
    security.apply(&mut config)?;
    if security.nats_nkey_file.is_some() {
        config.inbox_prefix = Some(mtswarm_bus::permissions::CLIENT_INBOX_PREFIX.to_string());
    }
    // A one-shot read: report an unreachable server instead of waiting for it.
    config.retry_on_initial_connect = false;
    let bus = Bus::connect(config).await.with_context(|| {
        format!(
            "cannot reach NATS at {}: is `mtswarm up` running? (set --nats / MTSWARM_NATS_URL)",
            servers.join(",")
        )
    })?;
    let store = ResultsStore::open(&bus)
        .await
        .context("opening the results store")?;
    Ok((bus, store))
}

/// `mtswarm results`: reads the matching records straight from the results
/// store over NATS and prints or exports them. Exit 0 on any match count.
pub(crate) async fn results(cmd: ResultsCmd) -> anyhow::Result<ExitCode> {
    let query = cmd.query(SystemTime::now())?;
    let nats = &cmd.bus;
    let (bus, store) =
        connect_store(&nats.nats, nats.nats_creds.clone(), &nats.nats_security).await?;
    let records = store
        .query(&query)
        .await
        .context("reading the results store")?;
    let mut out: Box<dyn std::io::Write> = match &cmd.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    if cmd.json {
        let value = json!({ "count": records.len(), "records": records });
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).context("encoding JSON")?
        )?;
        out.flush()?;
    } else {
        match cmd.format {
            ExportFormat::Jsonl => results::to_jsonl(&records, &mut out)?,
            ExportFormat::Csv => results::to_csv(&records, &mut out)?,
            ExportFormat::Table => write_table(&records, &mut out)?,
            ExportFormat::KernelTuner => {
                let landscape = mtswarm_report::kernel_tuner::kernel_tuner_cache(&records)?;
                writeln!(out, "{}", landscape.to_kernel_tuner_json())?;
                out.flush()?;
            }
        }
    }
    if let Some(path) = &cmd.output {
        eprintln!("wrote {} records to {}", records.len(), path.display());
    }
    if let Err(error) = bus.drain().await {
        tracing::debug!(%error, "closing the NATS connection");
    }
    Ok(ExitCode::SUCCESS)
}

fn write_table(records: &[ResultRecord], out: &mut dyn std::io::Write) -> std::io::Result<()> {
    if records.is_empty() {
        writeln!(out, "no results match")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:<10} {:<14} {:<9} {:>5} {:<14} {:>9} {:>6} {:>11}  PARAMS",
        "TIME", "KERNEL", "SLICE", "BACKEND", "CORES", "STATUS", "GFLOPS", "PEAK%", "MEDIAN"
    )?;
    for r in records {
        let millis = i64::try_from(r.timestamp_ms).unwrap_or(i64::MAX);
        let stamp = render::timestamp(Some(&mtswarm_proto::prost_types::Timestamp {
            seconds: millis / 1000,
            nanos: i32::try_from((millis % 1000) * 1_000_000).unwrap_or(0),
        }))
        .unwrap_or_default();
        let params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let status = r.status();
        writeln!(
            out,
            "{:<24} {:<10} {:<14} {:<9} {:>5} {:<14} {:>9} {:>6} {:>11}  {}",
            stamp,
            render::truncate(&r.kernel, 10),
            render::truncate(&r.slice_id, 14),
            render::truncate(&r.backend, 9),
            r.cores,
            status.as_str(),
            r.gflops.map(|g| format!("{g:.3}")).unwrap_or_default(),
            r.peak_fraction
                .map(|p| format!("{:.1}", p * 100.0))
                .unwrap_or_default(),
            r.stats
                .as_ref()
                .map(|s| render::seconds(s.median))
                .unwrap_or_default(),
            params.join(" ")
        )?;
    }
    writeln!(out, "{} records", records.len())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_ages_and_rfc3339_times() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(
            parse_since("90s", now).expect("age"),
            now - Duration::from_secs(90)
        );
        assert_eq!(
            parse_since("2h", now).expect("age"),
            now - Duration::from_secs(7200)
        );
        assert_eq!(
            parse_since("1970-01-01T00:00:10Z", now).expect("time"),
            SystemTime::UNIX_EPOCH + Duration::from_secs(10)
        );
        let error = parse_since("yesterday", now).expect_err("neither");
        assert!(error.to_string().contains("RFC 3339"), "{error}");
        assert!(parse_since("5y", now).is_err());
    }
}
