//! The checks and defaults the `Worker` service applies to a request
//! before it touches the daemon's state: SpawnSession's ids and slice
//! choice, CancelSession's reason, Drain's grace. They are pure functions
//! of the request, so the service (`service.rs`, `session/spawn.rs`) and
//! the fuzz targets (through [`crate::fuzzing`]) run the same code.

use std::time::Duration;

use mtswarm_bus::{subjects, v1};
use mtswarm_hw::SliceSelector;

/// A request refused before anything was looked up (its message names the
/// field; SpawnSession answers it as INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidRequest(pub(crate) String);

/// The ids a `SpawnSessionRequest` names (session, job, agent).
pub(crate) fn check_spawn_ids(request: &v1::SpawnSessionRequest) -> Result<(), InvalidRequest> {
    for (kind, value) in [
        ("session id", &request.session_id),
        ("job id", &request.job_id),
        ("agent id", &request.agent_id),
    ] {
        subjects::validate_id(kind, value).map_err(|e| InvalidRequest(e.to_string()))?;
    }
    Ok(())
}

/// Where a `SpawnSessionRequest` asks to run.
#[derive(Debug, Clone)]
pub(crate) enum SliceChoice {
    /// The slice it names (hardware or bus id, looked up by the daemon).
    Named(String),
    /// The first free slice this selector matches (every slice: none given).
    Matching(SliceSelector),
}

/// The slice choice of a `SpawnSessionRequest`: a named slice wins over the
/// selector, which must parse.
pub(crate) fn slice_choice(
    request: &v1::SpawnSessionRequest,
) -> Result<SliceChoice, InvalidRequest> {
    if !request.slice_id.trim().is_empty() {
        return Ok(SliceChoice::Named(request.slice_id.clone()));
    }
    if request.slice_selector.trim().is_empty() {
        return Ok(SliceChoice::Matching(SliceSelector::all()));
    }
    SliceSelector::parse(&request.slice_selector)
        .map(SliceChoice::Matching)
        .map_err(|e| InvalidRequest(e.to_string()))
}

/// The reason a `CancelSessionRequest` gives its session.
pub(crate) fn cancel_reason(request: &v1::CancelSessionRequest) -> String {
    if request.reason.trim().is_empty() {
        "cancelled by request".to_owned()
    } else {
        request.reason.clone()
    }
}

/// How long a `DrainRequest` lets sessions finish before they are
/// abandoned (`default`: the daemon's `drain_grace`, when it says 0).
pub(crate) fn drain_grace(request: &v1::DrainRequest, default: Duration) -> Duration {
    if request.grace_seconds == 0 {
        default
    } else {
        Duration::from_secs(request.grace_seconds)
    }
}
