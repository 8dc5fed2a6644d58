//! The entry point of the SubmitJob request validation for the fuzz
//! targets of `mtswarm-fuzz`: the checks the Control service applies to a
//! caller's job spec before it stores anything (goal, kernel directory,
//! slice selector, budgets, model settings, approval rules, `@path`
//! attachments).

use std::path::Path;

use mtswarm_proto::v1;

use crate::config::SubmitLimits;
use crate::error::ValidateError;

/// Why a job spec was refused (its message names the field or path).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SubmitRefused(#[from] ValidateError);

/// Validates `spec` as the Control service does, against kernels under
/// `kernel_root` (canonical) and `limits`; the number of attachments the
/// job would carry when accepted.
pub fn validate_submit(
    spec: Option<&v1::JobSpec>,
    kernel_root: &Path,
    limits: &SubmitLimits,
) -> Result<usize, SubmitRefused> {
    let job = crate::validate::validate_submit(spec, kernel_root, limits)?;
    Ok(job.attachments.len())
}
