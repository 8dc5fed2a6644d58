//! `mtswarm llm check URL --llm-model M`: whether an OpenAI-compatible
//! endpoint can drive mtswarm's agents, capability by capability, what
//! mtswarm does about what it lacks ([`mtswarm_llm::probe`]), and the tool
//! mode setting the daemons need for it (`--llm-tool-mode`).
//!
//! Exit 0 when the endpoint can drive jobs (tool calls in some mode and
//! tool results work), 1 when it cannot, 2 when the command itself failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use comfy_table::{ContentArrangement, Table, presets::UTF8_BORDERS_ONLY};
use mtswarm_llm::probe::{ProbeReport, Verdict, probe};
use mtswarm_llm::{OpenAiConfig, ToolMode};

/// The daemons' flag that sets the tool mode (`mtswarm leader`, `mtswarm
/// worker`; the variable [`mtswarm_llm::openai::ENV_TOOL_MODE`] too).
const TOOL_MODE_FLAG: &str = "--llm-tool-mode";

/// `mtswarm llm ...`.
#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Probe an endpoint: models list, streamed tool calls, tool results,
    /// parallel calls, usage; say what works and what mtswarm does about the rest.
    Check(LlmCheckCmd),
    /// Serve a GGUF model on loopback (llama.cpp from PyPI's xllamacpp) and
    /// print the URL and model name for the daemons.
    Serve(crate::llm_serve::LlmServeCmd),
}

/// Arguments of `mtswarm llm check`.
#[derive(Debug, Args)]
pub struct LlmCheckCmd {
    /// Base URL of the endpoint, e.g. http://127.0.0.1:8000/v1.
    pub url: String,
    /// Model name at that endpoint (`--model` is the same flag).
    #[arg(long, visible_alias = "model", env = "MTSWARM_LLM_MODEL")]
    pub llm_model: String,
    /// File holding the endpoint's API key (else MTSWARM_LLM_API_KEY).
    #[arg(long, env = "MTSWARM_LLM_API_KEY_FILE")]
    pub llm_api_key_file: Option<PathBuf>,
    /// JSON object merged into every probing request (as the daemons'
    /// `--llm-extra-body`), e.g. `{"chat_template_kwargs": {"enable_thinking": false}}`.
    #[arg(long, env = "MTSWARM_LLM_EXTRA_BODY")]
    pub llm_extra_body: Option<String>,
    /// Seconds to wait for each probing request.
    #[arg(long, env = "MTSWARM_LLM_CHECK_TIMEOUT", default_value_t = 60)]
    pub timeout: u64,
    /// One JSON object: the endpoint, the model and every check.
    #[arg(long, env = "MTSWARM_JSON")]
    pub json: bool,
}

/// Runs an `mtswarm llm` command.
pub(crate) async fn llm(command: LlmCommand) -> anyhow::Result<ExitCode> {
    match command {
        LlmCommand::Check(cmd) => check(cmd).await,
        LlmCommand::Serve(cmd) => crate::llm_serve::serve(cmd).await,
    }
}

async fn check(cmd: LlmCheckCmd) -> anyhow::Result<ExitCode> {
    let mut config = OpenAiConfig::new(cmd.url.trim(), cmd.llm_model.trim());
    let key = match &cmd.llm_api_key_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the API key file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var(mtswarm_llm::openai::ENV_API_KEY).ok(),
    };
    if let Some(key) = key.filter(|k| !k.is_empty()) {
        config = config.with_api_key(key);
    }
    if let Some(text) = cmd
        .llm_extra_body
        .as_deref()
        .filter(|t| !t.trim().is_empty())
    {
        config.extra_body = mtswarm_llm::openai::parse_extra_body(text)?;
    }
    let report = probe(config, Duration::from_secs(cmd.timeout.max(1)))
        .await
        .context("probing the endpoint")?;
    if cmd.json {
        println!(
            "{}",
            serde_json::json!({
                "endpoint": report.endpoint,
                "model": report.model,
                "can_drive_mtswarm": report.can_drive_mtswarm(),
                "tool_mode": report.tool_mode,
                "setting": report.tool_mode.map(|mode| serde_json::json!({
                    "flag": format!("{TOOL_MODE_FLAG} {}", mode.as_str()),
                    "env": format!("{}={}", mtswarm_llm::openai::ENV_TOOL_MODE, mode.as_str()),
                })),
                "checks": report.checks,
            })
        );
    } else {
        print_report(&report);
    }
    Ok(if report.can_drive_mtswarm() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_report(report: &ProbeReport) {
    println!("{} ({})", report.endpoint, report.model);
    let mut table = Table::new();
    table
        .load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(["capability", "result", "seen", "without it, mtswarm"]);
    if table.width().is_none() {
        // Not a terminal: wrap to a width logs and mail keep readable.
        table.set_width(120);
    }
    for check in &report.checks {
        let verdict = match check.verdict {
            Verdict::Works => "works",
            Verdict::Missing => "missing",
            Verdict::Failed => "failed",
        };
        let consequence = match check.verdict {
            Verdict::Works => "",
            Verdict::Missing => check.capability.without_it(),
            Verdict::Failed => "could not tell (see what was seen)",
        };
        table.add_row([
            check.capability.describe(),
            verdict,
            check.detail.as_str(),
            consequence,
        ]);
    }
    println!("{table}");
    println!("{}", verdict_line(report));
}

/// What the report means for a deployment: whether the endpoint can drive
/// the agents and, when it can, the exact tool mode setting.
fn verdict_line(report: &ProbeReport) -> String {
    let env = mtswarm_llm::openai::ENV_TOOL_MODE;
    match report.tool_mode {
        _ if !report.can_drive_mtswarm() => {
            "this endpoint cannot drive mtswarm's agents yet: see the rows above".to_owned()
        }
        Some(ToolMode::Text) => format!(
            "this endpoint can drive mtswarm's agents in text tool mode: start the daemons that use it with {TOOL_MODE_FLAG} text (or {env}=text in their environment, which `mtswarm up` passes on)"
        ),
        _ => format!(
            "this endpoint can drive mtswarm's agents with native tool calls: keep the default {TOOL_MODE_FLAG} native ({env}=native)"
        ),
    }
}
