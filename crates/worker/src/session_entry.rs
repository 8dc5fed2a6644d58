//! A session as the daemon's table knows it: its ids, its slice, its
//! progress (what Status reports) and the handles to stop or abort its
//! task. The gRPC service, the lease and quarantine checks and the session
//! loop all reach a session through this entry, so it sits below all of
//! them.

use std::sync::Mutex;

use mtswarm_bus::v1;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::events::now_timestamp;
use crate::inbox::TaskInbox;
use crate::stop::StopMode;

use v1::SessionState;

/// What Status reports about a session.
#[derive(Debug, Clone)]
pub(crate) struct SessionProgress {
    pub(crate) state: SessionState,
    pub(crate) task_id: String,
    pub(crate) attempt: u32,
    pub(crate) step: u32,
    pub(crate) usage: v1::Usage,
}

/// A session in the daemon's table.
pub(crate) struct SessionEntry {
    pub(crate) session_id: String,
    pub(crate) job_id: String,
    pub(crate) agent_id: String,
    pub(crate) slice_index: usize,
    pub(crate) started_at: prost_types::Timestamp,
    pub(crate) lease_epoch: u64,
    pub(crate) resumed_from_step: u32,
    progress: Mutex<SessionProgress>,
    stop: watch::Sender<StopMode>,
    join: Mutex<Option<JoinHandle<()>>>,
    /// The session's tasks as the daemon's task consumer delivered them.
    pub(crate) inbox: TaskInbox,
}

/// The ids and slice of a session being started.
pub(crate) struct SessionIds<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) job_id: &'a str,
    pub(crate) agent_id: &'a str,
    pub(crate) slice_index: usize,
}

impl SessionEntry {
    /// A new entry (state Starting) and the receiver its task watches for
    /// stops.
    pub(crate) fn new(
        ids: SessionIds<'_>,
        lease_epoch: u64,
        resumed_from_step: u32,
    ) -> (Self, watch::Receiver<StopMode>) {
        let (stop, stop_rx) = watch::channel(StopMode::Run);
        let entry = Self {
            session_id: ids.session_id.to_owned(),
            job_id: ids.job_id.to_owned(),
            agent_id: ids.agent_id.to_owned(),
            slice_index: ids.slice_index,
            started_at: now_timestamp(),
            lease_epoch,
            resumed_from_step,
            progress: Mutex::new(SessionProgress {
                state: SessionState::Starting,
                task_id: String::new(),
                attempt: 0,
                step: 0,
                usage: v1::Usage::default(),
            }),
            stop,
            join: Mutex::new(None),
            inbox: TaskInbox::default(),
        };
        (entry, stop_rx)
    }

    pub(crate) fn stop(&self, mode: StopMode) {
        self.stop.send_if_modified(|current| {
            // A harder stop replaces a softer one, never the reverse.
            if mode.rank() > current.rank() {
                *current = mode.clone();
                true
            } else {
                false
            }
        });
    }

    /// The stop currently asked for.
    pub(crate) fn stop_mode(&self) -> StopMode {
        self.stop.borrow().clone()
    }

    pub(crate) fn abort(&self) {
        if let Some(join) = self.join.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            join.abort();
        }
    }

    /// Remember the session's task, for shutdown and abort.
    pub(crate) fn set_join(&self, join: JoinHandle<()>) {
        *self.join.lock().unwrap_or_else(|e| e.into_inner()) = Some(join);
    }

    pub(crate) fn take_join(&self) -> Option<JoinHandle<()>> {
        self.join.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn progress(&self) -> SessionProgress {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn update(&self, change: impl FnOnce(&mut SessionProgress)) {
        change(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub(crate) fn status(&self, slice_id: &str) -> v1::SessionStatus {
        let p = self.progress();
        v1::SessionStatus {
            session_id: self.session_id.clone(),
            job_id: self.job_id.clone(),
            agent_id: self.agent_id.clone(),
            slice_id: slice_id.to_owned(),
            task_id: p.task_id,
            attempt: p.attempt,
            state: p.state as i32,
            step: p.step,
            usage: Some(p.usage),
            started_at: Some(self.started_at),
        }
    }

    pub(crate) fn response(&self, worker_id: &str, slice_id: &str) -> v1::SpawnSessionResponse {
        v1::SpawnSessionResponse {
            session_id: self.session_id.clone(),
            worker_id: worker_id.to_owned(),
            slice_id: slice_id.to_owned(),
            lease_epoch: self.lease_epoch,
            resumed_from_step: self.resumed_from_step,
        }
    }
}
