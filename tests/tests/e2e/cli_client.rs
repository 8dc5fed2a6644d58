//! The client commands of the `mtswarm` binary against a running stack:
//! `submit --json`, `watch --json` (JSON lines until the job ends, exit code
//! from the job's state), `tasks --format csv|jsonl`, `results` (the
//! measurements in the results store, over NATS), `jobs --json`,
//! `approvals --json`; `watch --json` and `results --format jsonl` into a
//! closed pipe (`| head -1`) end quietly with success, and their logs off
//! a terminal carry no colour escapes; a profile of the client
//! configuration selects the leader; the job's trace id, as `submit`
//! answers it, is in `jobs --json`, the first line of `watch` and the
//! detail of `jobs JOB`.

use std::path::Path;
use std::process::{Command, Output};

use mtswarm_tests::cli::{client_command, output_into_closed_pipe, stdout_of};
use mtswarm_tests::{node_bin, small_fleet_toml};

use crate::support::{fan_out_options, start_stack};

fn mtswarm(leader: &str, args: &[&str]) -> Output {
    client_command(&node_bin!(), leader, args)
        .output()
        .expect("run mtswarm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_watch_and_results_through_the_binary() {
    // The in-process leader traces as its daemon does (ids for every span,
    // nothing exported), so the job has a trace id to show; no other test
    // of this binary installs a subscriber.
    let mut telemetry = mtswarm_telemetry::TelemetryConfig::new("mtswarm-leader");
    telemetry.log_filter = Some("warn".into());
    let _telemetry = mtswarm_telemetry::init(telemetry).expect("telemetry");
    let options = fan_out_options(&[("cli-agent", "")], small_fleet_toml(1, 1, 2));
    let (stack, _control) = start_stack(options, 1).await;
    let leader = stack.leader_url.clone();

    let nats = stack.nats.url();
    let printed = tokio::task::spawn_blocking(move || Printed::run(&leader, &nats))
        .await
        .expect("client commands");
    let job_id = printed.job_id.as_str();

    assert_watch_prints_json_lines(&printed);
    assert_tasks_and_results(&printed);
    let jobs: serde_json::Value = serde_json::from_str(&printed.jobs).expect("jobs --json");
    assert_eq!(jobs["jobs"][0]["job_id"], job_id);
    assert_eq!(jobs["jobs"][0]["state"], "succeeded");
    assert_the_trace_id_is_shown(&printed, &jobs);
    let approvals: serde_json::Value =
        serde_json::from_str(&printed.approvals).expect("approvals --json");
    assert_eq!(approvals["approvals"].as_array().map(Vec::len), Some(0));
    stack.shutdown().await;
}

/// What the client commands printed, from submitting a job to listing its
/// approvals.
struct Printed {
    job_id: String,
    /// The job's trace id, as `submit --json` answered it.
    trace_id: String,
    /// `watch --json`
    watch: String,
    /// `watch`
    plain_watch: String,
    /// `jobs JOB`
    detail: String,
    /// `tasks --format csv`
    csv: String,
    /// `tasks --format jsonl --status ok`
    jsonl: String,
    /// `results --format jsonl`
    measured: String,
    /// `jobs --json`
    jobs: String,
    /// `approvals --json --all`
    approvals: String,
}

impl Printed {
    /// Submit a job and run every client command on it (profiles and closed
    /// pipes checked on the way).
    fn run(leader: &str, nats: &str) -> Self {
        let submitted = stdout_of(
            &mtswarm(
                leader,
                &[
                    "submit",
                    "Tune vecadd from the CLI",
                    "--kernel",
                    "vecadd",
                    "--auto-approve",
                    "--json",
                ],
            ),
            "submit",
        );
        let submitted: serde_json::Value = serde_json::from_str(&submitted).expect("submit --json");
        let job_id = submitted["job_id"].as_str().expect("job_id").to_string();
        let trace_id = submitted["trace_id"]
            .as_str()
            .expect("trace_id")
            .to_string();
        let watch = stdout_of(&mtswarm(leader, &["watch", &job_id, "--json"]), "watch");
        // The trace id as people read it: watch's first line, the job's detail.
        let plain_watch = stdout_of(&mtswarm(leader, &["watch", &job_id]), "watch");
        let detail = stdout_of(&mtswarm(leader, &["jobs", &job_id]), "jobs JOB");
        let csv = stdout_of(
            &mtswarm(leader, &["tasks", &job_id, "--format", "csv"]),
            "tasks csv",
        );
        let jsonl = stdout_of(
            &mtswarm(
                leader,
                &["tasks", &job_id, "--format", "jsonl", "--status", "ok"],
            ),
            "tasks jsonl",
        );
        let measured = stdout_of(
            &mtswarm(
                leader,
                &["results", &job_id, "--nats", nats, "--format", "jsonl"],
            ),
            "results jsonl",
        );
        let jobs = stdout_of(&mtswarm(leader, &["jobs", "--json"]), "jobs");
        profiles_select_the_leader(leader, &job_id);
        let approvals = stdout_of(
            &mtswarm(leader, &["approvals", "--json", "--all"]),
            "approvals",
        );
        assert_closed_pipes_end_quietly(leader, &job_id, nats);
        Self {
            job_id,
            trace_id,
            watch,
            plain_watch,
            detail,
            csv,
            jsonl,
            measured,
            jobs,
            approvals,
        }
    }
}

/// `watch --json` and `results --format jsonl` into a closed pipe (`| head
/// -1`) end quietly with success.
fn assert_closed_pipes_end_quietly(leader: &str, job_id: &str, nats: &str) {
    for args in [
        vec!["watch", job_id, "--json"],
        vec!["results", job_id, "--nats", nats, "--format", "jsonl"],
    ] {
        let closed = output_into_closed_pipe(client_command(&node_bin!(), leader, &args));
        let stderr = String::from_utf8_lossy(&closed.stderr);
        assert!(
            closed.status.success()
                && !stderr.contains("panicked")
                && !stderr.contains("Broken pipe")
                // Logs off a terminal carry no colour escapes.
                && !stderr.contains('\u{1b}'),
            "{args:?} into a closed pipe: {}, stderr: {stderr}",
            closed.status
        );
    }
}

/// watch: one JSON object per line, the job's trace first, then its
/// events, then the final job.
fn assert_watch_prints_json_lines(printed: &Printed) {
    let lines: Vec<serde_json::Value> = printed
        .watch
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    // First the job's trace id, as `submit` named it.
    assert_eq!(lines[0]["type"], "trace", "{}", lines[0]);
    assert_eq!(lines[0]["job_id"].as_str(), Some(printed.job_id.as_str()));
    assert_eq!(
        lines[0]["trace_id"].as_str(),
        Some(printed.trace_id.as_str())
    );
    let last = lines.last().expect("watch printed something");
    assert_eq!(last["type"], "job");
    assert_eq!(last["job"]["state"], "succeeded", "{last}");
    assert!(lines.iter().any(|l| l["type"] == "task_result"));
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "agent_event" && l["agent_event"]["agent_id"] == "cli-agent")
    );
}

/// tasks: CSV header plus one row; JSON lines with the parsed result.
/// results: the benchmarked candidate, recorded by the worker in the store.
fn assert_tasks_and_results(printed: &Printed) {
    let job_id = printed.job_id.as_str();
    let mut rows = printed.csv.lines();
    assert!(
        rows.next()
            .expect("header")
            .starts_with("task_id,attempt,agent_id")
    );
    let row = rows.next().expect("one result row");
    assert!(row.contains(",cli-agent,") && row.contains(",ok,"), "{row}");
    assert!(rows.next().is_none());
    let results: Vec<serde_json::Value> = printed
        .jsonl
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["job_id"], job_id);
    assert!(results[0]["result"].is_object(), "{}", results[0]);

    let measured = &printed.measured;
    let records: Vec<serde_json::Value> = measured
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    assert!(
        !records.is_empty(),
        "the task's measurement is in the store"
    );
    for record in &records {
        assert_eq!(record["job_id"], job_id, "{record}");
        assert_eq!(record["kernel"], "vecadd", "{record}");
        assert_eq!(record["agent_id"], "cli-agent", "{record}");
    }
    assert!(records.iter().any(|r| r["valid"] == true), "{measured}");
}

/// The job's trace id: from submit, in the listing, in watch and detail.
fn assert_the_trace_id_is_shown(printed: &Printed, jobs: &serde_json::Value) {
    let (job_id, trace_id) = (&printed.job_id, &printed.trace_id);
    let (plain_watch, detail) = (&printed.plain_watch, &printed.detail);
    assert!(
        trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{trace_id:?}"
    );
    assert_eq!(jobs["jobs"][0]["trace_id"], trace_id.as_str());
    assert_eq!(
        plain_watch.lines().next(),
        Some(format!("job {job_id}: trace {trace_id}").as_str()),
        "{plain_watch}"
    );
    assert!(
        detail.lines().any(|l| l == format!("trace     {trace_id}")),
        "{detail}"
    );
}

/// `mtswarm` with only the client configuration at `config` to find the
/// leader: no `MTSWARM_LEADER`, no `MTSWARM_PROFILE`.
fn with_config_only(config: &Path, args: &[&str]) -> Output {
    Command::new(node_bin!())
        .args(args)
        .env("MTSWARM_CONFIG", config)
        .env_remove("MTSWARM_LEADER")
        .env_remove("MTSWARM_PROFILE")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("MTSWARM_JSON")
        .output()
        .expect("run mtswarm")
}

/// A client configuration whose default profile names a port nobody
/// listens on and whose `stack` profile names the running leader.
fn profiles_select_the_leader(leader: &str, job_id: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("config.toml");
    let dead = "http://127.0.0.1:9";
    std::fs::write(
        &config,
        format!(
            "profile = \"dead\"\n\n[profiles.dead]\nleader = \"{dead}\"\n\n[profiles.stack]\nleader = \"{leader}\"\n"
        ),
    )
    .expect("write the client configuration");

    // `--profile stack` reaches the stack: its job is listed.
    let listed = stdout_of(
        &with_config_only(&config, &["--profile", "stack", "jobs", "--json"]),
        "jobs --profile stack",
    );
    assert!(listed.contains(job_id), "{listed}");

    // Without --profile the file's default profile applies: the dead port.
    let fallback = with_config_only(&config, &["jobs", "--connect-timeout", "2"]);
    let stderr = String::from_utf8_lossy(&fallback.stderr);
    assert_eq!(fallback.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(dead),
        "the default profile's leader: {stderr}"
    );

    // A flag still overrides the profile's field.
    let overridden = stdout_of(
        &with_config_only(&config, &["jobs", "--json", "--leader", leader]),
        "jobs --leader over the default profile",
    );
    assert!(overridden.contains(job_id), "{overridden}");

    // An unknown profile is a usage error naming the known ones.
    let unknown = with_config_only(&config, &["--profile", "prod", "jobs"]);
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert_eq!(unknown.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no profile \"prod\"") && stderr.contains("dead, stack"),
        "{stderr}"
    );
}
