//! The engine's checkpoint sink for worker sessions: every state the engine
//! reports is written to the checkpoints bucket as the session's latest
//! `SessionCheckpoint`, tagged with the task and attempt. A write refused
//! because a later attempt of the task owns the session stops the run (this
//! worker was fenced off); a daemon that is shutting down freezes the sink
//! first so the cancelled state never replaces the last useful checkpoint.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use mtswarm_bus::{BusError, Checkpoints, v1};
use mtswarm_core::{CheckpointSink, LoopState, RunControl};

use crate::events::now_timestamp;

/// Version of the `state_json` format (the core's `LoopState` JSON).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;

/// Writes checkpoints of one task attempt.
pub(crate) struct KvCheckpointSink {
    store: Checkpoints,
    template: v1::SessionCheckpoint,
    frozen: AtomicBool,
    fenced: AtomicBool,
    control: Mutex<Option<RunControl>>,
}

impl KvCheckpointSink {
    pub(crate) fn new(
        store: Checkpoints,
        session_id: &str,
        job_id: &str,
        agent_id: &str,
        task_id: &str,
        attempt: u32,
    ) -> Self {
        Self {
            store,
            template: v1::SessionCheckpoint {
                session_id: session_id.to_owned(),
                job_id: job_id.to_owned(),
                task_id: task_id.to_owned(),
                attempt,
                agent_id: agent_id.to_owned(),
                step: 0,
                state_json: Vec::new(),
                format_version: CHECKPOINT_FORMAT_VERSION,
                updated_at: None,
            },
            frozen: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            control: Mutex::new(None),
        }
    }

    /// The run to stop when a later attempt fences this one off.
    pub(crate) fn attach(&self, control: RunControl) {
        *self.control.lock().unwrap_or_else(|e| e.into_inner()) = Some(control);
    }

    /// Ignore further states (the run is being stopped for a shutdown).
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// True when a later attempt owns the session.
    pub(crate) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl CheckpointSink for KvCheckpointSink {
    async fn save(&self, state: &LoopState) -> Result<(), String> {
        if self.frozen.load(Ordering::SeqCst) || self.fenced() {
            return Ok(());
        }
        let json = state
            .to_json()
            .map_err(|e| format!("serializing the loop state: {e}"))?;
        let mut checkpoint = self.template.clone();
        checkpoint.step = state.step();
        checkpoint.state_json = json.into_bytes();
        checkpoint.updated_at = Some(now_timestamp());
        match self.store.put(&checkpoint).await {
            Ok(_) => Ok(()),
            Err(error @ BusError::StaleAttempt { .. }) => {
                self.fenced.store(true, Ordering::SeqCst);
                if let Some(control) = self
                    .control
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                {
                    control.cancel();
                }
                tracing::warn!(session.id = %checkpoint.session_id, %error, "fenced off by a later attempt; stopping the run");
                Err(error.to_string())
            }
            Err(error) => Err(error.to_string()),
        }
    }
}
