//! The entry point of `mtswarm mcp`'s argument checks for the fuzz targets
//! of `mtswarm-fuzz`: a tool call's JSON arguments deserialized into the
//! tool's argument type and checked as the server does before it asks the
//! leader anything (`mcp/arguments.rs`).

/// Why a tool call's arguments were refused (the message the calling
/// agent reads).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct McpArgumentsRefused(#[from] crate::mcp::ArgumentsError);

/// Reads `arguments` (JSON text; blank: none) for the MCP tool `tool`;
/// a short description of the call it would make.
pub fn mcp_arguments(tool: &str, arguments: &str) -> Result<String, McpArgumentsRefused> {
    Ok(crate::mcp::check_arguments(tool, arguments)?)
}
