//! SubmitJob validation: everything a request can get wrong is found before
//! anything is stored, and each problem gets a message that names it (empty
//! goal, unknown kernel directory, bad selector, oversize goal or
//! attachments, bad budgets). `@path` references in the goal are resolved
//! here, relative to the kernel directory and confined to it.

use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use mtswarm_bus::v1;
use mtswarm_hw::SliceSelector;
use regex::Regex;

use crate::config::SubmitLimits;
use crate::fleet::parse_selector;

/// A file named by `@path` in the goal, read at submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// As written in the goal, relative to the kernel directory.
    pub path: String,
    pub content: String,
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub struct ValidatedJob {
    pub spec: v1::JobSpec,
    /// Canonical kernel directory.
    pub kernel_dir: PathBuf,
    pub selector: Option<SliceSelector>,
    pub attachments: Vec<Attachment>,
}

/// `@path` after start of text, whitespace or an opening bracket/quote.
static AT_PATH: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"(?:^|[\s(\[{"'`])@([A-Za-z0-9_][A-Za-z0-9_./-]*)"#).expect("valid regex")
});

/// Checks that `relative` is a plain relative path (no root, no `..`).
fn plain_relative(what: &str, relative: &str) -> Result<(), String> {
    let path = Path::new(relative);
    if path.is_absolute() {
        return Err(format!("{what} {relative:?} must be relative"));
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!("{what} {relative:?} must not contain `..`"));
    }
    Ok(())
}

/// Resolves the job's kernel directory under `kernel_root` (canonical).
pub fn resolve_kernel_dir(kernel_root: &Path, kernel_dir: &str) -> Result<PathBuf, String> {
    if kernel_dir.trim().is_empty() {
        return Err("kernel_dir is empty: name a kernel directory under the kernel root".into());
    }
    plain_relative("kernel_dir", kernel_dir)?;
    let unknown = || {
        format!(
            "unknown kernel directory {kernel_dir:?}: no such directory under the kernel root {}",
            kernel_root.display()
        )
    };
    let resolved = kernel_root
        .join(kernel_dir)
        .canonicalize()
        .map_err(|_| unknown())?;
    if !resolved.starts_with(kernel_root) || !resolved.is_dir() {
        return Err(unknown());
    }
    Ok(resolved)
}

/// Resolves a file below `kernel_dir` (canonical, confined, a regular file).
pub fn resolve_file(kernel_dir: &Path, relative: &str) -> Result<PathBuf, String> {
    plain_relative("path", relative)?;
    let resolved = kernel_dir
        .join(relative)
        .canonicalize()
        .map_err(|_| format!("{relative:?} does not exist in the kernel directory"))?;
    if !resolved.starts_with(kernel_dir) {
        return Err(format!("{relative:?} leaves the kernel directory"));
    }
    if !resolved.is_file() {
        return Err(format!("{relative:?} is not a regular file"));
    }
    Ok(resolved)
}

/// The distinct `@path` references of `goal`, in order of appearance.
pub fn at_references(goal: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for capture in AT_PATH.captures_iter(goal) {
        let raw = capture.get(1).map(|m| m.as_str()).unwrap_or_default();
        // Sentence punctuation is not part of the path.
        let path = raw.trim_end_matches(['.', ',', ';', ':']).to_string();
        if !path.is_empty() && !seen.contains(&path) {
            seen.push(path);
        }
    }
    seen
}

fn check_budgets(budgets: &v1::Budgets, limits: &SubmitLimits) -> Result<(), String> {
    if budgets.max_steps > limits.max_steps {
        return Err(format!(
            "bad budgets: max_steps {} exceeds the limit {}",
            budgets.max_steps, limits.max_steps
        ));
    }
    if !budgets.device_seconds.is_finite() || budgets.device_seconds < 0.0 {
        return Err(format!(
            "bad budgets: device_seconds must be a finite number >= 0, got {}",
            budgets.device_seconds
        ));
    }
    if budgets.device_seconds > limits.max_device_seconds {
        return Err(format!(
            "bad budgets: device_seconds {} exceeds the limit {}",
            budgets.device_seconds, limits.max_device_seconds
        ));
    }
    if budgets.wall_time_seconds > limits.max_wall_time_seconds {
        return Err(format!(
            "bad budgets: wall_time_seconds {} exceeds the limit {}",
            budgets.wall_time_seconds, limits.max_wall_time_seconds
        ));
    }
    if budgets.max_tokens > 0 && budgets.max_tokens < 1_000 {
        return Err(format!(
            "bad budgets: max_tokens {} is too small for a leader loop (at least 1000, or 0 for no limit)",
            budgets.max_tokens
        ));
    }
    Ok(())
}

fn check_model(model: &v1::ModelSettings) -> Result<(), String> {
    let url = &model.base_url;
    if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!(
            "model.base_url {:?} must start with http:// or https://",
            model.base_url
        ));
    }
    if let Some(t) = model.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(format!("model.temperature {t} must be within 0..=2"));
    }
    Ok(())
}

/// Validates a SubmitJob request. `kernel_root` must be canonical.
pub fn validate_submit(
    spec: Option<&v1::JobSpec>,
    kernel_root: &Path,
    limits: &SubmitLimits,
) -> Result<ValidatedJob, String> {
    let spec = spec.ok_or("spec is missing")?.clone();
    if spec.goal.trim().is_empty() {
        return Err("goal is empty: describe what to tune".into());
    }
    if spec.goal.len() > limits.max_goal_bytes {
        return Err(format!(
            "goal is too large: {} bytes (limit {})",
            spec.goal.len(),
            limits.max_goal_bytes
        ));
    }
    let kernel_dir = resolve_kernel_dir(kernel_root, &spec.kernel_dir)?;
    let selector =
        parse_selector(&spec.slice_selector).map_err(|e| format!("bad slice_selector: {e}"))?;
    if let Some(budgets) = &spec.budgets {
        check_budgets(budgets, limits)?;
    }
    if spec.num_agents > limits.max_agents {
        return Err(format!(
            "num_agents {} exceeds the limit {}",
            spec.num_agents, limits.max_agents
        ));
    }
    if let Some(model) = &spec.model {
        check_model(model)?;
    }
    let references = at_references(&spec.goal);
    if references.len() > limits.max_attachments {
        return Err(format!(
            "goal references {} files with @path (limit {})",
            references.len(),
            limits.max_attachments
        ));
    }
    let mut attachments = Vec::new();
    let mut total: u64 = 0;
    for reference in references {
        let path = resolve_file(&kernel_dir, &reference)
            .map_err(|e| format!("attachment @{reference}: {e}"))?;
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("attachment @{reference}: {e}"))?
            .len();
        if size > limits.max_attachment_bytes {
            return Err(format!(
                "attachment @{reference} is too large: {size} bytes (limit {})",
                limits.max_attachment_bytes
            ));
        }
        total = total.saturating_add(size);
        if total > limits.max_total_attachment_bytes {
            return Err(format!(
                "attachments are too large together: more than {} bytes (limit {})",
                total, limits.max_total_attachment_bytes
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("attachment @{reference}: {e}"))?;
        let content = String::from_utf8(bytes)
            .map_err(|_| format!("attachment @{reference} is not UTF-8 text"))?;
        attachments.push(Attachment {
            path: reference,
            content,
        });
    }
    Ok(ValidatedJob {
        spec,
        kernel_dir,
        selector,
        attachments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_references_skip_emails_and_trailing_punctuation() {
        let refs = at_references("Tune @kernel.c. See (@host.c) and mail a@b.c; again @kernel.c");
        assert_eq!(refs, vec!["kernel.c".to_string(), "host.c".to_string()]);
    }

    #[test]
    fn paths_that_escape_are_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir(root.join("k")).expect("mkdir");
        assert!(
            resolve_kernel_dir(&root, "../k")
                .unwrap_err()
                .contains("..")
        );
        assert!(
            resolve_kernel_dir(&root, "/etc")
                .unwrap_err()
                .contains("relative")
        );
        assert!(
            resolve_kernel_dir(&root, "nope")
                .unwrap_err()
                .contains("unknown kernel directory")
        );
        let k = resolve_kernel_dir(&root, "k").expect("k resolves");
        assert!(
            resolve_file(&k, "missing.c")
                .unwrap_err()
                .contains("does not exist")
        );
    }
}
