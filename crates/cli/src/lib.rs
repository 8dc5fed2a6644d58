//! The `mtswarm` command line. Thin: parses arguments (clap; every flag
//! also reads an environment variable), wires the library crates together
//! and prints. Each command family lives in its own module:
//!
//! - `up`: a whole local stack (nats-server, leader, one worker per board);
//! - `demo`: a private stack that tunes one kernel end to end and reports;
//! - `local_stack`: the stack both of them start and stop (and whose
//!   process command lines the tests' stacks use);
//! - `daemons`: `leader` and `worker`, thin wrappers over the daemons;
//! - `client`: `submit`, `jobs`, `fleet`, `quarantine`, `approvals`,
//!   `approve`/`deny`, `tasks` against the leader's Control service;
//! - `results`: `results`, the results store read over NATS;
//! - `report`: `report`, the HTML report of any job;
//! - `watch`: live progress of a job, with interactive approvals
//!   (`approval_prompt` asks them);
//! - `decision`: deciding one approval (`approve`/`deny` and `watch`);
//! - `emu`: build and run one kernel on the emulator;
//! - `search`: the builtin search replayed against a recorded landscape;
//! - `llm`: whether a model endpoint can drive the agents; `llm_serve`, a
//!   small model served on loopback for them ([`LocalModel`]);
//! - `mcp`: `mcp`, the farm as Model Context Protocol tools for outside
//!   agents (stdio or streamable HTTP), a client of the leader like `client`;
//! - `completions`: the shell completion scripts;
//! - `pipe`: a closed stdout pipe ends any command quietly with success.
//!
//! The library form exists so that other binaries (the end-to-end tests'
//! `mtswarm-node`) run exactly this command line: [`run`] is the whole of
//! `main`.

mod approval_prompt;
mod client;
mod common;
mod completions;
mod credentials;
mod daemons;
mod decision;
mod demo;
mod emu;
pub mod fuzzing;
mod llm;
mod llm_serve;
mod local_stack;
mod mcp;
mod metrics;
mod pipe;
mod render;
mod report;
mod results;
mod search;
mod up;
mod watch;

pub use credentials::generate_deployment;
pub use llm_serve::{
    DEFAULT_MODEL_FILE, LocalModel, LocalModelError, LocalModelOptions, default_model_dir,
    default_model_path,
};
pub use local_stack::{LeaderProcessArgs, StreamBytes, WorkerProcessArgs};
pub use mcp::MCP_TOOL_NAMES;
pub use up::{DEFAULT_FLEET_TOML, DEFAULT_METRICS_PORT};

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mtswarm_proto::v1::ApprovalVerdict;

use crate::common::TelemetryArgs;

/// The `mtswarm` command line: global telemetry flags and one command.
#[derive(Debug, Parser)]
#[command(
    name = "mtswarm",
    version,
    about = "Tune MT-3000 kernels on a farm of boards",
    long_about = "Tune MT-3000 kernels on a farm of boards with a leader agent and worker agents.\n\n\
                  Start a local stack with `mtswarm up`, then `mtswarm submit GOAL --kernel DIR --watch`.\n\
                  Client commands find the leader through --leader / MTSWARM_LEADER, else the\n\
                  client configuration (MTSWARM_CONFIG, else ~/.mtswarm/config.toml) and its\n\
                  --profile / MTSWARM_PROFILE.",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// Logging and trace export flags shared by every command.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Profile of the client configuration to use (`[profiles.NAME]`; default:
    /// the file's `profile`, else the local stack `mtswarm up` wrote).
    #[arg(long, env = "MTSWARM_PROFILE", global = true)]
    pub profile: Option<String>,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Every top-level `mtswarm` command; client commands are flattened in
/// from [`ClientCommand`].
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a local stack: nats-server, the leader and one worker per board.
    Up(up::UpCmd),
    /// Start a private local stack, tune a kernel end to end and report.
    Demo(demo::DemoCmd),
    /// Run the leader daemon (gRPC Control service, leader agents).
    Leader(daemons::LeaderCmd),
    /// Run a worker daemon for one board of a fleet.
    Worker(daemons::WorkerCmd),
    /// Write a deployment's credentials: certificates, tokens, NATS identities.
    Credentials(credentials::CredentialsCmd),
    /// The commands that talk to a running leader (submit, jobs, fleet, ...).
    #[command(flatten)]
    Client(ClientCommand),
    /// The MT-3000 emulator that ships with mtswarm.
    Emu(emu::EmuArgs),
    /// The builtin search outside a job: `mtswarm search replay FILE`.
    #[command(subcommand)]
    Search(search::SearchCommand),
    /// Model endpoints: `mtswarm llm check URL --llm-model M`; `mtswarm llm serve`.
    #[command(subcommand)]
    Llm(llm::LlmCommand),
    /// Serve the farm as Model Context Protocol tools (stdio, or streamable
    /// HTTP with --http) for outside agents and IDE assistants.
    Mcp(mcp::McpCmd),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsCmd),
}

/// The exit codes of every command, shown by `--help`.
pub const EXIT_CODES: &str = "Exit codes:\n  \
    0  success (for `submit --watch`, `watch` and `demo`: the job SUCCEEDED with a result)\n  \
    1  the job or run failed (FAILED, CANCELLED, no valid measurement; `cancel`: the job had already ended otherwise; `emu run`: the kernel failed)\n  \
    2  usage error, refused request or the leader / NATS could not be reached";

/// The commands that talk to a running leader.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Submit a tuning job.
    Submit(client::SubmitCmd),
    /// Follow a job's progress; in a terminal, decide its approvals as they come.
    Watch(watch::WatchCmd),
    /// List jobs, or show one (its outcome: best configuration, figures, candidates by status).
    Jobs(client::JobsCmd),
    /// Cancel a queued or running job: its loop and its agents stop, it ends CANCELLED.
    Cancel(client::CancelCmd),
    /// Write the HTML report of any job, running or finished (reads the leader and NATS).
    Report(report::ReportCmd),
    /// List the fleet's slices and worker daemons.
    Fleet(client::FleetCmd),
    /// List approval requests (pending by default).
    Approvals(client::ApprovalsCmd),
    /// Approve a paused tool call.
    Approve(client::DecideCmd),
    /// Deny a paused tool call.
    Deny(client::DecideCmd),
    /// Print a job's task results (one per task attempt).
    Tasks(client::TasksCmd),
    /// Quarantined slices: list them, return one to service.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
    /// Every measured candidate from the results store (reads NATS):
    /// filter, print, export as JSON lines or CSV.
    Results(results::ResultsCmd),
}

/// `mtswarm quarantine ...`.
#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// List quarantined slices with their reason and failure count.
    List(client::QuarantineListCmd),
    /// Return a quarantined slice to service.
    Lift(client::QuarantineLiftCmd),
}

/// Runs the command line of this process and returns its exit code
/// ([`EXIT_CODES`]): 0 success, 1 the job/run failed, 2 an error (printed
/// on stderr).
pub fn run() -> ExitCode {
    pipe::install_hook();
    let cli = Cli::parse();
    common::request_profile(cli.profile.clone());
    // A profile that does not exist is a usage error, not a silent fallback
    // to another deployment.
    if matches!(cli.command, Command::Client(_) | Command::Mcp(_))
        && let Err(error) = common::selected_profile()
    {
        eprintln!("mtswarm: {}", error_text(&error));
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("mtswarm: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        // The reader of our output went away (`| head`): it had enough.
        Err(error) if pipe::is_closed_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mtswarm: {}", error_text(&error));
            ExitCode::from(2)
        }
    }
}

/// `error` and its causes, outermost first, joined by ": ". A cause whose
/// text the line already ends with is left out: many library errors say
/// their source in their own message and also hand it on as the source,
/// which `{:#}` would print twice.
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let telemetry = cli.telemetry;
    match cli.command {
        Command::Up(cmd) => up::up(cmd, &telemetry).await,
        Command::Demo(cmd) => {
            let _guard = telemetry.init_client()?;
            demo::demo(cmd, &telemetry).await
        }
        Command::Leader(cmd) => daemons::leader(cmd, &telemetry).await,
        Command::Worker(cmd) => daemons::worker(cmd, &telemetry).await,
        Command::Credentials(cmd) => credentials::credentials(cmd),
        Command::Emu(args) => emu::main(args).await,
        Command::Search(command) => search::search(command),
        Command::Llm(command) => {
            let _guard = telemetry.init_client()?;
            llm::llm(command).await
        }
        Command::Completions(cmd) => completions::completions(cmd),
        Command::Mcp(cmd) => {
            // Logs go to stderr: on the stdio transport stdout is the protocol.
            let _guard = telemetry.init_client()?;
            mcp::mcp(cmd).await
        }
        Command::Client(command) => {
            let mut guard = telemetry.init_client()?;
            let result = match command {
                ClientCommand::Submit(cmd) => client::submit(cmd).await,
                ClientCommand::Watch(cmd) => watch::watch(cmd).await,
                ClientCommand::Jobs(cmd) => client::jobs(cmd).await,
                ClientCommand::Cancel(cmd) => client::cancel(cmd).await,
                ClientCommand::Report(cmd) => report::report(cmd).await,
                ClientCommand::Fleet(cmd) => client::fleet(cmd).await,
                ClientCommand::Approvals(cmd) => client::approvals(cmd).await,
                ClientCommand::Approve(cmd) => client::decide(cmd, ApprovalVerdict::Approve).await,
                ClientCommand::Deny(cmd) => client::decide(cmd, ApprovalVerdict::Deny).await,
                ClientCommand::Tasks(cmd) => client::tasks(cmd).await,
                ClientCommand::Quarantine(QuarantineCommand::List(cmd)) => {
                    client::quarantine_list(cmd).await
                }
                ClientCommand::Quarantine(QuarantineCommand::Lift(cmd)) => {
                    client::quarantine_lift(cmd).await
                }
                ClientCommand::Results(cmd) => results::results(cmd).await,
            };
            // Export the client's spans (the submit span starts the job's trace).
            if let Err(error) = guard.shutdown() {
                eprintln!("mtswarm: flushing traces: {error}");
            }
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::{Cli, error_text};

    #[test]
    fn a_cause_the_message_already_says_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("disk full")]
        struct Inner;
        #[derive(Debug, thiserror::Error)]
        #[error("NATS: {0}")]
        struct Outer(#[source] Inner);
        let error = anyhow::Error::new(Outer(Inner)).context("starting the leader");
        assert_eq!(error_text(&error), "starting the leader: NATS: disk full");
        let plain = anyhow::Error::new(Inner).context("starting the leader");
        assert_eq!(error_text(&plain), "starting the leader: disk full");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Deployments configure processes through the environment, so every
    /// flag of the system's commands has a variable (`emu` and `search`
    /// are local tools that read files, not a deployment's settings).
    #[test]
    fn every_flag_also_reads_an_environment_variable() {
        fn visit(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_env().is_none() {
                    missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id)));
                }
            }
            for sub in command.get_subcommands() {
                if matches!(sub.get_name(), "emu" | "search" | "help") {
                    continue;
                }
                visit(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        visit(&Cli::command(), "mtswarm", &mut missing);
        assert!(missing.is_empty(), "flags without an env var: {missing:?}");
    }

    #[test]
    fn client_commands_parse_with_their_flags() {
        let cli = Cli::try_parse_from([
            "mtswarm",
            "submit",
            "Make it fast, see @kernel.c",
            "--kernel",
            "dgemm",
            "--selector",
            "backend=emulator,cores>=8",
            "--agents",
            "3",
            "--wall-time",
            "600",
            "--watch",
            "--leader",
            "127.0.0.1:7700",
        ])
        .expect("parses");
        let super::Command::Client(super::ClientCommand::Submit(submit)) = cli.command else {
            panic!("not a submit: {:?}", cli.command);
        };
        assert_eq!(submit.agents, 3);
        assert!(submit.watch);
        assert_eq!(submit.leader.url(), "http://127.0.0.1:7700");
        assert!(Cli::try_parse_from(["mtswarm", "tasks", "job-1", "--format", "xml"]).is_err());
        assert!(Cli::try_parse_from(["mtswarm", "tasks", "job-1", "--format", "csv"]).is_ok());
        assert!(Cli::try_parse_from(["mtswarm", "results", "--format", "csv"]).is_ok());
        assert!(
            Cli::try_parse_from(["mtswarm", "results", "job-1", "--job", "job-2"]).is_err(),
            "a job given twice is refused"
        );
        assert!(
            Cli::try_parse_from(["mtswarm", "results", "--json", "--format", "csv"]).is_err(),
            "--json and --format are exclusive"
        );
        for (tokens, ok) in [("8192", true), ("1023", false), ("0", false)] {
            assert_eq!(
                Cli::try_parse_from(["mtswarm", "leader", "--llm-context-tokens", tokens]).is_ok(),
                ok,
                "--llm-context-tokens {tokens}"
            );
        }
        assert!(Cli::try_parse_from(["mtswarm", "quarantine", "lift", "board0-c1"]).is_ok());
        assert!(Cli::try_parse_from(["mtswarm", "quarantine", "lift"]).is_err());
        assert!(Cli::try_parse_from(["mtswarm", "quarantine", "list", "--json"]).is_ok());
    }

    #[test]
    fn an_extra_body_is_parsed_and_a_reserved_field_is_refused_by_name() {
        let llm_of = |body: &str| {
            let cli = Cli::try_parse_from([
                "mtswarm",
                "worker",
                "--fleet",
                "fleet.toml",
                "--board",
                "board0",
                "--llm-url",
                "http://127.0.0.1:8000/v1",
                "--llm-model",
                "qwen",
                "--llm-extra-body",
                body,
            ])
            .expect("parses");
            let super::Command::Worker(worker) = cli.command else {
                panic!("not a worker: {:?}", cli.command);
            };
            worker.llm
        };
        let fields = llm_of(r#"{"chat_template_kwargs": {"enable_thinking": false}}"#)
            .extra_body()
            .expect("a valid extra body");
        assert_eq!(fields["chat_template_kwargs"]["enable_thinking"], false);
        let error = llm_of(r#"{"top_k": 20, "stream": false}"#)
            .extra_body()
            .expect_err("a reserved field");
        assert!(error.to_string().contains("`stream`"), "{error}");
        let error = llm_of("[]").extra_body().expect_err("not an object");
        assert!(error.to_string().contains("an array"), "{error}");
    }

    #[test]
    fn mcp_serves_stdio_by_default_and_http_on_loopback_when_asked() {
        let http_of = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parses");
            let super::Command::Mcp(mcp) = cli.command else {
                panic!("not mcp: {:?}", cli.command);
            };
            mcp.http
        };
        assert_eq!(http_of(&["mtswarm", "mcp"]), None);
        let default = http_of(&["mtswarm", "mcp", "--http"]).expect("http");
        assert!(
            default.ip().is_loopback() && default.port() == 7790,
            "{default}"
        );
        let given = http_of(&["mtswarm", "mcp", "--http", "127.0.0.1:0"]).expect("http");
        assert_eq!(given.port(), 0);
        assert!(Cli::try_parse_from(["mtswarm", "mcp", "--http", "not-an-address"]).is_err());
    }
}
