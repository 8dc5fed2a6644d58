//! The tool-execution node: refusals first, then batches of calls (the
//! concurrency-safe ones together), with the resource lock, timeouts and
//! progress events.

use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::Run;
use super::config::DEFAULT_HARDWARE_RESOURCE;
use crate::event::EventKind;
use crate::middleware::{ToolCallInfo, ToolCallOutcome, run_chain};
use crate::state::{CallStatus, Node, TransitionReason};
use crate::tool::{Effect, ToolContext, ToolError, ToolProgress, ToolSpec};

impl Run {
    pub(super) async fn execute(&mut self) {
        // Report refusals first, so every requested call has a result event.
        let refused: Vec<(String, String, String)> = self
            .state
            .calls
            .iter()
            .filter_map(|c| match &c.status {
                CallStatus::Rejected { observation } | CallStatus::Denied { observation } => {
                    Some((c.call.id.clone(), c.call.name.clone(), observation.clone()))
                }
                _ => None,
            })
            .collect();
        for (call_id, name, content) in refused {
            self.emit(failed_result(call_id, name, content, None, 0));
        }

        // Consecutive concurrency-safe calls form one concurrent batch;
        // every other call runs alone, in the model's order.
        let registry = self.engine.registry.clone();
        let approved: Vec<usize> = self
            .state
            .calls
            .iter()
            .enumerate()
            .filter(|(_, c)| c.status == CallStatus::Approved)
            .map(|(i, _)| i)
            .collect();
        let mut batches: Vec<Vec<usize>> = Vec::new();
        let mut open_concurrent = false;
        for index in approved {
            let safe = registry
                .get(&self.state.calls[index].call.name)
                .is_some_and(|e| e.tool.spec().concurrency_safe);
            match batches.last_mut() {
                Some(batch) if safe && open_concurrent => batch.push(index),
                _ => batches.push(vec![index]),
            }
            open_concurrent = safe;
        }
        for batch in batches {
            if self.cancelled() {
                return;
            }
            self.run_batch(&batch).await;
        }
        if self.cancelled() {
            return;
        }
        self.transition(Node::Observation, TransitionReason::ToolsExecuted, None);
    }

    pub(super) async fn run_batch(&mut self, batch: &[usize]) {
        let engine = self.engine.clone();
        let step = self.state.step;
        let (progress_tx, mut progress_rx) = mpsc::unbounded_channel::<(String, ToolProgress)>();
        let mut jobs = Vec::with_capacity(batch.len());
        for &index in batch {
            let call = &self.state.calls[index];
            let Some(entry) = engine.registry.get(&call.call.name) else {
                continue;
            };
            let risk = call.risk.unwrap_or(crate::tool::Risk::High);
            let arguments = call.arguments.clone().unwrap_or(serde_json::Value::Null);
            jobs.push((
                index,
                entry,
                ToolCallInfo {
                    session_id: self.session.clone(),
                    step,
                    call_id: call.call.id.clone(),
                    tool: call.call.name.clone(),
                    risk,
                },
                arguments,
            ));
        }
        for (_, _, info, arguments) in &jobs {
            let event = EventKind::ToolCall {
                call_id: info.call_id.clone(),
                name: info.tool.clone(),
                arguments: arguments.clone(),
                risk: info.risk,
            };
            self.emit(event);
        }
        let middlewares = engine.middlewares.clone();
        let lock = engine.lock.clone();
        let tool_timeout = engine.config.tool_timeout;
        let mut running: FuturesUnordered<_> = jobs
            .into_iter()
            .map(|(index, entry, info, arguments)| {
                let ctx = ToolContext::new(self.session.to_string(), info.call_id.clone(), step)
                    .with_progress(progress_tx.clone());
                let lock = lock.clone();
                let middlewares = &middlewares;
                async move {
                    let outcome = run_chain(
                        middlewares,
                        info,
                        |m, i, n| m.on_tool_call(i, n),
                        Box::new(move |_info: ToolCallInfo| {
                            Box::pin(async move {
                                let started = Instant::now();
                                let guard = if entry.tool.spec().needs_hardware {
                                    // Without a named resource, all such
                                    // tools share one lock: the safe default.
                                    let resource = entry
                                        .tool
                                        .resource()
                                        .unwrap_or_else(|| DEFAULT_HARDWARE_RESOURCE.to_owned());
                                    Some(lock.acquire(&resource).await)
                                } else {
                                    None
                                };
                                let lock_wait = guard.as_ref().map(|g| g.waited);
                                let call = entry.tool.call(arguments, &ctx);
                                let result = match tool_timeout {
                                    Some(limit) => tokio::time::timeout(limit, call)
                                        .await
                                        .unwrap_or(Err(ToolError::Timeout(limit))),
                                    None => call.await,
                                };
                                drop(guard);
                                ToolCallOutcome {
                                    result,
                                    lock_wait,
                                    duration: started.elapsed(),
                                }
                            })
                        }),
                    )
                    .await;
                    (index, outcome)
                }
            })
            .collect();
        drop(progress_tx);
        let mut cancel = self.cancel_rx.clone();
        loop {
            tokio::select! {
                biased;
                Some((call_id, progress)) = progress_rx.recv() => {
                    self.emit_progress(call_id, progress);
                }
                finished = running.next() => {
                    let Some((index, outcome)) = finished else { break };
                    // Progress sent before the call returned comes first.
                    while let Ok((call_id, progress)) = progress_rx.try_recv() {
                        self.emit_progress(call_id, progress);
                    }
                    self.record_result(index, outcome);
                }
                _ = cancel.wait_for(|c| *c) => return,
            }
        }
    }

    fn emit_progress(&mut self, call_id: String, progress: ToolProgress) {
        self.emit(EventKind::ToolStateUpdate {
            call_id,
            message: progress.message,
            fraction: progress.fraction,
        });
    }

    pub(super) fn record_result(&mut self, index: usize, mut outcome: ToolCallOutcome) {
        let registry = &self.engine.registry;
        let Some(call) = self.state.calls.get_mut(index) else {
            return;
        };
        if let (Ok(output), Some(entry)) = (&mut outcome.result, registry.get(&call.call.name)) {
            keep_declared_effects(entry.tool.spec(), &mut output.effects);
        }
        let lock_wait_ms = outcome
            .lock_wait
            .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        let duration_ms = u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX);
        let call_id = call.call.id.clone();
        let name = call.call.name.clone();
        let note = ignored_note(&name, &call.ignored_arguments);
        let event = match outcome.result {
            Ok(output) => {
                let content = format!("{note}{}", output.content);
                call.status = CallStatus::Finished {
                    ok: true,
                    observation: content.clone(),
                };
                call.effects = output.effects.clone();
                EventKind::ToolResult {
                    call_id,
                    name,
                    ok: true,
                    content,
                    data: output.data,
                    effects: output.effects,
                    lock_wait_ms,
                    duration_ms,
                }
            }
            Err(error) => {
                let content = format!("{note}error: {error}");
                call.status = CallStatus::Finished {
                    ok: false,
                    observation: content.clone(),
                };
                self.state.risk.tool_errors += 1;
                failed_result(call_id, name, content, lock_wait_ms, duration_ms)
            }
        };
        self.emit(event);
    }
}

/// The line before a result that says which arguments were dropped (empty
/// when none were).
fn ignored_note(tool: &str, ignored: &[String]) -> String {
    if ignored.is_empty() {
        return String::new();
    }
    format!(
        "note: '{tool}' does not take {}; ran without {}.\n",
        ignored.join(", "),
        if ignored.len() == 1 { "it" } else { "them" }
    )
}

/// The result event of a call that returned no output: refused before it
/// ran, or failed (`content` says why).
/// Drops (and logs) the effects of kinds the tool did not declare: what a
/// call may change in the working state and the evidence ledger is the
/// tool's declaration, not whatever its output claims.
fn keep_declared_effects(spec: &ToolSpec, effects: &mut Vec<Effect>) {
    effects.retain(|effect| {
        let declared = spec.declares(effect.kind());
        if !declared {
            tracing::warn!(
                tool = %spec.name,
                kind = ?effect.kind(),
                "effect of a kind the tool does not declare dropped"
            );
        }
        declared
    });
}

fn failed_result(
    call_id: String,
    name: String,
    content: String,
    lock_wait_ms: Option<u64>,
    duration_ms: u64,
) -> EventKind {
    EventKind::ToolResult {
        call_id,
        name,
        ok: false,
        content,
        data: None,
        effects: Vec::new(),
        lock_wait_ms,
        duration_ms,
    }
}
