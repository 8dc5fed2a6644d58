//! A tool call's arguments as the server reads them before it asks the
//! leader anything: the JSON object the call carries, deserialized into
//! the tool's argument type by rmcp's own `parse_json_object` (what the
//! `Parameters` extractor of every tool runs), then the tool's own checks
//! (required fields, finite budgets, known job states). No network: the
//! fuzz target of `mtswarm-fuzz` runs this through [`crate::fuzzing`].

use rmcp::handler::server::tool::parse_json_object;
use rmcp::model::JsonObject;

use super::fleet::ListFleet;
use super::job::GetJob;
use super::jobs::ListJobs;
use super::reply::ToolError;
use super::report::GetReport;
use super::results::ListResults;
use super::submit::SubmitJob;
use super::watch::WatchJob;

/// Why a call's arguments were refused before the leader was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArgumentsError {
    /// The call's `arguments` is not a JSON object (or absent).
    #[error("the arguments are not a JSON object: {0}")]
    NotAnObject(#[source] serde_json::Error),
    /// No tool has this name (its first 64 characters).
    #[error("no tool {0:?}")]
    UnknownTool(String),
    /// The object does not deserialize into the tool's arguments (rmcp's
    /// message, which the client gets as the tool's error).
    #[error("{0}")]
    Parameters(String),
    /// The tool's own checks refused them.
    #[error(transparent)]
    Tool(#[from] ToolError),
}

fn parse<T: serde::de::DeserializeOwned>(arguments: JsonObject) -> Result<T, ArgumentsError> {
    parse_json_object(arguments).map_err(|e| ArgumentsError::Parameters(e.message.into_owned()))
}

/// Reads `arguments` (the JSON text of a call's `arguments`, absent when
/// blank) for tool `tool` as the server does; a short description of what
/// the call would ask of the leader.
pub(crate) fn check_arguments(tool: &str, arguments: &str) -> Result<String, ArgumentsError> {
    let object: JsonObject = if arguments.trim().is_empty() {
        JsonObject::new()
    } else {
        serde_json::from_str::<Option<JsonObject>>(arguments)
            .map_err(ArgumentsError::NotAnObject)?
            .unwrap_or_default()
    };
    Ok(match tool {
        "submit_job" => {
            let request = parse::<SubmitJob>(object)?.request()?;
            let spec = request.spec.unwrap_or_default();
            format!(
                "submit {} agents, model {}",
                spec.num_agents.min(3),
                spec.model.is_some()
            )
        }
        "list_jobs" => format!(
            "{} states",
            parse::<ListJobs>(object)?.states()?.len().min(3)
        ),
        "watch_job" => {
            let timeout = parse::<WatchJob>(object)?.timeout().as_secs();
            format!("watch for {}", if timeout > 300 { "long" } else { "short" })
        }
        "get_job" => parse::<GetJob>(object).map(|_| "get job".into())?,
        "get_report" => parse::<GetReport>(object).map(|_| "report".into())?,
        "list_results" => parse::<ListResults>(object).map(|_| "results".into())?,
        "list_fleet" => parse::<ListFleet>(object).map(|_| "fleet".into())?,
        other => {
            return Err(ArgumentsError::UnknownTool(
                other.chars().take(64).collect(),
            ));
        }
    })
}
