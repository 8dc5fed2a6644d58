//! Edited sources under test: a task that carries the unified diff of an
//! edited kernel (`"source_diff"`, as the leader sends when it confirms a
//! best built from edited sources) applies it with `apply_patch` before its
//! plan builds anything, so the candidate measured is the one that was
//! measured before, not the pristine kernel under the same knobs.
//!
//! The diff names files relative to the kernel directory (`a/kernel.c`, as
//! records carry it); `apply_patch` resolves paths against the workspace,
//! so the headers are rebased onto the task's kernel directory. A diff
//! that does not apply ends the task with that reason: measuring the
//! pristine kernel instead would report a disagreement that is not one.

use mtswarm_core::{Message, Role, ToolCall};
use serde_json::json;

use super::Decision;
use super::outcome::{final_error, first_line};
use super::params::TaskParameters;

/// Id of the one `apply_patch` call (not a candidate's: no `c<index>-`).
pub(super) const PATCH_CALL_ID: &str = "patch-source";

/// The patch stage's move: `Some` while the diff is still to be applied (or
/// failed to apply), `None` once the plan may build.
pub(super) fn decide(params: &TaskParameters, messages: &[Message]) -> Option<Decision> {
    let diff = params.source_diff.as_deref()?;
    let called = messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| m.tool_calls.iter())
        .any(|c| c.id == PATCH_CALL_ID);
    if !called {
        return Some(Decision::Call(ToolCall {
            id: PATCH_CALL_ID.to_owned(),
            name: "apply_patch".to_owned(),
            arguments: json!({"patch": rebase(diff, &params.kernel_dir)}).to_string(),
        }));
    }
    let answer = messages
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(PATCH_CALL_ID))
        .map(|m| m.content.as_str());
    match answer {
        Some(content) if !content.trim().is_empty() && !content.starts_with("error") => None,
        Some(content) => Some(Decision::Final(final_error(&format!(
            "the task's source_diff does not apply to {}: {}",
            params.kernel_dir,
            first_line(content)
        )))),
        None => Some(Decision::Final(final_error(
            "the task's source_diff was sent to apply_patch and never answered",
        ))),
    }
}

/// The diff with every `---`/`+++` header path moved under `kernel_dir`
/// (`/dev/null` stays: a created or deleted file). Hunk bodies are skipped
/// by their counts, so a removed line that reads `-- x` is not a header.
fn rebase(diff: &str, kernel_dir: &str) -> String {
    let dir = kernel_dir.trim_end_matches('/');
    let mut out = String::with_capacity(diff.len() + 64);
    // Old and new lines left in the current hunk.
    let mut left = (0usize, 0usize);
    for line in diff.split_inclusive('\n') {
        if left != (0, 0) {
            match line.as_bytes().first() {
                Some(b'-') => left.0 = left.0.saturating_sub(1),
                Some(b'+') => left.1 = left.1.saturating_sub(1),
                Some(b'\\') => {}
                _ => left = (left.0.saturating_sub(1), left.1.saturating_sub(1)),
            }
            out.push_str(line);
            continue;
        }
        if let Some(counts) = hunk_counts(line) {
            left = counts;
            out.push_str(line);
            continue;
        }
        match header(line) {
            Some((marker, side, rest)) => {
                out.push_str(marker);
                out.push_str(side);
                out.push_str(dir);
                out.push('/');
                out.push_str(rest);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Old and new line counts of a hunk header `@@ -a[,b] +c[,d] @@`.
fn hunk_counts(line: &str) -> Option<(usize, usize)> {
    let ranges = line.strip_prefix("@@ -")?.split(" @@").next()?;
    let (old, new) = ranges.split_once(" +")?;
    let count = |range: &str| match range.split_once(',') {
        Some((_, n)) => n.trim().parse().ok(),
        None => Some(1),
    };
    Some((count(old)?, count(new)?))
}

/// Splits a header line into its marker (`--- ` or `+++ `), the `a/`/`b/`
/// side prefix (empty when absent) and the rest; `None` for any other line
/// and for `/dev/null`.
fn header(line: &str) -> Option<(&str, &str, &str)> {
    let (marker, rest) = if let Some(rest) = line.strip_prefix("--- ") {
        ("--- ", rest)
    } else {
        ("+++ ", line.strip_prefix("+++ ")?)
    };
    if rest.starts_with("/dev/null") {
        return None;
    }
    for side in ["a/", "b/"] {
        if let Some(path) = rest.strip_prefix(side) {
            return Some((marker, side, path));
        }
    }
    Some((marker, "", rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_move_under_the_kernel_directory_and_bodies_do_not() {
        // The first hunk removes a line `-- x` and adds `++ y`: body lines
        // that look like headers.
        let diff = "--- a/kernel.c\n+++ b/kernel.c\n@@ -1,2 +1,2 @@\n int a;\n--- x\n+++ y\n--- /dev/null\n+++ b/extra.h\n@@ -0,0 +1 @@\n+int x;\n";
        assert_eq!(
            rebase(diff, "vecadd/"),
            "--- a/vecadd/kernel.c\n+++ b/vecadd/kernel.c\n@@ -1,2 +1,2 @@\n int a;\n--- x\n+++ y\n--- /dev/null\n+++ b/vecadd/extra.h\n@@ -0,0 +1 @@\n+int x;\n"
        );
        assert_eq!(hunk_counts("@@ -3 +3,4 @@ fn"), Some((1, 4)));
        assert_eq!(hunk_counts("@@ bad"), None);
    }
}
