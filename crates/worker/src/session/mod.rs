//! Agent sessions: one tokio task per session, bound to one slice. The
//! session takes the tasks the daemon's consumer files in its inbox and
//! runs one worker ReAct loop per task on the engine, publishing every
//! engine event, checkpointing every state, handling approvals across
//! processes, and ending each task with a `TaskResult` and an ack.
//!
//! A session that waits for tasks costs one tokio task and its inbox (no
//! consumer, no subscription, no timer); its history lives in its
//! checkpoint.
//!
//! The layers, top down (each imports only those below it):
//!
//! - [`spawn`]: SpawnSession, the only code here that speaks `tonic::Status`;
//! - [`start`]: building a session (workspace, tools, [`model`], lease) and
//!   starting its task;
//! - [`lifecycle`]: the session's task loop over its deliveries;
//! - [`task`]: the stages of one attempt ([`task_run::TaskRun`]): [`validate`], [`resume`],
//!   [`execute`] (which drives segments with [`drive`]), then [`result`] or
//!   [`fencing`];
//! - [`runtime`]: what a session keeps between tasks.

mod drive;
mod execute;
mod fencing;
mod lifecycle;
mod model;
mod result;
mod resume;
mod runtime;
mod spawn;
mod start;
mod task;
mod task_run;
mod validate;

pub(crate) use spawn::spawn_session;
pub(crate) use validate::{InvalidTask, check_task, check_task_defines};
