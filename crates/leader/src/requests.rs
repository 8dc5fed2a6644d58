//! The checks the Control service applies to a request before it reads or
//! writes any store (every RPC but SubmitJob, whose checks are in
//! [`crate::validate`]): ids, page tokens and sizes, selectors, enum
//! values. They are pure functions of the request, so the handlers
//! (`service.rs`, [`crate::approvals::decide`]) and the fuzz targets
//! (through [`crate::fuzzing`]) run the same code. Each refusal is an
//! INVALID_ARGUMENT whose message names the field.

use mtswarm_bus::{subjects, v1};
use mtswarm_hw::SliceSelector;

use crate::fleet::parse_selector;

/// Server cap and default of `ListJobs.page_size`.
const MAX_PAGE_SIZE: usize = 500;
const DEFAULT_PAGE_SIZE: usize = 100;

/// A request refused before anything was read (its message names the
/// field; the caller gets it as INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidRequest(pub(crate) String);

impl From<InvalidRequest> for tonic::Status {
    fn from(error: InvalidRequest) -> Self {
        tonic::Status::invalid_argument(error.0)
    }
}

/// A job id as GetJob, WatchJob, CancelJob and ListApprovals take it.
pub(crate) fn check_job_id(job_id: &str) -> Result<(), InvalidRequest> {
    subjects::validate_id("job id", job_id).map_err(|e| InvalidRequest(e.to_string()))
}

/// Which page of jobs a `ListJobs` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Page {
    /// Jobs skipped (from the page token this server issued).
    pub(crate) offset: usize,
    /// Jobs answered at most (the request's size, capped; a default when 0).
    pub(crate) size: usize,
}

/// The page a `ListJobs` request asks for.
pub(crate) fn list_jobs_page(request: &v1::ListJobsRequest) -> Result<Page, InvalidRequest> {
    let offset: usize = if request.page_token.is_empty() {
        0
    } else {
        request
            .page_token
            .parse()
            .map_err(|_| InvalidRequest("page_token is not one this server issued".into()))?
    };
    let size = match request.page_size as usize {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    };
    Ok(Page { offset, size })
}

/// The slices a `ListFleet` request selects (`None`: every slice).
pub(crate) fn list_fleet_selector(
    request: &v1::ListFleetRequest,
) -> Result<Option<SliceSelector>, InvalidRequest> {
    parse_selector(&request.slice_selector)
        .map_err(|e| InvalidRequest(format!("bad slice_selector: {e}")))
}

/// The job a `ListApprovals` request is limited to (`None`: every job).
pub(crate) fn approvals_job_id(
    request: &v1::ListApprovalsRequest,
) -> Result<Option<&str>, InvalidRequest> {
    let job_id = (!request.job_id.is_empty()).then_some(request.job_id.as_str());
    if let Some(job_id) = job_id {
        check_job_id(job_id)?;
    }
    Ok(job_id)
}

/// The approval states a `ListApprovals` request asks for (empty: all).
pub(crate) fn approval_states(
    request: &v1::ListApprovalsRequest,
) -> Result<Vec<v1::ApprovalState>, InvalidRequest> {
    request
        .states
        .iter()
        .map(|s| {
            v1::ApprovalState::try_from(*s)
                .map_err(|_| InvalidRequest(format!("unknown approval state {s}")))
        })
        .collect()
}

/// A `DecideApprovalRequest` names an approval and says yes or no.
pub(crate) fn check_decision(request: &v1::DecideApprovalRequest) -> Result<(), InvalidRequest> {
    subjects::validate_id("approval id", &request.approval_id)
        .map_err(|e| InvalidRequest(e.to_string()))?;
    if request.verdict() == v1::ApprovalVerdict::Unspecified {
        return Err(InvalidRequest(
            "verdict must be APPROVE or DENY (got APPROVAL_VERDICT_UNSPECIFIED)".into(),
        ));
    }
    Ok(())
}

/// The slice a `LiftQuarantineRequest` names, trimmed.
pub(crate) fn quarantined_slice(
    request: &v1::LiftQuarantineRequest,
) -> Result<&str, InvalidRequest> {
    let slice_id = request.slice_id.trim();
    subjects::validate_id("slice id", slice_id).map_err(|e| InvalidRequest(e.to_string()))?;
    Ok(slice_id)
}
