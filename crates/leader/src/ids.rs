//! Identities that several layers agree on: the leader's own agent and
//! session ids, the call key of a leader tool call, and the task id a call
//! assigns. Kept here, below everything, so journal, reassigner, runner and
//! tools read them from one place.

use mtswarm_core::ToolContext;

/// Call keys of the leader's own confirming calls start with this (never a
/// model's call id: their step is `u32::MAX`). A task assigned by such a
/// call confirms a figure (`crate::confirm`): it is not one of the job's
/// own tasks in its counts.
pub const CONFIRM_CALL_PREFIX: &str = "mtswarm-confirm-";

/// Whether the task record was assigned by a confirming call.
pub(crate) fn is_confirmation(task: &mtswarm_bus::v1::TaskRecord) -> bool {
    task.assign_call_id.starts_with(CONFIRM_CALL_PREFIX)
}

/// Agent id of the leader's own loop in events, approvals and sessions.
pub const LEADER_AGENT_ID: &str = "leader";

/// `leader-<job_id>`, cut to the id limit.
pub(crate) fn leader_session_id(job_id: &str) -> String {
    format!("leader-{job_id}")
        .chars()
        .take(mtswarm_bus::subjects::MAX_ID_LEN)
        .collect()
}

/// The identity of a leader tool call for idempotent re-execution: the
/// model's call id qualified by the loop step (`<call id>@<step>`), because
/// a model may reuse a call id in a later step for a different call, while
/// a call re-executed from a checkpoint keeps both.
pub(crate) fn call_key(ctx: &ToolContext) -> String {
    format!("{}@{}", ctx.call_id, ctx.step)
}

/// Task id of the task assigned by the call `call_key` of `job_id` (UUID v5
/// of both): a re-executed call maps to the same id, so even a second
/// publish would be deduplicated by the tasks stream.
pub(crate) fn task_id_for(job_id: &str, call_key: &str) -> String {
    uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("mtswarm-task/{job_id}/{call_key}").as_bytes(),
    )
    .simple()
    .to_string()
}
