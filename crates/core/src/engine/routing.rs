//! The routing node: validate each call against the registry and decide its
//! permission (allow, ask a human, deny).
//!
//! A call refused only for arguments its tool does not take is refused
//! once; the same arguments on a later call of that tool are dropped and
//! the call runs, its result saying what was dropped. A small model told
//! "only its arguments ..." often sends its guessed field again and again,
//! and each refusal costs a step without bringing it closer.

use super::Run;
use crate::middleware::{PermissionInput, run_chain};
use crate::policy::Permission;
use crate::registry::{CallRejection, ToolRegistry};
use crate::state::{CallStatus, Node, PendingCall, TransitionReason};

impl Run {
    pub(super) async fn route(&mut self) {
        let middlewares = self.engine.middlewares.clone();
        let registry = self.engine.registry.clone();
        let policy = self.engine.policy.clone();
        let mut calls = std::mem::take(&mut self.state.calls);
        for call in &mut calls {
            if call.status != CallStatus::Pending {
                continue;
            }
            let entry = match registry.available(&call.call.name, &self.state.active_groups) {
                Ok(entry) => entry,
                Err(rejection) => {
                    self.reject(call, &rejection);
                    continue;
                }
            };
            let parsed = call.arguments.take().unwrap_or(serde_json::Value::Null);
            let ignorable = self
                .state
                .refused_arguments
                .get(&call.call.name)
                .cloned()
                .unwrap_or_default();
            let arguments = match ToolRegistry::prepare_arguments(entry, parsed, &ignorable) {
                Ok(prepared) => {
                    if !prepared.ignored.is_empty() {
                        self.state.risk.arguments_ignored += 1;
                    }
                    call.ignored_arguments = prepared.ignored;
                    prepared.arguments
                }
                Err(rejection) => {
                    if let CallRejection::UnknownArguments { fields, .. } = &rejection {
                        self.state
                            .refused_arguments
                            .entry(call.call.name.clone())
                            .or_default()
                            .extend(fields.iter().cloned());
                    }
                    self.reject(call, &rejection);
                    continue;
                }
            };
            let risk = policy.risk_of(&call.call.name, entry.tool.spec().risk);
            call.risk = Some(risk);
            let policy_verdict = policy.permission_for(&call.call.name, risk);
            let permission = if middlewares.is_empty() {
                policy_verdict
            } else {
                run_chain(
                    &middlewares,
                    PermissionInput {
                        session_id: self.session.clone(),
                        step: self.state.step,
                        call_id: call.call.id.clone(),
                        tool: call.call.name.clone(),
                        arguments: arguments.clone(),
                        risk,
                    },
                    |m, i, n| m.on_check_permission(i, n),
                    Box::new(move |_| Box::pin(async move { policy_verdict })),
                )
                .await
            };
            call.arguments = Some(arguments);
            call.status = match permission {
                Permission::Allow => CallStatus::Approved,
                Permission::Ask => CallStatus::AwaitingApproval,
                Permission::Deny { reason } => {
                    self.state.risk.permission_denied += 1;
                    CallStatus::Denied {
                        observation: format!(
                            "error: permission to call '{}' was denied: {reason}",
                            call.call.name
                        ),
                    }
                }
            };
        }
        let awaiting = calls
            .iter()
            .filter(|c| c.status == CallStatus::AwaitingApproval)
            .count();
        self.state.calls = calls;
        if awaiting > 0 {
            self.transition(
                Node::HumanApproval,
                TransitionReason::ApprovalRequired,
                Some(format!("{awaiting} call(s) need approval")),
            );
        } else {
            self.transition(Node::ToolExecution, TransitionReason::ToolsRouted, None);
        }
    }

    /// Refuses `call` for `rejection`: counted, and the reason is the
    /// call's observation.
    fn reject(&mut self, call: &mut PendingCall, rejection: &CallRejection) {
        call.status = CallStatus::Rejected {
            observation: rejection.observation(),
        };
        let risk = &mut self.state.risk;
        match rejection {
            CallRejection::UnknownTool(_) => risk.unknown_tool += 1,
            CallRejection::NotAllowed(_) => risk.tool_not_allowed += 1,
            CallRejection::Protocol(_) => risk.protocol_errors += 1,
            CallRejection::Normalize(_) => risk.normalize_errors += 1,
            CallRejection::Schema(_) | CallRejection::UnknownArguments { .. } => {
                risk.schema_errors += 1
            }
        }
    }
}
