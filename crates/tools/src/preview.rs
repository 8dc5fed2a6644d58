//! What a tool call will do, said before it runs: the candidate it builds
//! or runs (its `-D` parameters), the slice, an estimate of the device
//! time, and the workspace files it writes or reads. Approval requests carry
//! it, so a human decides on "benchmark BUF=2 KB=64 on board0-c0, about
//! 12 ms of device time" rather than on `{"artifact":"b3"}`.
//!
//! The preview reads the session's memory only (artifacts and measured
//! candidates); it never touches the hardware or the files.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::env::ToolEnv;

/// What one call will do, as far as the session knows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallPreview {
    /// The candidate's `-D` parameters (empty when the call has none).
    pub candidate: BTreeMap<String, String>,
    /// The slice the call uses.
    pub slice_id: String,
    /// Estimated device time in seconds, when the session can tell.
    pub estimated_device_seconds: Option<f64>,
    /// Workspace files the call writes, or reads as its input.
    pub files: Vec<String>,
}

impl CallPreview {
    /// One line for a human: the tool, the candidate, the slice, the device
    /// time and the files.
    pub fn summary(&self, tool: &str) -> String {
        let mut line = tool.to_owned();
        if !self.candidate.is_empty() {
            let parameters: Vec<String> = self
                .candidate
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            line.push(' ');
            line.push_str(&parameters.join(" "));
        }
        if !self.slice_id.is_empty() {
            line.push_str(&format!(" on {}", self.slice_id));
        }
        match self.estimated_device_seconds {
            Some(seconds) => line.push_str(&format!(
                ", about {} of device time",
                human_seconds(seconds)
            )),
            None if self.uses_device(tool) => line.push_str(", device time not known yet"),
            None => {}
        }
        if !self.files.is_empty() {
            line.push_str(&format!("; files: {}", self.files.join(", ")));
        }
        line
    }

    fn uses_device(&self, tool: &str) -> bool {
        matches!(tool, "run" | "validate" | "benchmark" | "profile")
    }
}

fn human_seconds(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.1} s")
    } else if seconds >= 1e-3 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{:.0} us", seconds * 1e6)
    }
}

fn text_argument<'a>(arguments: &'a Value, name: &str) -> Option<&'a str> {
    arguments
        .get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

fn count_argument(arguments: &Value, name: &str) -> Option<u32> {
    arguments
        .get(name)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

impl ToolEnv {
    /// What calling `tool` with `arguments` will do (best effort: unknown
    /// tools and artifacts give an empty preview, never an error).
    pub fn preview(&self, tool: &str, arguments: &Value) -> CallPreview {
        let mut preview = CallPreview {
            slice_id: self.slice_id(),
            ..CallPreview::default()
        };
        match tool {
            "compile" => {
                if let Some(defines) = arguments.get("defines").and_then(Value::as_object) {
                    preview.candidate = defines
                        .iter()
                        .map(|(name, value)| {
                            let value = match value {
                                Value::String(text) => text.clone(),
                                other => other.to_string(),
                            };
                            (name.clone(), value)
                        })
                        .collect();
                }
                let dir = self
                    .kernel_dir_or_only(text_argument(arguments, "kernel_dir"))
                    .unwrap_or_else(|_| ".".into());
                preview.files.push(format!("{dir}/ (read)"));
            }
            "run" | "validate" | "benchmark" | "profile" => {
                let session = self.session();
                let id = text_argument(arguments, "artifact")
                    .map(str::to_owned)
                    .or_else(|| session.latest.clone());
                let Some(built) = id.as_deref().and_then(|id| session.artifacts.get(id)) else {
                    return preview;
                };
                preview.candidate = built.artifact.defines.clone();
                preview.files.push(format!("{}/ (read)", built.kernel_dir));
                // The last median of this code, else the session's baseline.
                let per_execution = session
                    .candidates
                    .iter()
                    .find(|c| c.kernel_hash == built.artifact.kernel_hash)
                    .map(|c| c.median_seconds)
                    .or(session.baseline_seconds);
                let executions = match tool {
                    "benchmark" => {
                        1 + count_argument(arguments, "warmup")
                            .unwrap_or(self.measure_defaults.warmup)
                            + count_argument(arguments, "repeats")
                                .unwrap_or(self.measure_defaults.min_repeats)
                    }
                    _ => 1,
                };
                preview.estimated_device_seconds =
                    per_execution.map(|seconds| seconds * f64::from(executions));
            }
            "write_file" => {
                if let Some(path) = text_argument(arguments, "path") {
                    preview.files.push(path.to_owned());
                }
            }
            "apply_patch" => match text_argument(arguments, "path") {
                Some(path) => preview.files.push(path.to_owned()),
                None => {
                    // The files a unified diff names in its `+++` headers.
                    let patch = text_argument(arguments, "patch").unwrap_or_default();
                    preview.files.extend(
                        patch
                            .lines()
                            .filter_map(|line| line.strip_prefix("+++ "))
                            .map(|path| path.trim().trim_start_matches("b/").to_owned())
                            .filter(|path| !path.is_empty() && path != "/dev/null"),
                    );
                }
            },
            _ => {}
        }
        preview
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_name_the_candidate_slice_time_and_files() {
        let preview = CallPreview {
            candidate: BTreeMap::from([
                ("BUF".to_owned(), "2".to_owned()),
                ("KB".to_owned(), "64".to_owned()),
            ]),
            slice_id: "board0-c0".into(),
            estimated_device_seconds: Some(0.0123),
            files: vec!["dgemm/ (read)".into()],
        };
        assert_eq!(
            preview.summary("benchmark"),
            "benchmark BUF=2 KB=64 on board0-c0, about 12.3 ms of device time; files: dgemm/ (read)"
        );
        let unknown = CallPreview {
            slice_id: "s".into(),
            ..CallPreview::default()
        };
        assert_eq!(
            unknown.summary("validate"),
            "validate on s, device time not known yet"
        );
        assert_eq!(unknown.summary("write_file"), "write_file on s");
    }
}
