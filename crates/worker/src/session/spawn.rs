//! SpawnSession: the only session code that speaks `tonic::Status`. It
//! checks the request's ids, answers a repeated request with the session it
//! started (idempotent per session id), picks and reserves a free slice
//! that is not quarantined, and starts the session there ([`super::start`]),
//! mapping each typed failure below it to a gRPC status.

use std::sync::Arc;

use mtswarm_bus::v1;
use tonic::Status;

use super::model::ModelChoiceError;
use super::start::{StartError, start_session};
use crate::host::SessionHost;
use crate::requests::{SliceChoice, check_spawn_ids, slice_choice};

fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(message.into())
}

/// Handle a SpawnSession request (idempotent per session id).
pub(crate) async fn spawn_session(
    shared: &Arc<SessionHost>,
    request: v1::SpawnSessionRequest,
) -> Result<v1::SpawnSessionResponse, Status> {
    check_spawn_ids(&request).map_err(|e| invalid(e.0))?;
    // Idempotency: the same session id gets the same answer.
    let existing = shared
        .slices
        .table()
        .sessions
        .get(&request.session_id)
        .cloned();
    if let Some(existing) = existing {
        if existing.job_id != request.job_id || existing.agent_id != request.agent_id {
            return Err(Status::already_exists(format!(
                "session {} already runs for job {} / agent {}",
                existing.session_id, existing.job_id, existing.agent_id
            )));
        }
        let slice_id = &shared.slices[existing.slice_index].bus_id;
        return Ok(existing.response(&shared.identity.worker_id, slice_id));
    }
    if shared.slices.is_draining() {
        return Err(Status::failed_precondition(format!(
            "worker {} is draining and accepts no new sessions",
            shared.identity.worker_id
        )));
    }
    let candidates = candidate_slices(shared, &request)?;
    let quarantined = quarantined_among(shared, &candidates).await?;
    let named = !request.slice_id.trim().is_empty();
    if named && let Some((_, reason)) = quarantined.first() {
        return Err(Status::failed_precondition(format!(
            "slice {} is quarantined: {reason}",
            shared.slices[candidates[0]].bus_id
        )));
    }
    let index = match reserve(shared, &request, &candidates, &quarantined)? {
        Reserved::Slice(index) => index,
        Reserved::Started(response) => return Ok(response),
    };
    match start_session(shared, index, &request).await {
        Ok(entry) => {
            let slice_id = shared.slices[index].bus_id.clone();
            Ok(entry.response(&shared.identity.worker_id, &slice_id))
        }
        Err(error) => {
            shared.slices.table().free(index, &request.session_id);
            Err(status_of(error))
        }
    }
}

/// The slices the request may run on, by index: the one it names, else
/// every slice its selector matches (every slice without one).
fn candidate_slices(
    shared: &SessionHost,
    request: &v1::SpawnSessionRequest,
) -> Result<Vec<usize>, Status> {
    let selector = match slice_choice(request).map_err(|e| invalid(e.0))? {
        SliceChoice::Named(slice_id) => {
            let index = shared.slices.index_of(&slice_id).ok_or_else(|| {
                Status::not_found(format!(
                    "slice `{slice_id}` is not on worker {} (slices: {})",
                    shared.identity.worker_id,
                    shared
                        .slices
                        .iter()
                        .map(|s| s.bus_id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
            return Ok(vec![index]);
        }
        SliceChoice::Matching(selector) => selector,
    };
    let matching: Vec<usize> = (0..shared.slices.len())
        .filter(|&i| selector.matches(&shared.slices[i].slice))
        .collect();
    if matching.is_empty() {
        return Err(Status::not_found(format!(
            "no slice of worker {} matches `{}`",
            shared.identity.worker_id, request.slice_selector
        )));
    }
    Ok(matching)
}

/// The candidates that are quarantined, with the reason of each.
async fn quarantined_among(
    shared: &SessionHost,
    candidates: &[usize],
) -> Result<Vec<(usize, String)>, Status> {
    let mut quarantined = Vec::new();
    for &index in candidates {
        let slice_id = &shared.slices[index].bus_id;
        match shared.stores.quarantine.get(slice_id).await {
            Ok(Some(record)) => quarantined.push((index, record.value.reason)),
            Ok(None) => {}
            Err(error) => {
                return Err(Status::unavailable(format!("quarantine lookup: {error}")));
            }
        }
    }
    Ok(quarantined)
}

/// What the reservation found.
enum Reserved {
    /// This free slice is the session's now.
    Slice(usize),
    /// The session was started meanwhile: its answer.
    Started(v1::SpawnSessionResponse),
}

/// Reserves the first free, unquarantined candidate for the session and
/// checks the session limit and the disk quota, atomically (under the
/// table's lock).
fn reserve(
    shared: &SessionHost,
    request: &v1::SpawnSessionRequest,
    candidates: &[usize],
    quarantined: &[(usize, String)],
) -> Result<Reserved, Status> {
    let named = !request.slice_id.trim().is_empty();
    let mut table = shared.slices.table();
    if let Some(existing) = table.sessions.get(&request.session_id) {
        let slice_id = &shared.slices[existing.slice_index].bus_id;
        return Ok(Reserved::Started(
            existing.response(&shared.identity.worker_id, slice_id),
        ));
    }
    if table.holds_slice(&request.session_id) {
        return Err(Status::unavailable(format!(
            "session {} is being started; retry",
            request.session_id
        )));
    }
    if table.sessions.len() >= shared.config.max_sessions {
        return Err(Status::resource_exhausted(format!(
            "worker {} runs its maximum of {} sessions",
            shared.identity.worker_id, shared.config.max_sessions
        )));
    }
    let free = candidates
        .iter()
        .copied()
        .find(|&i| table.slice_owner[i].is_none() && !quarantined.iter().any(|(q, _)| *q == i));
    let Some(index) = free else {
        let slice = &shared.slices[candidates[0]].bus_id;
        return Err(Status::failed_precondition(if named {
            format!(
                "slice {slice} is busy with session {}",
                table.slice_owner[candidates[0]].clone().unwrap_or_default()
            )
        } else {
            format!(
                "no free slice of worker {} matches `{}`",
                shared.identity.worker_id, request.slice_selector
            )
        }));
    };
    // Under the table's lock: the janitor relies on it (see `janitor`).
    if let Err(error) = shared.disk.admit(&request.session_id) {
        return Err(Status::resource_exhausted(error.to_string()));
    }
    table.reserve(index, &request.session_id);
    Ok(Reserved::Slice(index))
}

/// The gRPC status of a session that could not be started: refused input
/// is INVALID_ARGUMENT, a missing cassette FAILED_PRECONDITION, NATS
/// trouble UNAVAILABLE, a broken tool table INTERNAL.
fn status_of(error: StartError) -> Status {
    let message = error.to_string();
    match error {
        StartError::KernelDir(_) => invalid(message),
        StartError::Model(ModelChoiceError::Replay(_)) => Status::failed_precondition(message),
        StartError::Model(_) => invalid(message),
        StartError::Tools(_) | StartError::Registry(_) => Status::internal(message),
        StartError::CheckpointLookup(_) | StartError::Lease(_) => Status::unavailable(message),
    }
}
