//! The driver of a run segment: the loop over nodes, transitions, ends,
//! checkpoints, and the middleware hooks around steps and nodes.

use super::Durability;
use super::{Outcome, Run};
use crate::event::EventKind;
use crate::middleware::{BoxFuture, Layer, StepInfo, StepReport, run_chain};
use crate::state::{CallStatus, Node, RunEnd, StopReason, TransitionReason, Verdict};

impl Run {
    pub(super) fn cancelled(&self) -> bool {
        *self.cancel_rx.borrow()
    }

    pub(super) fn emit(&mut self, kind: EventKind) {
        let step = self.state.step;
        self.emitter.emit(step, kind);
    }

    /// Record a transition; emits the Transition event.
    pub(super) fn transition(
        &mut self,
        to: Node,
        reason: TransitionReason,
        detail: Option<String>,
    ) {
        let now = self.engine.clock.now_ms();
        let state = &mut self.state;
        state.active_ms = self.segment_base_active_ms + now.saturating_sub(self.segment_start_ms);
        let from = state.node;
        state.advance(to, reason, detail.clone(), now);
        self.emit(EventKind::Transition {
            from,
            to,
            reason,
            detail,
        });
        self.state.event_seq = self.emitter.seq;
    }

    pub(super) fn finish(&mut self, text: String, verdict: Verdict) {
        self.state.end = Some(RunEnd::Final {
            text: text.clone(),
            verdict: verdict.clone(),
        });
        self.emit(EventKind::ReplyEnd { text, verdict });
        self.transition(Node::Done, TransitionReason::ModelReturnedFinal, None);
    }

    pub(super) fn stop(
        &mut self,
        reason: StopReason,
        transition: TransitionReason,
        message: String,
    ) {
        self.state.end = Some(RunEnd::Stopped {
            reason,
            message: message.clone(),
        });
        self.emit(EventKind::Stopped {
            reason,
            message: message.clone(),
        });
        self.transition(Node::Done, transition, Some(message));
    }

    pub(super) async fn checkpoint(&mut self) {
        if let Some(sink) = self.engine.sink.clone()
            && let Err(message) = sink.save(&self.state, self.durability()).await
        {
            self.emit(EventKind::Error {
                message: format!("checkpoint could not be saved: {message}"),
            });
        }
    }

    /// Whether a resume depends on the current state being stored before
    /// the run goes on (see [`Durability`]).
    fn durability(&self) -> Durability {
        match self.state.node {
            Node::Observation | Node::Done => Durability::Required,
            Node::HumanApproval if self.state.is_paused() => Durability::Required,
            Node::ToolExecution if self.batch_touches_outside() => Durability::Required,
            Node::Start
            | Node::Reasoning
            | Node::ToolRouting
            | Node::HumanApproval
            | Node::ToolExecution => Durability::Deferrable,
        }
    }

    /// Whether a call of the batch about to run may have an effect a
    /// resume or a later attempt could see: it takes the hardware, writes,
    /// declares effects of any kind (a build reports its artifact), or
    /// names a tool the registry does not know (assumed to, to be safe).
    /// Refused and denied calls do not run.
    fn batch_touches_outside(&self) -> bool {
        self.state
            .calls
            .iter()
            .filter(|pending| matches!(pending.status, CallStatus::Approved | CallStatus::Pending))
            .any(|pending| {
                self.engine
                    .registry
                    .get(&pending.call.name)
                    .is_none_or(|entry| {
                        let spec = entry.tool.spec();
                        spec.needs_hardware || !spec.read_only || !spec.effects.is_empty()
                    })
            })
    }

    pub(super) async fn drive(mut self) -> Outcome {
        loop {
            if self.state.node == Node::Done {
                return self.outcome();
            }
            if self.cancelled() {
                self.stop(
                    StopReason::Cancelled,
                    TransitionReason::Cancelled,
                    "the run was cancelled".to_owned(),
                );
                self.checkpoint().await;
                continue;
            }
            if self.state.is_paused() {
                let approvals = self.state.approval_requests();
                self.emit(EventKind::ApprovalRequired {
                    approvals: approvals.clone(),
                });
                self.state.event_seq = self.emitter.seq;
                self.checkpoint().await;
                return Outcome::Paused {
                    checkpoint: self.state.clone(),
                    approvals,
                };
            }
            self.hooked(Hooked::Step).await;
        }
    }

    pub(super) fn outcome(&self) -> Outcome {
        match &self.state.end {
            Some(RunEnd::Final { text, verdict }) => Outcome::Final {
                text: text.clone(),
                verdict: verdict.clone(),
                state: self.state.clone(),
            },
            Some(RunEnd::Stopped { reason, message }) => Outcome::Stopped {
                reason: *reason,
                message: message.clone(),
                state: self.state.clone(),
            },
            None => Outcome::Stopped {
                reason: StopReason::Aborted,
                message: "the run ended without a recorded end".to_owned(),
                state: self.state.clone(),
            },
        }
    }

    pub(super) fn info(&self) -> StepInfo {
        StepInfo {
            session_id: self.session.clone(),
            step: self.state.step,
            node: self.state.node,
        }
    }

    pub(super) fn report(&self) -> StepReport {
        StepReport {
            node: self.state.node,
            reason: self.state.last_transition().map(|t| t.reason),
        }
    }

    /// Run one part of the loop inside its middleware hook. A middleware
    /// that does not call `next` leaves no transition behind; unless the run
    /// was cancelled meanwhile, that stops it as aborted.
    async fn hooked(&mut self, part: Hooked) {
        let middlewares = self.engine.middlewares.clone();
        let info = self.info();
        let before = self.state.transitions.len();
        let layer: Layer<'_, StepInfo, StepReport> = match part {
            Hooked::Step => |m, i, n| m.on_step(i, n),
            Hooked::Reasoning => |m, i, n| m.on_reasoning(i, n),
            Hooked::Acting => |m, i, n| m.on_acting(i, n),
        };
        let this = &mut *self;
        run_chain(
            &middlewares,
            info,
            layer,
            Box::new(move |_| {
                Box::pin(async move {
                    match part {
                        Hooked::Step => this.step_body().await,
                        Hooked::Reasoning => this.reasoning().await,
                        Hooked::Acting => this.execute().await,
                    }
                    this.report()
                })
            }),
        )
        .await;
        if self.state.transitions.len() == before && !self.cancelled() {
            self.stop(
                StopReason::Aborted,
                TransitionReason::Aborted,
                format!("a middleware did not run {}", part.name()),
            );
        }
    }

    /// Run nodes until the next step begins, the run ends or it pauses.
    /// Boxed (and so of a named type) because the nodes it runs are hooked
    /// themselves: the step hook's future contains this one.
    fn step_body(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                match self.state.node {
                    Node::Start => {
                        self.transition(Node::Reasoning, TransitionReason::UserInput, None);
                    }
                    Node::Reasoning => self.hooked(Hooked::Reasoning).await,
                    Node::ToolRouting => self.route().await,
                    Node::HumanApproval => {
                        if self.state.is_paused() {
                            return;
                        }
                        let reason = self.approval_reason;
                        self.transition(Node::ToolExecution, reason, None);
                    }
                    Node::ToolExecution => self.hooked(Hooked::Acting).await,
                    Node::Observation => self.observe(),
                    Node::Done => return,
                }
                self.checkpoint().await;
                if self.cancelled() {
                    return;
                }
                let new_step = matches!(
                    self.state.last_transition().map(|t| t.reason),
                    Some(
                        TransitionReason::ObservationsRecorded | TransitionReason::StopHookBlocking
                    )
                );
                match self.state.node {
                    Node::Done => return,
                    Node::HumanApproval if self.state.is_paused() => return,
                    Node::Reasoning if new_step => return,
                    _ => {}
                }
            }
        })
    }
}

/// The parts of the loop a [`crate::Middleware`] node hook wraps.
#[derive(Debug, Clone, Copy)]
enum Hooked {
    /// `on_step`: one whole step.
    Step,
    /// `on_reasoning`: the reasoning node.
    Reasoning,
    /// `on_acting`: the tool-execution node.
    Acting,
}

impl Hooked {
    /// The part as the abort message names it.
    fn name(self) -> &'static str {
        match self {
            Self::Step => "the step",
            Self::Reasoning => "the reasoning node",
            Self::Acting => "the tool-execution node",
        }
    }
}
