//! The run of a task attempt on the engine: its engine configuration
//! (budgets, approvals, gate), its checkpoint sink, the start or resume,
//! the kernel's baseline measurement, and the loop that drives each run
//! segment ([`super::drive`]) and waits for approvals between them.

use std::sync::Arc;
use std::time::Duration;

use mtswarm_bus::v1;
use mtswarm_core::{
    ApprovalConfig, ApprovalDecision, ApprovalRequest, EngineConfig, GateConfig, InjectionConfig,
    LoopState, Node, Outcome, RunEnd, StopReason,
};
use serde_json::json;
use tokio::sync::watch;

use super::drive::{Driven, Segment};
use super::result::TaskEnd;
use super::runtime::SessionRuntime;
use super::task_run::TaskRun;
use super::validate::{Prepared, set_or};
use crate::approval::{self, ApprovalWait};
use crate::checkpoint::KvCheckpointSink;
use crate::config::DefaultVerdict;
use crate::events::EventPublisher;
use crate::results::MeasurementRecorder;
use crate::stop::StopMode;
use mtswarm_core::answer::last_json;
use mtswarm_policy::worker::render_task_message;

use v1::AgentEventKind as Kind;
use v1::SessionState;

impl TaskRun<'_> {
    /// Run the attempt on the session's engine: a fresh start or a resume,
    /// driven through every approval pause to its outcome, then the
    /// kernel's baseline when asked.
    pub(super) async fn execute(
        &self,
        stop: &mut watch::Receiver<StopMode>,
        prepared: Prepared,
        resumed: Option<LoopState>,
    ) -> Result<Driven, TaskEnd> {
        let Prepared {
            deadline,
            parameters,
            kernel_name,
            budgets,
        } = prepared;
        let config = self.engine_config(&budgets);
        let sink = self.checkpoint_sink(&config);
        let engine = self
            .runtime
            .engine_for(config)
            .with_checkpoint_sink(sink.clone());
        let resumed_from_step = resumed.as_ref().map(LoopState::step).unwrap_or(0);
        // Staged: it goes out with the run's first events (or the baseline's).
        self.events.stage(
            resumed_from_step,
            Kind::Log,
            json!({"type": "task_started", "task_id": self.task.task_id, "attempt": self.task.attempt,
               "resumed_from_step": resumed_from_step, "kernel_dir": kernel_name}),
        );
        let mut run = match resumed {
            Some(state) if state.node() == Node::Done => {
                return Ok(Driven::Outcome(Box::new(outcome_of_done(state))));
            }
            Some(state) => {
                tracing::info!(step = state.step(), "resuming the task from its checkpoint");
                engine
                    .resume(state)
                    .map_err(|e| TaskEnd::failed(format!("resume: {e}")))?
            }
            None => {
                let message = render_task_message(
                    &self.task.task_id,
                    &kernel_name,
                    &self.task.instructions,
                    &parameters,
                );
                engine.start(&self.entry.session_id, &self.runtime.system_prompt, message)
            }
        };
        let recorder = self.recorder(&kernel_name);
        let segment = Segment {
            sink: &sink,
            deadline,
            device_budget: (budgets.device_seconds > 0.0).then_some(budgets.device_seconds),
            recorder: &recorder,
        };
        loop {
            let (stream, handle) = run;
            sink.attach(handle.control());
            let outcome = match self.drive(stop, &segment, stream, handle).await {
                Driven::Abandoned if sink.fenced() => return Ok(Driven::Fenced),
                Driven::Fenced => return Ok(Driven::Fenced),
                Driven::Abandoned => return Ok(Driven::Abandoned),
                Driven::Outcome(outcome) => *outcome,
            };
            let Outcome::Paused {
                checkpoint,
                approvals,
            } = outcome
            else {
                return Ok(self.finish(outcome, &sink, &recorder, &kernel_name).await);
            };
            let decisions = match self.await_approvals(stop, &checkpoint, &approvals).await {
                Ok(decisions) => decisions,
                Err(approval::Interrupted::Abandon) => return Ok(Driven::Abandoned),
                Err(approval::Interrupted::Fence) => return Ok(Driven::Fenced),
                Err(approval::Interrupted::Cancel(why)) => {
                    return Ok(Driven::Outcome(Box::new(Outcome::Stopped {
                        reason: StopReason::Cancelled,
                        message: format!("cancelled while waiting for approval: {why}"),
                        state: checkpoint,
                    })));
                }
            };
            self.entry.update(|p| p.state = SessionState::Running);
            run = engine
                .resume_with_decisions(checkpoint, decisions)
                .map_err(|e| TaskEnd::failed(format!("resume after approval: {e}")))?;
        }
    }

    /// The attempt's checkpoint sink: the session's checkpoint key, written
    /// as this attempt of this task, with its grant.
    fn checkpoint_sink(&self, config: &EngineConfig) -> Arc<KvCheckpointSink> {
        let (entry, task) = (self.entry, &self.task);
        Arc::new(KvCheckpointSink::new(
            self.shared.stores.checkpoints.clone(),
            &entry.session_id,
            &task.job_id,
            &entry.agent_id,
            &task.task_id,
            task.attempt,
            self.runtime.checkpoint.clone(),
            &config.context,
            task.grant.clone(),
        ))
    }

    /// Records the attempt's measurements under the kernel's name.
    fn recorder(&self, kernel_name: &str) -> MeasurementRecorder {
        MeasurementRecorder::new(
            self.shared.stores.results.clone(),
            &self.task,
            &self.shared.identity.worker_id,
            kernel_name,
            self.runtime.model.model_name(),
            self.runtime.tools.env().clone(),
        )
    }

    /// The run ended (not paused): fenced when its slice was lost meanwhile;
    /// else the kernel's baseline when asked, and the measurements finished
    /// with the answer's JSON.
    async fn finish(
        &self,
        outcome: Outcome,
        sink: &KvCheckpointSink,
        recorder: &MeasurementRecorder,
        kernel_name: &str,
    ) -> Driven {
        if sink.fenced() {
            return Driven::Fenced;
        }
        let answer = match &outcome {
            Outcome::Final { text, .. } => last_json(text),
            _ => None,
        };
        let cancelled = matches!(
            &outcome,
            Outcome::Stopped {
                reason: StopReason::Cancelled,
                ..
            }
        );
        // After the agent's run, not before it: measured first, it held
        // this one slice for as long as the reference takes while every
        // other slice of the job tuned (on the emulator, the naive kernel
        // is the slowest launch of the job), and the speed-up it serves is
        // only computed when the job ends. Any attempt that ends measures
        // it (one that dies first did not).
        let baseline_wanted = self.task.measure_baseline && kernel_name != ".";
        if baseline_wanted && !cancelled {
            measure_baseline(self.runtime, self.events, recorder, kernel_name).await;
        }
        recorder.finish(answer.as_ref()).await;
        Driven::Outcome(Box::new(outcome))
    }

    /// A paused run: the session awaits the decisions of its approvals
    /// ([`approval::await_decisions`]).
    async fn await_approvals(
        &self,
        stop: &mut watch::Receiver<StopMode>,
        checkpoint: &LoopState,
        approvals: &[ApprovalRequest],
    ) -> Result<approval::Decisions, approval::Interrupted> {
        // The run's last events before the wait must not wait with it.
        self.events.flush().await;
        self.entry
            .update(|p| p.state = SessionState::AwaitingApproval);
        let wait = ApprovalWait {
            shared: self.shared,
            session_id: &self.entry.session_id,
            agent_id: &self.entry.agent_id,
            task: &self.task,
            events: self.events,
            step: checkpoint.step(),
            tools: self.runtime.tools.env(),
        };
        approval::await_decisions(&wait, approvals, stop, self.delivery).await
    }

    /// The engine configuration of the attempt: its budgets (the daemon's
    /// step limit when the task gives none), the approval timeout and
    /// default, the completion gate and the session's sampling settings.
    fn engine_config(&self, budgets: &v1::Budgets) -> EngineConfig {
        let (shared, runtime) = (self.shared, self.runtime);
        let approval_default = match shared.config.approval_default {
            DefaultVerdict::Deny => ApprovalDecision::Deny {
                reason: Some("approval timed out".into()),
            },
            DefaultVerdict::Approve => ApprovalDecision::Approve,
        };
        EngineConfig {
            max_steps: set_or(budgets.max_steps, shared.config.default_max_steps),
            token_budget: (budgets.max_tokens > 0).then_some(budgets.max_tokens),
            wall_time: (budgets.wall_time_seconds > 0)
                .then(|| Duration::from_secs(budgets.wall_time_seconds)),
            approval: ApprovalConfig {
                timeout: shared.config.approval_timeout,
                on_timeout: approval_default,
            },
            gate: GateConfig {
                require_evidence: (!shared.config.require_evidence.is_empty())
                    .then(|| shared.config.require_evidence.clone()),
                best_effort: true,
                max_blocks: 2,
            },
            temperature: runtime.temperature,
            max_output_tokens: runtime.max_output_tokens,
            injection: InjectionConfig {
                placement: shared.config.context_placement,
                ..InjectionConfig::default()
            },
            ..EngineConfig::default()
        }
    }
}

/// Measures the kernel's tune.toml baseline on the slice and records it. A
/// baseline that cannot be measured costs the job its speed-up figure, not
/// the task: it is logged and reported as an event.
async fn measure_baseline(
    runtime: &SessionRuntime,
    events: &EventPublisher,
    recorder: &MeasurementRecorder,
    kernel_name: &str,
) {
    // `task_started` is not held back while the slice measures.
    events.flush().await;
    match runtime.tools.measure_baseline(kernel_name).await {
        Ok(baseline) => {
            let m = &baseline.measurement;
            tracing::info!(
                kernel = kernel_name,
                valid = m.valid,
                gflops = m.gflops,
                median_seconds = m.stats.as_ref().map(|s| s.median),
                "tune.toml baseline measured"
            );
            events
                .publish(
                    0,
                    Kind::Log,
                    json!({"type": "baseline_measured", "kernel": kernel_name,
                           "defines": baseline.defines, "valid": m.valid,
                           "gflops": m.gflops,
                           "median_seconds": m.stats.as_ref().map(|s| s.median),
                           "error": m.error}),
                )
                .await;
            recorder.baseline(m).await;
        }
        Err(error) => {
            tracing::warn!(%error, kernel = kernel_name, "tune.toml baseline not measured");
            events
                .publish(
                    0,
                    Kind::Log,
                    json!({"type": "baseline_failed", "kernel": kernel_name,
                           "error": error.to_string()}),
                )
                .await;
        }
    }
}

fn outcome_of_done(state: LoopState) -> Outcome {
    match state.end().cloned() {
        Some(RunEnd::Final { text, verdict }) => Outcome::Final {
            text,
            verdict,
            state,
        },
        Some(RunEnd::Stopped { reason, message }) => Outcome::Stopped {
            reason,
            message,
            state,
        },
        None => Outcome::Stopped {
            reason: StopReason::Aborted,
            message: "the checkpointed run ended without a recorded end".into(),
            state,
        },
    }
}
