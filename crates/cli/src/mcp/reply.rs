//! How a tool's answer or failure becomes an MCP result. Failures are tool
//! errors (`isError: true`), not protocol errors, so the calling agent
//! reads why: a refusal by the leader keeps its gRPC code
//! (`PERMISSION_DENIED`, `NOT_FOUND`, ...) next to the leader's message.

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// Why a tool call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    /// The leader refused or failed the call.
    #[error("{what}: {}", leader_words(.status))]
    Leader {
        /// What the tool was doing ("submitting the job").
        what: &'static str,
        /// The leader's answer.
        status: tonic::Status,
    },
    /// The arguments make no sense before anything is asked of the leader.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// The leader could not be reached (or its credential not read).
    #[error("{0:#}")]
    Connect(anyhow::Error),
    /// Anything else on the way (connecting, the results store).
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl ToolError {
    /// A refusal or failure of the leader while doing `what`.
    pub(crate) fn leader(what: &'static str) -> impl FnOnce(tonic::Status) -> ToolError {
        move |status| ToolError::Leader { what, status }
    }

    /// The gRPC code's name (`INVALID_ARGUMENT` for arguments refused
    /// here, `UNAVAILABLE` when the leader cannot be reached, `FAILED`
    /// otherwise).
    fn code(&self) -> String {
        match self {
            ToolError::Leader { status, .. } => grpc_code_name(status.code()).to_string(),
            ToolError::Invalid(_) => "INVALID_ARGUMENT".to_string(),
            ToolError::Connect(_) => "UNAVAILABLE".to_string(),
            ToolError::Other(_) => "FAILED".to_string(),
        }
    }
}

/// The leader's status as people read it.
fn leader_words(status: &tonic::Status) -> String {
    let message = status.message();
    match status.code() {
        tonic::Code::PermissionDenied => format!("not allowed for this credential: {message}"),
        tonic::Code::Unauthenticated => {
            format!("the leader did not accept the credential: {message}")
        }
        tonic::Code::NotFound => format!("not found: {message}"),
        tonic::Code::InvalidArgument => format!("invalid request: {message}"),
        tonic::Code::Unavailable => format!("the leader cannot be reached: {message}"),
        tonic::Code::DeadlineExceeded => format!("the leader did not answer in time: {message}"),
        _ => message.to_string(),
    }
}

/// `PERMISSION_DENIED` for `Code::PermissionDenied`, as gRPC names codes.
fn grpc_code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The MCP result of a tool: its JSON answer as structured content (and
/// as text, for clients that read only text), or the error with its code.
pub(crate) fn reply(result: Result<Value, ToolError>) -> CallToolResult {
    match result {
        Ok(value) => CallToolResult::structured(value),
        Err(error) => {
            tracing::debug!(%error, "MCP tool call failed");
            CallToolResult::structured_error(json!({
                "error": error.to_string(),
                "code": error.code(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_keeps_its_code_and_says_what_was_refused() {
        let result = reply(Err(ToolError::leader("submitting the job")(
            tonic::Status::permission_denied("identity \"approver\" lacks role submit"),
        )));
        assert_eq!(result.is_error, Some(true));
        let value = result.structured_content.expect("structured");
        assert_eq!(value["code"], "PERMISSION_DENIED");
        let text = value["error"].as_str().expect("text");
        assert!(
            text.starts_with("submitting the job: not allowed"),
            "{text}"
        );
        assert!(text.contains("lacks role submit"), "{text}");
    }

    #[test]
    fn an_answer_is_structured_and_textual() {
        let result = reply(Ok(json!({"job_id": "j1"})));
        assert_eq!(result.is_error, Some(false));
        assert_eq!(result.structured_content, Some(json!({"job_id": "j1"})));
    }
}
