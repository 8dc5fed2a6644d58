//! Resuming a job a previous leader left QUEUED or RUNNING, once this
//! leader owns it (see the runner's module docs and `ownership.rs`): the job context is rebuilt from the record and its agent
//! and task keys, the job's results are replayed, unconfirmed assignments
//! are published again, and the loop continues from its checkpoint.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use mtswarm_bus::v1;

use crate::error::ResumeError;
use crate::host::JobHost;
use crate::job::{AgentEntry, PendingStart};

fn deadline_of(host: &JobHost, record: &v1::JobRecord) -> SystemTime {
    let budgets = record
        .spec
        .as_ref()
        .and_then(|s| s.budgets)
        .unwrap_or_default();
    let since = record
        .started_at
        .or(record.created_at)
        .and_then(|t| SystemTime::try_from(t).ok())
        .unwrap_or_else(SystemTime::now);
    since
        + if budgets.wall_time_seconds > 0 {
            Duration::from_secs(budgets.wall_time_seconds)
        } else {
            host.config.default_task_deadline
        }
}

/// Rebuilds a QUEUED or RUNNING job a previous leader left behind (see the
/// module docs). The job's table is registered before its results are
/// replayed, so results arriving meanwhile reach it through the live
/// consumer or the replay, once.
pub(crate) async fn resume_job(
    host: &Arc<JobHost>,
    record: v1::JobRecord,
    fence: mtswarm_bus::Fence,
) -> Result<PendingStart, ResumeError> {
    let job_id = record.job_id.clone();
    // A record of an earlier leader embeds its parts: moved to their keys
    // first, so that every later write finds them there.
    let record = host
        .stores
        .jobs
        .split_embedded(&job_id)
        .await
        .map_err(ResumeError::Read)?
        .unwrap_or(record);
    let agents = host
        .stores
        .jobs
        .agents(&job_id)
        .await
        .map_err(ResumeError::Read)?;
    let tasks = host
        .stores
        .jobs
        .tasks(&job_id)
        .await
        .map_err(ResumeError::Read)?;
    let loop_state = host
        .stores
        .jobs
        .loop_state(&job_id)
        .await
        .map_err(ResumeError::Read)?;
    let validated = crate::validate::validate_submit(
        record.spec.as_ref(),
        &host.kernel_root,
        &host.config.limits,
    )
    .map_err(ResumeError::InvalidSpec)?;
    let context = Arc::new(host.job_context(
        job_id.clone(),
        validated.spec,
        validated.kernel_dir,
        deadline_of(host, &record),
        fence,
    ));
    for placement in &agents {
        let agent = AgentEntry::from_placement(placement);
        if !agent.cancelled {
            host.placement
                .claims
                .hold(&agent.slice_id, &agent.session_id);
        }
        context.agents().insert(agent.agent_id.clone(), agent);
    }
    for task in &tasks {
        let Some(assignment) = &task.assignment else {
            continue;
        };
        context.results.register_recorded(
            &assignment.task_id,
            &assignment.agent_id,
            assignment.attempt,
            task.done,
        );
        context
            .tasks()
            .insert(assignment.task_id.clone(), task.clone());
    }
    let mut attempts = 0;
    loop {
        match crate::result_consumer::replay_job_results(&host.intake, &job_id).await {
            Ok(read) => {
                tracing::info!(job_id, read, "job results replayed");
                break;
            }
            Err(error) if attempts < 10 => {
                attempts += 1;
                tracing::warn!(job_id, %error, "job results not replayed yet; retrying");
                tokio::time::sleep(Duration::from_millis(200 * attempts)).await;
            }
            Err(error) => return Err(ResumeError::Replay(error)),
        }
    }
    // Done before the restart but the result is gone from the stream (aged
    // out): the recorded status stands.
    for task_id in context.results.recorded_done_without_result() {
        let status = context
            .tasks()
            .get(&task_id)
            .map(|t| t.status())
            .unwrap_or(v1::TaskStatus::Unspecified);
        context.results.settle(
            &task_id,
            status,
            "result recorded before a leader restart; no longer in the results stream",
        );
    }
    let unconfirmed = context.unconfirmed_assignments();
    for assignment in unconfirmed {
        if let Err(error) = context.publish_recorded(&assignment).await {
            tracing::warn!(job_id, %error, task_id = %assignment.task_id, "unconfirmed task not published; the sweep retries");
        }
    }
    let span = crate::spans::workflow_span(&tracing::Span::current(), &job_id, true);
    if !record.traceparent.is_empty() {
        let parent =
            mtswarm_telemetry::propagation::context_from_traceparent(&record.traceparent, None);
        if let Err(error) = mtswarm_telemetry::propagation::set_parent(&span, parent) {
            tracing::debug!(%error, "resumed job's traceparent not applied");
        }
    }
    let resume_state = loop_state
        .and_then(|checkpoint| String::from_utf8(checkpoint.value.state_json).ok())
        .filter(|s| !s.trim().is_empty());
    Ok(PendingStart {
        context,
        attachments: validated.attachments,
        span,
        resume_state,
    })
}
