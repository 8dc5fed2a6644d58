//! The engine's checkpoint sink for worker sessions: every state the engine
//! reports becomes the session's latest `SessionCheckpoint` in the
//! checkpoints bucket, tagged with the task and attempt. A write refused
//! because a later attempt of the task owns the session stops the run (this
//! worker was fenced off); a daemon that is shutting down freezes the sink
//! first so the cancelled state never replaces the last useful checkpoint.
//!
//! # Which states are written when
//!
//! The engine reports a state after every node, several per step, and most
//! of them are followed at once by the next. Writing each one before the
//! run may go on would put a KV round trip (two, with the stale-attempt
//! check) on every transition. Instead the states split in two:
//!
//! - **Durable points** are written before `save` returns: the state that
//!   enters tool execution (so the stored checkpoint is the step's state
//!   before any hardware call starts), the state right after the tools ran
//!   (so a resume never repeats a hardware call), a paused state (an
//!   approval may be decided in another process, which resumes from KV) and
//!   the final state (stored before the task's result is published).
//! - **Every other state** (reasoning, routing, observation bookkeeping) is
//!   written behind: it becomes the pending state and a writer task stores
//!   the newest pending state after [`WRITE_BEHIND_DELAY`]. A state that is
//!   superseded before then (by the next transition, typically) is never
//!   written. Losing a written-behind state to a crash loses at most the
//!   current step's model call, never a tool call.
//!
//! Writes go in order (a written-behind state never lands after a newer
//! durable one). Each write is a compare-and-set on the revision this sink
//! wrote last: if nobody wrote since, the stored checkpoint is this
//! attempt's own, so overwriting it cannot undo a later attempt. Only when
//! the revision is unknown (the task's first write) or someone else wrote
//! in between does the write go through [`Checkpoints::put`], which reads
//! the stored checkpoint and refuses to replace a later attempt's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtswarm_bus::{BusError, Checkpoints, v1};
use mtswarm_core::{CheckpointSink, LoopState, Node, RunControl};

use crate::events::now_timestamp;

/// Version of the `state_json` format (the core's `LoopState` JSON).
pub const CHECKPOINT_FORMAT_VERSION: u32 = 1;

/// How long a state that is not a durable point waits before it is written,
/// so that the transitions of one step coalesce into one write.
pub(crate) const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(20);

/// Writes checkpoints of one task attempt.
pub(crate) struct KvCheckpointSink {
    inner: Arc<SinkInner>,
}

struct SinkInner {
    store: Checkpoints,
    template: v1::SessionCheckpoint,
    frozen: AtomicBool,
    fenced: AtomicBool,
    control: Mutex<Option<RunControl>>,
    /// The newest state not written yet (written-behind states only).
    pending: Mutex<Pending>,
    /// Held for the duration of a write, so writes land in order; holds
    /// what this sink last stored.
    writer: tokio::sync::Mutex<Written>,
}

#[derive(Default)]
struct Pending {
    checkpoint: Option<(u64, v1::SessionCheckpoint)>,
    /// A writer task is scheduled and has not taken the pending state yet.
    scheduled: bool,
    /// Order of the states handed to the sink.
    next_generation: u64,
}

#[derive(Default)]
struct Written {
    /// Revision of this sink's last write (None before the first one).
    revision: Option<u64>,
    /// Generation of the last state written.
    generation: u64,
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
            inner: Arc::new(SinkInner {
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
                pending: Mutex::new(Pending::default()),
                writer: tokio::sync::Mutex::new(Written::default()),
            }),
        }
    }

    /// The run to stop when a later attempt fences this one off.
    pub(crate) fn attach(&self, control: RunControl) {
        *self.inner.control.lock().unwrap_or_else(|e| e.into_inner()) = Some(control);
    }

    /// Ignore further states (the run is being stopped for a shutdown).
    /// A state handed over before stays pending and is still written: it
    /// precedes the stop.
    pub(crate) fn freeze(&self) {
        self.inner.frozen.store(true, Ordering::SeqCst);
    }

    /// True when a later attempt owns the session.
    pub(crate) fn fenced(&self) -> bool {
        self.inner.fenced()
    }
}

/// States that must be in KV before the run goes on (see the module docs).
fn is_durable_point(state: &LoopState) -> bool {
    match state.node() {
        Node::ToolExecution | Node::Done => true,
        Node::HumanApproval => state.is_paused(),
        // The tools of the step ran; their results must not be run again.
        Node::Observation => true,
        Node::Start | Node::Reasoning | Node::ToolRouting => false,
    }
}

impl SinkInner {
    fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    fn checkpoint_of(&self, state: &LoopState) -> Result<v1::SessionCheckpoint, String> {
        let json = state
            .to_json()
            .map_err(|e| format!("serializing the loop state: {e}"))?;
        let mut checkpoint = self.template.clone();
        checkpoint.step = state.step();
        checkpoint.state_json = json.into_bytes();
        checkpoint.updated_at = Some(now_timestamp());
        Ok(checkpoint)
    }

    /// Stores `checkpoint` (generation `generation`) unless a newer state
    /// was stored already. Call with the writer lock held.
    async fn write(
        &self,
        written: &mut Written,
        generation: u64,
        checkpoint: &v1::SessionCheckpoint,
    ) -> Result<(), String> {
        if generation <= written.generation || self.fenced() {
            return Ok(());
        }
        let stored = match written.revision {
            Some(revision) => {
                match self
                    .store
                    .kv()
                    .update(&checkpoint.session_id, checkpoint, revision)
                    .await
                {
                    // Someone else wrote since: decide on what is stored now.
                    Err(BusError::CasConflict { .. }) => self.store.put(checkpoint).await,
                    other => other,
                }
            }
            None => self.store.put(checkpoint).await,
        };
        match stored {
            Ok(revision) => {
                written.revision = Some(revision);
                written.generation = generation;
                Ok(())
            }
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

    /// The writer task: after the delay, stores the newest pending state.
    async fn write_behind(self: Arc<Self>) {
        tokio::time::sleep(WRITE_BEHIND_DELAY).await;
        let mut written = self.writer.lock().await;
        let taken = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.scheduled = false;
            pending.checkpoint.take()
        };
        let Some((generation, checkpoint)) = taken else {
            return;
        };
        if let Err(error) = self.write(&mut written, generation, &checkpoint).await {
            // A later durable point stores a newer state; this one is only
            // lost if the process dies before then.
            tracing::warn!(session.id = %checkpoint.session_id, step = checkpoint.step, %error, "written-behind checkpoint not stored");
        }
    }
}

#[async_trait::async_trait]
impl CheckpointSink for KvCheckpointSink {
    async fn save(&self, state: &LoopState) -> Result<(), String> {
        let inner = &self.inner;
        if inner.frozen.load(Ordering::SeqCst) || inner.fenced() {
            return Ok(());
        }
        let checkpoint = inner.checkpoint_of(state)?;
        if is_durable_point(state) {
            let generation = {
                let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                // This state supersedes whatever waits to be written.
                pending.checkpoint = None;
                pending.next_generation += 1;
                pending.next_generation
            };
            let mut written = inner.writer.lock().await;
            return inner.write(&mut written, generation, &checkpoint).await;
        }
        let schedule = {
            let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.next_generation += 1;
            pending.checkpoint = Some((pending.next_generation, checkpoint));
            !std::mem::replace(&mut pending.scheduled, true)
        };
        if schedule {
            tokio::spawn(inner.clone().write_behind());
        }
        Ok(())
    }
}
