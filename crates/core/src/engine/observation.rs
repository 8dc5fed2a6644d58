//! The observation node: every call's result becomes a tool message, its
//! effects update the working state and the evidence ledger.

use std::sync::Arc;

use super::Run;
use crate::model::Message;
use crate::state::{CallStatus, Node, TransitionReason};
use crate::working::apply_effect;

impl Run {
    pub(super) fn observe(&mut self) {
        let calls = std::mem::take(&mut self.state.calls);
        let step = self.state.step;
        let mut working = None;
        let mut ledger = None;
        for call in calls {
            let content = match call.status {
                CallStatus::Rejected { observation }
                | CallStatus::Denied { observation }
                | CallStatus::Finished { observation, .. } => observation,
                CallStatus::Pending | CallStatus::AwaitingApproval | CallStatus::Approved => {
                    format!("error: the call to '{}' was not executed", call.call.name)
                }
            };
            if !call.effects.is_empty() {
                let working = working.get_or_insert_with(|| (*self.state.working).clone());
                let ledger = ledger.get_or_insert_with(|| (*self.state.evidence).clone());
                for effect in &call.effects {
                    apply_effect(working, ledger, effect, step);
                }
            }
            self.state
                .push_message(Message::tool(call.call.id, content));
        }
        if let Some(working) = working {
            self.state.working = Arc::new(working);
        }
        if let Some(ledger) = ledger {
            self.state.evidence = Arc::new(ledger);
        }
        if self.budget_stop() || self.steps_exhausted() {
            return;
        }
        self.state.step += 1;
        self.transition(
            Node::Reasoning,
            TransitionReason::ObservationsRecorded,
            None,
        );
    }
}
