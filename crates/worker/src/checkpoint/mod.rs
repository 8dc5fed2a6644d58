//! The engine's checkpoint sink for worker sessions: every state the engine
//! reports becomes the session's latest `SessionCheckpoint` in the
//! checkpoints bucket, tagged with the task and attempt, kept to what a
//! resume needs so that its size is bounded by the context budget and not
//! by the number of steps (`stored`), its history stored message by
//! message so that a write stores only the messages not stored yet and the
//! head (`history`). A write refused
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
//! - **Durable points** are the states the engine marks
//!   [`Durability::Required`], written before `save` returns: the state
//!   that enters a tool batch touching anything outside the process (so
//!   the stored checkpoint is the step's state before any hardware call or
//!   write starts, and a stale attempt is fenced off before it), the state
//!   right after the tools ran (so a resume never repeats a hardware
//!   call), a paused state (an approval may be decided in another process,
//!   which resumes from KV) and the final state (stored before the task's
//!   result is published). A batch of read-only calls off the hardware
//!   that declare no effects (analysis, estimates, the job's observations;
//!   not a build, which reports its artifact) enters execution written
//!   behind: a crash before its results are stored repeats only
//!   calls without effect, so such a step costs one durable write, not two.
//!   The final state is not written when a resume would not need it: a
//!   first attempt that stored nothing yet (no tool ran, nothing paused;
//!   both are durable points) and whose session holds no checkpoint of the
//!   task. A resume of such an attempt starts the task afresh, which
//!   repeats only model calls (a no-op task, a model that answers at once),
//!   and its result, if it was published, is the same attempt's: the
//!   leader accepts one result per task and attempt, and JetStream drops
//!   the republish by its msg id. A later attempt, which a stale one must
//!   find in the store to be fenced off, always writes it.
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
//! attempt's own, so overwriting it cannot undo a later attempt.
//!
//! A task's first write uses what the session knows of the stored
//! checkpoint ([`KnownCheckpoint`]: the revision, task and attempt of the
//! checkpoint its previous task wrote or its resume read). When that
//! checkpoint may be replaced by this attempt (another task's, or an
//! attempt of this task that is not later), the write is a compare-and-set
//! on its revision: it only lands if the stored checkpoint is still that
//! one, so the stale-attempt rule is decided on exactly what is stored,
//! without reading it first. Only when nothing is known, the known
//! checkpoint belongs to a later attempt of this task, or someone else
//! wrote in between does the write go through [`Checkpoints::put`], which
//! reads the stored checkpoint and refuses to replace a later attempt's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtswarm_bus::{BusError, Checkpoints, v1};
use mtswarm_core::{CheckpointSink, ContextConfig, Durability, LoopState, Node, RunControl};

use crate::events::now_timestamp;

mod history;
#[cfg(test)]
mod history_tests;
mod restore;
#[cfg(test)]
mod size_tests;
mod stored;

pub use history::HistoryFault;
use history::HistoryLog;
pub use restore::RestoreError;
pub(crate) use restore::restored_state;
pub use stored::CHECKPOINT_FORMAT_VERSION;
use stored::ShownLimits;

/// How long a state that is not a durable point waits before it is written,
/// so that the transitions of one step coalesce into one write.
pub(crate) const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(20);

/// The checkpoint stored under a session's id, as far as the session
/// knows: what it last wrote or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnownCheckpoint {
    pub(crate) revision: u64,
    pub(crate) task_id: String,
    pub(crate) attempt: u32,
    /// The attempt was fenced off after writing it.
    pub(crate) fenced: bool,
    /// The nonce of the history records it names (format 3).
    pub(crate) nonce: Option<String>,
}

impl KnownCheckpoint {
    /// What a checkpoint read from the store says.
    pub(crate) fn of_stored(stored: &mtswarm_bus::Versioned<v1::SessionCheckpoint>) -> Self {
        Self {
            revision: stored.revision,
            task_id: stored.value.task_id.clone(),
            attempt: stored.value.attempt,
            fenced: stored.value.fenced,
            nonce: history::nonce_of(&stored.value),
        }
    }

    /// Whether `attempt` of `task_id` may replace this checkpoint (the rule
    /// of [`Checkpoints::put`]).
    fn replaceable_by(&self, task_id: &str, attempt: u32) -> bool {
        self.task_id != task_id
            || self.attempt < attempt
            || (self.attempt == attempt && !self.fenced)
    }
}

/// Why a checkpoint was not stored.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckpointWriteError {
    /// The loop state could not be turned into JSON.
    #[error("serializing the loop state: {0}")]
    Serialize(#[source] serde_json::Error),
    /// A later attempt of the task owns the session's checkpoint: this
    /// attempt is fenced off.
    #[error(transparent)]
    Fenced(BusError),
    /// The checkpoints bucket refused or did not answer.
    #[error(transparent)]
    Store(BusError),
}

/// A session's [`KnownCheckpoint`], shared by the sinks of its tasks.
pub(crate) type SessionCheckpointCell = Arc<Mutex<Option<KnownCheckpoint>>>;

/// Writes checkpoints of one task attempt.
pub(crate) struct KvCheckpointSink {
    inner: Arc<SinkInner>,
}

struct SinkInner {
    store: Checkpoints,
    template: v1::SessionCheckpoint,
    /// How the run's model is shown a state: what the checkpoint keeps.
    limits: ShownLimits,
    frozen: AtomicBool,
    fenced: AtomicBool,
    control: Mutex<Option<RunControl>>,
    /// The newest state not written yet (written-behind states only).
    pending: Mutex<Pending>,
    /// Held for the duration of a write, so writes land in order; holds
    /// what this sink last stored.
    writer: tokio::sync::Mutex<Written>,
    /// What the session knows of the stored checkpoint (updated after every
    /// write of this sink).
    known: SessionCheckpointCell,
}

#[derive(Default)]
struct Pending {
    /// Kept as the state itself: most pending states are superseded before
    /// they are written, and serializing one costs more than copying it.
    state: Option<(u64, LoopState)>,
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
    /// The history records this sink wrote.
    history: HistoryLog,
}

impl KvCheckpointSink {
    /// The sink of `attempt` of `task_id`, run by session `session_id` with
    /// `context` (what its checkpoints keep follows how the model is shown
    /// the state).
    #[allow(clippy::too_many_arguments)] // the attempt's ids, each a plain value
    pub(crate) fn new(
        store: Checkpoints,
        session_id: &str,
        job_id: &str,
        agent_id: &str,
        task_id: &str,
        attempt: u32,
        known: SessionCheckpointCell,
        context: &ContextConfig,
        grant: Option<v1::PlacementGrant>,
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
                    fenced: false,
                    // Signed by the store's seal before every write.
                    grant,
                    signature: Vec::new(),
                },
                limits: ShownLimits::of(context),
                frozen: AtomicBool::new(false),
                fenced: AtomicBool::new(false),
                control: Mutex::new(None),
                pending: Mutex::new(Pending::default()),
                writer: tokio::sync::Mutex::new(Written::default()),
                known,
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

impl SinkInner {
    fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Stores `state` (generation `generation`) unless a newer state was
    /// stored already: the history messages not stored yet, then the head.
    /// Call with the writer lock held.
    async fn store_state(
        &self,
        written: &mut Written,
        generation: u64,
        state: &LoopState,
    ) -> Result<(), CheckpointWriteError> {
        if generation <= written.generation || self.fenced() {
            return Ok(());
        }
        let mut plan = written
            .history
            .plan(state, self.limits)
            .map_err(CheckpointWriteError::Serialize)?;
        written
            .history
            .store(
                &self.store,
                &self.template.session_id,
                state.step(),
                &mut plan,
            )
            .await
            .map_err(CheckpointWriteError::Store)?;
        let json = history::head_json(state, self.limits, &plan.entries)
            .map_err(CheckpointWriteError::Serialize)?;
        let mut checkpoint = self.template.clone();
        checkpoint.step = state.step();
        checkpoint.state_json = json.into_bytes();
        checkpoint.updated_at = Some(now_timestamp());
        self.store.sign(&mut checkpoint);
        self.write(written, generation, &checkpoint).await
    }

    /// Deletes, in the background, the history records of `nonce`: the
    /// head that named them was just replaced by one of another nonce.
    fn forget_history(&self, nonce: &str) {
        let (store, session, filter) = (
            self.store.clone(),
            self.template.session_id.clone(),
            history::nonce_filter(nonce),
        );
        tokio::spawn(async move {
            if let Err(error) = store.delete_parts(&session, &filter).await {
                tracing::warn!(session.id = %session, %error, "history records of a replaced checkpoint not deleted");
            }
        });
    }

    /// Stores `checkpoint` (generation `generation`) unless a newer state
    /// was stored already. Call with the writer lock held.
    async fn write(
        &self,
        written: &mut Written,
        generation: u64,
        checkpoint: &v1::SessionCheckpoint,
    ) -> Result<(), CheckpointWriteError> {
        if generation <= written.generation || self.fenced() {
            return Ok(());
        }
        // The first write of the attempt starts from what the session knows
        // (and replaces, when it lands on it, the history records it names).
        let (expected, replaced_nonce) = match written.revision {
            Some(revision) => (Some(revision), None),
            None => self
                .known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .filter(|known| known.replaceable_by(&checkpoint.task_id, checkpoint.attempt))
                .map_or((None, None), |known| {
                    (Some(known.revision), known.nonce.clone())
                }),
        };
        let mut replaced_known = false;
        let stored = match expected {
            Some(revision) => {
                match self
                    .store
                    .kv()
                    .update(&checkpoint.session_id, checkpoint, revision)
                    .await
                {
                    // Someone else wrote since: decide on what is stored now.
                    Err(BusError::CasConflict { .. }) => self.store.put(checkpoint).await,
                    other => {
                        replaced_known = other.is_ok();
                        other
                    }
                }
            }
            None => self.store.put(checkpoint).await,
        };
        match stored {
            Ok(revision) => {
                let nonce = written.history.nonce().to_owned();
                if let Some(old) = replaced_nonce.filter(|old| replaced_known && *old != nonce) {
                    self.forget_history(&old);
                }
                written.revision = Some(revision);
                written.generation = generation;
                *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Some(KnownCheckpoint {
                    revision,
                    task_id: checkpoint.task_id.clone(),
                    attempt: checkpoint.attempt,
                    fenced: false,
                    nonce: Some(nonce),
                });
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
                Err(CheckpointWriteError::Fenced(error))
            }
            Err(error) => Err(CheckpointWriteError::Store(error)),
        }
    }

    /// True when the attempt's final state need not be stored (see the
    /// module docs): a first attempt that has stored nothing, on a session
    /// whose known checkpoint is not of this task. Whatever waits to be
    /// written behind is dropped with it: it is older than the final state.
    async fn final_state_unneeded(&self) -> bool {
        let written = self.writer.lock().await;
        let of_this_task = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|known| known.task_id == self.template.task_id);
        let unneeded = self.template.attempt == 1 && written.revision.is_none() && !of_this_task;
        if unneeded {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).state = None;
        }
        unneeded
    }

    /// The writer task: after the delay, stores the newest pending state.
    async fn write_behind(self: Arc<Self>) {
        tokio::time::sleep(WRITE_BEHIND_DELAY).await;
        let mut written = self.writer.lock().await;
        let taken = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.scheduled = false;
            pending.state.take()
        };
        let Some((generation, state)) = taken else {
            return;
        };
        if let Err(error) = self.store_state(&mut written, generation, &state).await {
            // A later durable point stores a newer state; this one is only
            // lost if the process dies before then.
            tracing::warn!(session.id = %self.template.session_id, step = state.step(), %error, "written-behind checkpoint not stored");
        }
    }
}

#[async_trait::async_trait]
impl CheckpointSink for KvCheckpointSink {
    async fn save(
        &self,
        state: &LoopState,
        durability: Durability,
    ) -> Result<(), mtswarm_core::CheckpointError> {
        let store = |reason| mtswarm_core::CheckpointError::Store { reason };
        let inner = &self.inner;
        if inner.frozen.load(Ordering::SeqCst) || inner.fenced() {
            return Ok(());
        }
        if durability == Durability::Required {
            if state.node() == Node::Done && inner.final_state_unneeded().await {
                return Ok(());
            }
            let generation = {
                let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
                // This state supersedes whatever waits to be written.
                pending.state = None;
                pending.next_generation += 1;
                pending.next_generation
            };
            let mut written = inner.writer.lock().await;
            return inner
                .store_state(&mut written, generation, state)
                .await
                .map_err(|e| store(e.to_string()));
        }
        let schedule = {
            let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.next_generation += 1;
            pending.state = Some((pending.next_generation, state.clone()));
            !std::mem::replace(&mut pending.scheduled, true)
        };
        if schedule {
            tokio::spawn(inner.clone().write_behind());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtswarm_bus::testing::{NatsServer, ready_bus, start_nats};
    use mtswarm_bus::{Bus, BusConfig};

    /// A nats-server with the topology and its checkpoints bucket.
    pub(super) async fn store() -> (NatsServer, Bus, Checkpoints) {
        let server = start_nats().await;
        let bus = ready_bus(BusConfig::new(server.url())).await;
        let checkpoints = Checkpoints::open(&bus).await.expect("checkpoints");
        (server, bus, checkpoints)
    }

    fn sink(
        store: &Checkpoints,
        task_id: &str,
        attempt: u32,
        known: &SessionCheckpointCell,
    ) -> KvCheckpointSink {
        KvCheckpointSink::new(
            store.clone(),
            "s1",
            "j1",
            "a1",
            task_id,
            attempt,
            known.clone(),
            &ContextConfig::default(),
            None,
        )
    }

    async fn write(sink: &KvCheckpointSink, step: u32) -> Result<(), CheckpointWriteError> {
        let inner = &sink.inner;
        let mut checkpoint = inner.template.clone();
        checkpoint.step = step;
        let generation = {
            let mut pending = inner.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.next_generation += 1;
            pending.next_generation
        };
        let mut written = inner.writer.lock().await;
        inner.write(&mut written, generation, &checkpoint).await
    }

    fn known(cell: &SessionCheckpointCell) -> Option<KnownCheckpoint> {
        cell.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    #[test]
    fn only_a_later_attempt_of_the_same_task_is_not_replaceable() {
        let stored = KnownCheckpoint {
            revision: 7,
            task_id: "t1".into(),
            attempt: 2,
            fenced: false,
            nonce: None,
        };
        assert!(stored.replaceable_by("t2", 1), "another task");
        assert!(stored.replaceable_by("t1", 2), "the same attempt");
        assert!(stored.replaceable_by("t1", 3), "a later attempt");
        assert!(!stored.replaceable_by("t1", 1), "an earlier attempt");
        let fenced = KnownCheckpoint {
            fenced: true,
            ..stored
        };
        assert!(!fenced.replaceable_by("t1", 2), "the fenced attempt itself");
        assert!(fenced.replaceable_by("t1", 3), "a later attempt");
        assert!(fenced.replaceable_by("t2", 1), "another task");
    }

    #[tokio::test]
    async fn a_fenced_attempt_cannot_write_again_but_its_successor_can() {
        let (_server, _bus, checkpoints) = store().await;
        let cell: SessionCheckpointCell = Arc::new(Mutex::new(None));
        let first = sink(&checkpoints, "t1", 1, &cell);
        write(&first, 1).await.expect("first attempt's write");
        assert!(
            checkpoints
                .mark_fenced("s1", "t1", 1)
                .await
                .expect("mark fenced")
        );
        assert!(
            !checkpoints
                .mark_fenced("s1", "t1", 7)
                .await
                .expect("another attempt"),
            "only the stored attempt is marked"
        );

        // A redelivery of attempt 1 in a new session (nothing known) and one
        // that read the fenced checkpoint are both refused.
        let fresh_cell: SessionCheckpointCell = Arc::new(Mutex::new(None));
        let redelivered = sink(&checkpoints, "t1", 1, &fresh_cell);
        assert!(matches!(
            write(&redelivered, 2).await,
            Err(CheckpointWriteError::Fenced(_))
        ));
        assert!(redelivered.fenced());
        let stored = checkpoints.get("s1").await.expect("get").expect("stored");
        assert!(stored.value.fenced);
        *fresh_cell.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(KnownCheckpoint::of_stored(&stored));
        let resumed = sink(&checkpoints, "t1", 1, &fresh_cell);
        assert!(matches!(
            write(&resumed, 3).await,
            Err(CheckpointWriteError::Fenced(_))
        ));
        assert_eq!(
            checkpoints
                .get("s1")
                .await
                .expect("get")
                .expect("stored")
                .value
                .step,
            1,
            "the fenced state stays"
        );

        // Attempt 2 resumes from it and replaces it.
        let successor = sink(&checkpoints, "t1", 2, &fresh_cell);
        write(&successor, 4).await.expect("the next attempt writes");
        let stored = checkpoints.get("s1").await.expect("get").expect("stored");
        assert_eq!((stored.value.attempt, stored.value.fenced), (2, false));
    }

    #[tokio::test]
    async fn later_tasks_replace_the_sessions_own_checkpoint_and_fencing_still_holds() {
        let (_server, _bus, checkpoints) = store().await;
        let cell: SessionCheckpointCell = Arc::new(Mutex::new(None));

        let first = sink(&checkpoints, "t1", 1, &cell);
        write(&first, 1).await.expect("first task's write");
        let after_first = known(&cell).expect("known after a write");
        assert_eq!(
            (after_first.task_id.as_str(), after_first.attempt),
            ("t1", 1)
        );

        // The next task's first write replaces what the session wrote.
        let second = sink(&checkpoints, "t2", 1, &cell);
        write(&second, 1).await.expect("second task's write");
        let stored = checkpoints.get("s1").await.expect("get").expect("stored");
        assert_eq!(stored.value.task_id, "t2");
        assert_eq!(known(&cell).map(|k| k.revision), Some(stored.revision));

        // A later attempt of t2 (another process) takes the session over.
        let mut successor = stored.value.clone();
        successor.attempt = 2;
        successor.step = 5;
        checkpoints
            .put(&successor)
            .await
            .expect("successor's write");

        // A fresh sink of the old attempt starts from what the session knew
        // (its own t2/1 write), finds it replaced, and is fenced off.
        let stale = sink(&checkpoints, "t2", 1, &cell);
        let refused = write(&stale, 2).await;
        assert!(
            matches!(refused, Err(CheckpointWriteError::Fenced(_))),
            "stale attempt refused: {refused:?}"
        );
        assert!(stale.fenced());
        let stored = checkpoints.get("s1").await.expect("get").expect("stored");
        assert_eq!((stored.value.attempt, stored.value.step), (2, 5));

        // Knowing a later attempt of the task, the old attempt is refused too.
        *cell.lock().unwrap_or_else(|e| e.into_inner()) = Some(KnownCheckpoint {
            revision: stored.revision,
            task_id: "t2".into(),
            attempt: 2,
            fenced: false,
            nonce: None,
        });
        let stale_again = sink(&checkpoints, "t2", 1, &cell);
        assert!(matches!(
            write(&stale_again, 3).await,
            Err(CheckpointWriteError::Fenced(_))
        ));
        assert!(stale_again.fenced());

        // The successor's next write goes through on the known revision.
        let current = sink(&checkpoints, "t2", 2, &cell);
        write(&current, 6).await.expect("successor continues");
        let stored = checkpoints.get("s1").await.expect("get").expect("stored");
        assert_eq!((stored.value.attempt, stored.value.step), (2, 6));
    }

    /// With the daemon's seal, a stored checkpoint counts only with the
    /// leader's grant and the granted worker's signature: another worker's
    /// "later attempt" neither fences the session off nor is resumed from.
    #[tokio::test]
    async fn a_forged_later_attempt_neither_fences_nor_is_read_back() {
        let (_server, _bus, plain) = store().await;
        let leader = mtswarm_auth::DecisionSigner::generate();
        let key = mtswarm_auth::WorkerKey::generate();
        let (seal, _) = crate::provenance::seal_and_signer(&key, Some(&leader.verifier()));
        let checkpoints = plain.clone().with_seal(seal);
        let assignment = v1::TaskAssignment {
            task_id: "t1".into(),
            job_id: "j1".into(),
            attempt: 1,
            agent_id: "a1".into(),
            session_id: "s1".into(),
            worker_id: "w1".into(),
            slice_id: "b0-c0".into(),
            ..Default::default()
        };
        let mut grant = mtswarm_auth::grant_for(&assignment, &key.public_key());
        leader.sign_grant(&mut grant).expect("grant");
        let cell: SessionCheckpointCell = Arc::new(Mutex::new(None));
        let session = KvCheckpointSink::new(
            checkpoints.clone(),
            "s1",
            "j1",
            "a1",
            "t1",
            1,
            cell.clone(),
            &ContextConfig::default(),
            Some(grant),
        );
        let mut first = session.inner.template.clone();
        first.step = 1;
        checkpoints.sign(&mut first);
        checkpoints.put(&first).await.expect("genuine write");
        let genuine = checkpoints.get_genuine("s1").await.expect("get");
        assert_eq!(genuine.map(|c| c.value.step), Some(1));

        // Another worker writes attempt 99 with the grant copied, signed
        // by a key of its own.
        let mut forged = first.clone();
        forged.attempt = 99;
        forged.step = 1_000;
        mtswarm_auth::WorkerKey::generate()
            .sign_checkpoint(&mut forged)
            .expect("sign");
        plain.kv().put("s1", &forged).await.expect("stored");
        assert!(checkpoints.get_genuine("s1").await.expect("get").is_none());

        write(&session, 2).await.expect("not fenced by a forgery");
        assert!(!session.fenced());
        let stored = checkpoints
            .get_genuine("s1")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!((stored.value.attempt, stored.value.step), (1, 2));
    }
}
