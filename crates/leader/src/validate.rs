//! SubmitJob validation: everything a request can get wrong is found before
//! anything is stored, and each problem gets a message that names it (empty
//! goal, unknown kernel directory, bad selector, oversize goal or
//! attachments, bad budgets). `@path` references in the goal are resolved
//! here, relative to the kernel directory and confined to it.

use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use mtswarm_bus::v1;
use regex::Regex;

use crate::config::SubmitLimits;
use crate::error::ValidateError;
use crate::fleet::parse_selector;

/// A file named by `@path` in the goal, read at submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// As written in the goal, relative to the kernel directory.
    pub path: String,
    /// The file's text (attachments must be UTF-8).
    pub content: String,
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub(crate) struct ValidatedJob {
    /// The request's spec, unchanged.
    pub spec: v1::JobSpec,
    /// Canonical kernel directory.
    pub kernel_dir: PathBuf,
    /// The goal's `@path` files, in order of first appearance.
    pub attachments: Vec<Attachment>,
}

/// `@path` after start of text, whitespace or an opening bracket/quote.
/// `None` only if the literal pattern were invalid (the tests' references
/// show it compiles).
static AT_PATH: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r#"(?:^|[\s(\[{"'`])@([A-Za-z0-9_][A-Za-z0-9_./-]*)"#).ok());

/// Checks that `relative` is a plain relative path (no root, no `..`).
fn plain_relative(what: &'static str, relative: &str) -> Result<(), ValidateError> {
    let path = Path::new(relative);
    if path.is_absolute() {
        return Err(ValidateError::NotRelative {
            what,
            path: relative.to_string(),
        });
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(ValidateError::ParentDir {
            what,
            path: relative.to_string(),
        });
    }
    Ok(())
}

/// Resolves the job's kernel directory under `kernel_root` (canonical).
pub(crate) fn resolve_kernel_dir(
    kernel_root: &Path,
    kernel_dir: &str,
) -> Result<PathBuf, ValidateError> {
    if kernel_dir.trim().is_empty() {
        return Err(ValidateError::EmptyKernelDir);
    }
    plain_relative("kernel_dir", kernel_dir)?;
    let unknown = || ValidateError::UnknownKernelDir {
        kernel_dir: kernel_dir.to_string(),
        root: kernel_root.to_path_buf(),
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
pub(crate) fn resolve_file(kernel_dir: &Path, relative: &str) -> Result<PathBuf, ValidateError> {
    plain_relative("path", relative)?;
    let resolved =
        kernel_dir
            .join(relative)
            .canonicalize()
            .map_err(|_| ValidateError::NoSuchFile {
                path: relative.to_string(),
            })?;
    if !resolved.starts_with(kernel_dir) {
        return Err(ValidateError::OutsideKernelDir {
            path: relative.to_string(),
        });
    }
    if !resolved.is_file() {
        return Err(ValidateError::NotAFile {
            path: relative.to_string(),
        });
    }
    Ok(resolved)
}

/// The distinct `@path` references of `goal`, in order of appearance.
pub(crate) fn at_references(goal: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for capture in AT_PATH.iter().flat_map(|re| re.captures_iter(goal)) {
        let raw = capture.get(1).map(|m| m.as_str()).unwrap_or_default();
        // Sentence punctuation is not part of the path.
        let path = raw.trim_end_matches(['.', ',', ';', ':']).to_string();
        if !path.is_empty() && !seen.contains(&path) {
            seen.push(path);
        }
    }
    seen
}

/// A budget above its limit.
fn over_limit(name: &'static str, value: impl ToString, limit: impl ToString) -> ValidateError {
    ValidateError::BudgetOverLimit {
        name,
        value: value.to_string(),
        limit: limit.to_string(),
    }
}

fn check_budgets(budgets: &v1::Budgets, limits: &SubmitLimits) -> Result<(), ValidateError> {
    if budgets.max_steps > limits.max_steps {
        return Err(over_limit("max_steps", budgets.max_steps, limits.max_steps));
    }
    if !budgets.device_seconds.is_finite() || budgets.device_seconds < 0.0 {
        return Err(ValidateError::DeviceSecondsInvalid(budgets.device_seconds));
    }
    if budgets.device_seconds > limits.max_device_seconds {
        return Err(over_limit(
            "device_seconds",
            budgets.device_seconds,
            limits.max_device_seconds,
        ));
    }
    if budgets.wall_time_seconds > limits.max_wall_time_seconds {
        return Err(over_limit(
            "wall_time_seconds",
            budgets.wall_time_seconds,
            limits.max_wall_time_seconds,
        ));
    }
    if budgets.max_tokens > 0 && budgets.max_tokens < 1_000 {
        return Err(ValidateError::MaxTokensTooSmall(budgets.max_tokens));
    }
    Ok(())
}

fn check_model(model: &v1::ModelSettings) -> Result<(), ValidateError> {
    let url = &model.base_url;
    if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
        return Err(ValidateError::ModelBaseUrl(model.base_url.clone()));
    }
    if let Some(t) = model.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(ValidateError::ModelTemperature(t));
    }
    Ok(())
}

/// Validates a SubmitJob request. `kernel_root` must be canonical.
pub(crate) fn validate_submit(
    spec: Option<&v1::JobSpec>,
    kernel_root: &Path,
    limits: &SubmitLimits,
) -> Result<ValidatedJob, ValidateError> {
    let spec = spec.ok_or(ValidateError::MissingSpec)?.clone();
    if spec.goal.trim().is_empty() {
        return Err(ValidateError::EmptyGoal);
    }
    if spec.goal.len() > limits.max_goal_bytes {
        return Err(ValidateError::GoalTooLarge {
            bytes: spec.goal.len(),
            limit: limits.max_goal_bytes,
        });
    }
    let kernel_dir = resolve_kernel_dir(kernel_root, &spec.kernel_dir)?;
    // Parsed to refuse a bad one now; the tools parse it again when they
    // place agents.
    parse_selector(&spec.slice_selector).map_err(ValidateError::Selector)?;
    if let Some(budgets) = &spec.budgets {
        check_budgets(budgets, limits)?;
    }
    if spec.num_agents > limits.max_agents {
        return Err(ValidateError::TooManyAgents {
            requested: spec.num_agents,
            limit: limits.max_agents,
        });
    }
    if let Some(model) = &spec.model {
        check_model(model)?;
    }
    check_approval_rules(&spec.approval_rules)?;
    let references = at_references(&spec.goal);
    if references.len() > limits.max_attachments {
        return Err(ValidateError::TooManyAttachments {
            count: references.len(),
            limit: limits.max_attachments,
        });
    }
    let mut attachments = Vec::new();
    let mut total: u64 = 0;
    for reference in references {
        let path =
            resolve_file(&kernel_dir, &reference).map_err(|e| ValidateError::Attachment {
                reference: reference.clone(),
                source: Box::new(e),
            })?;
        let io_error = |source| ValidateError::AttachmentIo {
            reference: reference.clone(),
            source,
        };
        let size = std::fs::metadata(&path).map_err(io_error)?.len();
        if size > limits.max_attachment_bytes {
            return Err(ValidateError::AttachmentTooLarge {
                reference,
                size,
                limit: limits.max_attachment_bytes,
            });
        }
        total = total.saturating_add(size);
        if total > limits.max_total_attachment_bytes {
            return Err(ValidateError::AttachmentsTooLarge {
                total,
                limit: limits.max_total_attachment_bytes,
            });
        }
        let bytes = std::fs::read(&path).map_err(io_error)?;
        let content = String::from_utf8(bytes).map_err(|_| ValidateError::AttachmentNotUtf8 {
            reference: reference.clone(),
        })?;
        attachments.push(Attachment {
            path: reference,
            content,
        });
    }
    Ok(ValidatedJob {
        spec,
        kernel_dir,
        attachments,
    })
}

/// At most this many approval rules per job.
const MAX_APPROVAL_RULES: usize = 64;

/// Every rule has an action and names a tool a worker session has, or a risk.
fn check_approval_rules(rules: &[v1::ApprovalRule]) -> Result<(), ValidateError> {
    if rules.len() > MAX_APPROVAL_RULES {
        return Err(ValidateError::ApprovalRule {
            index: MAX_APPROVAL_RULES,
            reason: "too many rules (at most 64)",
        });
    }
    for (index, rule) in rules.iter().enumerate() {
        let invalid = |reason| Err(ValidateError::ApprovalRule { index, reason });
        if rule.action() == v1::ApprovalAction::Unspecified {
            return invalid("no action (ask, allow or deny)");
        }
        let tool = rule.tool.trim();
        if tool.is_empty() && rule.risk() == v1::RiskLevel::Unspecified {
            return invalid("names neither a tool nor a risk");
        }
        if tool.len() > 64
            || !tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return invalid("the tool name must be 1-64 letters, digits, `_` or `-`");
        }
        if !tool.is_empty() && !mtswarm_tools::SESSION_TOOL_NAMES.contains(&tool) {
            return Err(ValidateError::UnknownRuleTool {
                index,
                tool: tool.to_owned(),
                known: mtswarm_tools::SESSION_TOOL_NAMES.join(", "),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_rules_need_an_action_and_a_tool_or_risk() {
        let rule = |tool: &str, risk: v1::RiskLevel, action: v1::ApprovalAction| v1::ApprovalRule {
            tool: tool.into(),
            risk: risk as i32,
            action: action as i32,
        };
        let ok = [
            rule(
                "benchmark",
                v1::RiskLevel::Unspecified,
                v1::ApprovalAction::Allow,
            ),
            rule("", v1::RiskLevel::Medium, v1::ApprovalAction::Ask),
        ];
        assert!(check_approval_rules(&ok).is_ok());
        for (bad, why) in [
            (
                rule(
                    "benchmark",
                    v1::RiskLevel::Unspecified,
                    v1::ApprovalAction::Unspecified,
                ),
                "no action",
            ),
            (
                rule("", v1::RiskLevel::Unspecified, v1::ApprovalAction::Deny),
                "neither",
            ),
            (
                rule(
                    "bench mark",
                    v1::RiskLevel::Unspecified,
                    v1::ApprovalAction::Deny,
                ),
                "tool name",
            ),
            (
                rule(
                    "benchmrk",
                    v1::RiskLevel::Unspecified,
                    v1::ApprovalAction::Deny,
                ),
                "names tool \"benchmrk\", which no worker session has",
            ),
        ] {
            let error = check_approval_rules(&[bad]).expect_err(why).to_string();
            assert!(
                error.contains(why) && error.starts_with("approval rule 0"),
                "{error}"
            );
        }
    }

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
                .to_string()
                .contains("..")
        );
        assert!(
            resolve_kernel_dir(&root, "/etc")
                .unwrap_err()
                .to_string()
                .contains("relative")
        );
        assert!(
            resolve_kernel_dir(&root, "nope")
                .unwrap_err()
                .to_string()
                .contains("unknown kernel directory")
        );
        let k = resolve_kernel_dir(&root, "k").expect("k resolves");
        assert!(
            resolve_file(&k, "missing.c")
                .unwrap_err()
                .to_string()
                .contains("does not exist")
        );
    }
}
