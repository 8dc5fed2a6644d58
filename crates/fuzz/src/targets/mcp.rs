//! `mtswarm mcp`'s tool arguments (`crates/cli/src/mcp/arguments.rs`): a
//! call's JSON arguments read as the server reads them before it asks the
//! leader anything, through rmcp's own deserialization into the tool's
//! argument type, then the tool's checks (required goal and kernel, finite
//! budgets, known job states, the watch timeout's bounds). The input's
//! first line names the tool, the rest is the arguments' JSON. A refusal
//! is what the calling agent reads: it must be bounded (by its own
//! arguments, escaped, and 4 KiB, see [`MAX_ERROR_BYTES`]).

use mtswarm_cli::MCP_TOOL_NAMES;
use mtswarm_cli::fuzzing::mcp_arguments;

use crate::{Checked, Outcome, Target, refused_with};

pub(super) const TARGET: Target = Target {
    name: "mcp",
    about: "mtswarm mcp tool arguments: rmcp deserialization and each tool's checks (crates/cli/src/mcp)",
    check,
    dictionary: &[
        b"submit_job\n",
        b"watch_job\n",
        b"list_jobs\n",
        b"get_job\n",
        b"get_report\n",
        b"list_results\n",
        b"list_fleet\n",
        b"\"goal\": \"tune @kernel.c\"",
        b"\"kernel\": \"vecadd\"",
        b"\"device_seconds\": -1e308",
        b"\"device_seconds\": 1e999",
        b"\"timeout_seconds\": 18446744073709551615",
        b"\"timeout_seconds\": -1",
        b"\"states\": [\"running\", \"bogus\"]",
        b"\"agents\": 4294967296",
        b"\"model\": null",
        b"\"job_id\": \"../job\"",
        b"null",
        b"[]",
        b"\"\\u0000\"",
    ],
    seeds,
    max_len: 16 * 1024,
};

/// Longest refusal a calling agent may read beyond what it quotes of the
/// arguments: serde's errors (rmcp passes them on as the tool's error)
/// quote a string value of the wrong type whole, escaped (`\u{7f}`: six
/// bytes for one), so an error holds at most [`ESCAPED`] bytes per byte
/// of the arguments plus this; it grows with the caller's own input only.
const MAX_ERROR_BYTES: usize = 4096;

/// The most bytes serde's escaping writes for one byte of a string.
const ESCAPED: usize = 6;

fn check(input: &[u8]) -> Checked {
    let text = String::from_utf8_lossy(input);
    let (tool, arguments) = text.split_once('\n').unwrap_or((&text, ""));
    let tool = tool.trim();
    let known = MCP_TOOL_NAMES.contains(&tool);
    match mcp_arguments(tool, arguments) {
        Ok(call) => Ok(Outcome::accepted(format!("{tool}: {call}"))),
        Err(e) => {
            refused_with(&e.to_string(), MAX_ERROR_BYTES + ESCAPED * arguments.len()).map(|o| {
                Outcome::refused(format!(
                    "{}: {}",
                    if known { tool } else { "unknown" },
                    o.signature
                ))
            })
        }
    }
}

/// A valid call of each tool, then near misses.
fn seeds() -> Vec<Vec<u8>> {
    [
        "submit_job\n{\"goal\": \"Make vecadd fast, see @kernel.c\", \"kernel\": \"vecadd\", \"selector\": \"backend=emulator\", \"agents\": 2, \"max_steps\": 30, \"device_seconds\": 60.5, \"model\": \"qwen\", \"auto_approve\": true, \"idempotency_key\": \"k1\"}",
        "submit_job\n{\"goal\": \"\", \"kernel\": \"vecadd\"}",
        "submit_job\n{\"goal\": \"tune\", \"kernel\": \"vecadd\", \"device_seconds\": -1}",
        "submit_job\n{\"goal\": \"tune\"}",
        "submit_job\n{\"goal\": \"tune\", \"kernel\": \"vecadd\", \"agents\": -1}",
        "list_jobs\n{\"states\": [\"running\", \"queued\"]}",
        "list_jobs\n{\"states\": [\"bogus\"]}",
        "list_jobs\n",
        "list_jobs\nnull",
        "list_jobs\n[1, 2]",
        "watch_job\n{\"job_id\": \"job-1\", \"timeout_seconds\": 30, \"from_sequence\": 4, \"agent_events\": true}",
        "watch_job\n{\"job_id\": \"job-1\", \"timeout_seconds\": 18446744073709551615}",
        "watch_job\n{\"timeout_seconds\": 0}",
        "get_job\n{\"job_id\": \"job-1\"}",
        "get_job\n{\"job_id\": 7}",
        "get_report\n{\"job_id\": \"job-1\", \"html\": true}",
        "list_results\n{\"job_id\": \"job-1\", \"status\": \"ok\"}",
        "list_fleet\n{\"selector\": \"cores>=8\"}",
        "list_fleet\n{\"selector\": null}",
        "delete_everything\n{}",
    ]
    .into_iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
