//! `mtswarm report JOB [--out FILE]`: the HTML report of any job, running
//! or finished, submitted by `submit` or by `demo`. The job record comes
//! from the leader (goal, kernel, slices, outcome), every candidate record
//! from the results store over NATS; [`job_report`] turns them into the
//! [`JobReport`] that `mtswarm demo` writes too, so both show the same
//! thing for the same job. The kernel's tune.toml (under `--kernel-root`,
//! at the job's kernel directory, or `--kernel-dir`) gives the parameter
//! axes and the roofline; without it the report still renders, with a note.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use mtswarm_bus::results::{ResultRecord, canonical_slice_id};
use mtswarm_hw::ChipSpec;
use mtswarm_hw::tune::TuneSpace;
use mtswarm_proto::v1;
use mtswarm_report::{Baseline, JobReport};
use serde_json::json;

use crate::common::{LeaderArgs, rpc_error};
use crate::daemons::DEFAULT_NATS;
use crate::render;

/// Arguments of `mtswarm report`: the job, where its kernel and the results
/// store are, and where the HTML goes.
#[derive(Debug, Args)]
pub struct ReportCmd {
    /// The job to report on (see `mtswarm jobs`).
    pub job_id: String,
    /// Where to write the HTML (default: `./mtswarm-report-<job>.html`).
    #[arg(long, short = 'o', env = "MTSWARM_REPORT_OUT")]
    pub out: Option<PathBuf>,
    /// Print the report's summary as one JSON object.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
    /// Directory the job's kernel directory is relative to (as given to
    /// the leader); its tune.toml gives the parameter plots and the roofline.
    #[arg(long, env = "MTSWARM_KERNEL_ROOT", default_value = ".")]
    pub kernel_root: PathBuf,
    /// The kernel directory itself (overrides --kernel-root + the job's
    /// kernel directory).
    #[arg(long, env = "MTSWARM_REPORT_KERNEL_DIR")]
    pub kernel_dir: Option<PathBuf>,
    /// Chip spec TOML for the roofline (default: the built-in MT-3000 numbers).
    #[arg(long, env = "MTSWARM_CHIP_SPEC")]
    pub spec: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (the results store).
    #[arg(long = "nats", env = "MTSWARM_NATS_URL", default_value = DEFAULT_NATS, value_delimiter = ',')]
    pub nats: Vec<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "MTSWARM_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// The nkey seed and NATS TLS settings for reading the results store.
    #[command(flatten)]
    pub nats_security: crate::credentials::NatsSecurityArgs,
    /// Where the leader's Control service is and how to authenticate.
    #[command(flatten)]
    pub leader: LeaderArgs,
}

/// The kernel's name: the last component of the job's kernel directory.
pub(crate) fn kernel_name(job: &v1::JobRecord) -> String {
    let dir = job
        .spec
        .as_ref()
        .map(|s| s.kernel_dir.clone())
        .unwrap_or_default();
    dir.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Adds the kernel's tune.toml and the chip model to `report` (parameter
/// axes in tune.toml order, the roofline). A kernel directory without a
/// readable tune.toml leaves the report as it is, with a note saying so.
pub(crate) fn add_kernel_model(report: &mut JobReport, kernel_dir: &Path, spec: &ChipSpec) {
    match TuneSpace::load(kernel_dir) {
        Ok(space) => {
            report.with_kernel_model(&space, spec);
        }
        Err(error) => {
            tracing::warn!(kernel_dir = %kernel_dir.display(), %error, "report without the kernel's tune.toml");
            report.roofline_note = Some(format!(
                "no roofline: the tune.toml of {} could not be read ({error})",
                kernel_dir.display()
            ));
        }
    }
}

/// The report of `job` from its records. `baseline` overrides the records'
/// own baseline (the demo measures one before the job).
pub(crate) fn job_report(
    job: &v1::JobRecord,
    records: &[ResultRecord],
    baseline: Option<Baseline>,
) -> JobReport {
    let mut slices: Vec<String> = job
        .agents
        .iter()
        .map(|a| canonical_slice_id(&a.slice_id))
        .collect();
    slices.sort();
    slices.dedup();
    let mut report =
        JobReport::from_records(&job.job_id, &kernel_name(job), records, baseline, &slices);
    report.goal = job
        .spec
        .as_ref()
        .map(|s| s.goal.clone())
        .unwrap_or_default();
    report
}

/// `mtswarm report JOB`: reads the job from the leader and its records from
/// the results store, writes the HTML report and prints its summary.
pub(crate) async fn report(cmd: ReportCmd) -> anyhow::Result<ExitCode> {
    let mut control = cmd.leader.connect().await?;
    let job = control
        .get_job(v1::GetJobRequest {
            job_id: cmd.job_id.clone(),
        })
        .await
        .map_err(|status| rpc_error("getting the job", &cmd.leader.url(), status))?
        .into_inner()
        .job
        .context("the leader answered without a job")?;
    let records = crate::results::job_records(
        &job.job_id,
        &cmd.nats,
        cmd.nats_creds.clone(),
        &cmd.nats_security,
    )
    .await?;
    let mut report = job_report(&job, &records, None);
    let spec = match &cmd.spec {
        Some(path) => ChipSpec::load(path)?,
        None => ChipSpec::default(),
    };
    let kernel_dir = cmd.kernel_dir.clone().unwrap_or_else(|| {
        cmd.kernel_root.join(
            job.spec
                .as_ref()
                .map(|s| s.kernel_dir.as_str())
                .unwrap_or_default(),
        )
    });
    add_kernel_model(&mut report, &kernel_dir, &spec);
    let path = match &cmd.out {
        Some(path) => path.clone(),
        None => std::env::current_dir()
            .context("locating the current directory")?
            .join(format!("mtswarm-report-{}.html", job.job_id)),
    };
    let path = report.write_html(&path)?;
    let path = path.canonicalize().unwrap_or(path);
    if cmd.json {
        let mut value = serde_json::to_value(report.summary(Some(&path)))?;
        value["state"] = json!(render::job_state(job.state()));
        value["records"] = json!(records.len());
        value["outcome"] = render::outcome(job.outcome.as_ref());
        println!("{value}");
    } else {
        println!(
            "job {} ({}): {} candidate record(s), {}; report written to {}",
            job.job_id,
            render::job_state(job.state()),
            records.len(),
            report.counts_line(),
            path.display()
        );
        for line in render::outcome_lines(job.outcome.as_ref()) {
            println!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mtswarm_bus::results::{CandidateStatus, ResultStats};

    use super::*;

    fn dgemm_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels/dgemm")
    }

    /// A valid benchmark with the full `-D` set a worker records.
    fn benchmarked(defines: BTreeMap<String, String>, gflops: f64) -> ResultRecord {
        ResultRecord {
            record_id: format!("r{gflops}"),
            job_id: "job-1".into(),
            kernel_hash: "feed".into(),
            params: defines,
            cores: 24,
            status: CandidateStatus::Benchmarked,
            valid: true,
            gflops: Some(gflops),
            stats: Some(ResultStats {
                count: 3,
                median: 0.01,
                ..ResultStats::default()
            }),
            timestamp_ms: 1_800_000_000_000 + gflops as u64,
            ..ResultRecord::default()
        }
    }

    #[test]
    fn the_kernels_tune_toml_gives_the_parameter_plots_and_the_roofline() {
        let spec = ChipSpec::default();
        let space = TuneSpace::load(&dgemm_dir()).expect("dgemm tune.toml");
        let configs = space.configurations(&spec).expect("configurations");
        assert!(configs.len() >= 2);
        let records: Vec<ResultRecord> = configs[..2]
            .iter()
            .enumerate()
            .map(|(i, c)| benchmarked(space.defines(c), 100.0 + i as f64))
            .collect();
        let mut report = JobReport::from_records("job-1", "dgemm", &records, None, &[]);
        add_kernel_model(&mut report, &dgemm_dir(), &spec);

        let names: Vec<&str> = report.parameters.iter().map(|a| a.name.as_str()).collect();
        let expected: Vec<&str> = space.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, expected, "tune.toml order");
        let roofline = report.roofline.as_ref().expect("dgemm has a [model]");
        assert_eq!(roofline.points.len(), 2);
        let best = roofline.points.iter().find(|p| p.best).expect("best");
        assert_eq!(best.gflops, 101.0);
        // The [model] of dgemm at the best's defines, by hand.
        let d = |k: &str| -> f64 { records[1].params[k].parse().expect("number") };
        let (m, n, k, mb, nb, b_gsm) = (d("M"), d("N"), d("K"), d("MB"), d("NB"), d("B_GSM"));
        let bytes = 8.0
            * (m * k * (n / nb).floor()
                + k * n * (b_gsm + (1.0 - b_gsm) * (m / mb).floor())
                + m * n);
        assert!((best.intensity - 2.0 * m * n * k / bytes).abs() < 1e-9);
        let html = report.render_html();
        assert!(html.contains("id=\"roofline\""));
        assert!(html.contains("id=\"param-MB\""));
    }

    #[test]
    fn a_kernel_dir_without_a_tune_toml_leaves_a_note() {
        let missing = dgemm_dir().join("no-such-kernel");
        let mut report = JobReport::from_records("job-1", "dgemm", &[], None, &[]);
        add_kernel_model(&mut report, &missing, &ChipSpec::default());
        assert!(report.roofline.is_none());
        let note = report.roofline_note.as_deref().unwrap_or_default();
        assert!(note.contains("no-such-kernel"), "{note}");
        assert!(report.render_html().contains("id=\"roofline-note\""));
    }
}
