//! The entry points of the Control service's request validation for the
//! fuzz targets of `mtswarm-fuzz`: the checks it applies to a caller's job
//! spec before it stores anything (goal, kernel directory, slice selector,
//! budgets, model settings, approval rules, `@path` attachments), and
//! those of every other RPC before it reads a store (`requests.rs`).

use std::path::Path;

use mtswarm_proto::v1;

use crate::config::SubmitLimits;
use crate::error::ValidateError;
use crate::requests::{self, InvalidRequest};

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

/// Why a Control request other than SubmitJob was refused before any
/// store was read (its message names the field).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RequestRefused(#[from] InvalidRequest);

/// The job id of GetJob, WatchJob and CancelJob, checked as they check it.
pub fn check_job_id(job_id: &str) -> Result<(), RequestRefused> {
    Ok(requests::check_job_id(job_id)?)
}

/// ListJobs: the offset and size of the page asked for.
pub fn list_jobs(request: &v1::ListJobsRequest) -> Result<(usize, usize), RequestRefused> {
    let page = requests::list_jobs_page(request)?;
    Ok((page.offset, page.size))
}

/// ListFleet: whether the request selects some slices (else all).
pub fn list_fleet(request: &v1::ListFleetRequest) -> Result<bool, RequestRefused> {
    Ok(requests::list_fleet_selector(request)?.is_some())
}

/// ListApprovals: whether it names a job, and the states it asks for.
pub fn list_approvals(
    request: &v1::ListApprovalsRequest,
) -> Result<(bool, Vec<v1::ApprovalState>), RequestRefused> {
    let job = requests::approvals_job_id(request)?.is_some();
    Ok((job, requests::approval_states(request)?))
}

/// DecideApproval: the request's own checks (the approval id, a verdict).
pub fn decide_approval(request: &v1::DecideApprovalRequest) -> Result<(), RequestRefused> {
    Ok(requests::check_decision(request)?)
}

/// LiftQuarantine: the slice id it names, trimmed.
pub fn lift_quarantine(request: &v1::LiftQuarantineRequest) -> Result<String, RequestRefused> {
    Ok(requests::quarantined_slice(request)?.to_owned())
}
