//! Context compaction: summarizing the older turns of the history when the
//! view grows past its budget or the model rejects the prompt.

use std::sync::Arc;

use super::Run;
use crate::context::{render_transcript, turn_starts};
use crate::error::CompactionError;
use crate::event::EventKind;
use crate::middleware::{CompactionTrigger, CompressionInput, CompressionReport, run_chain};
use crate::model::{ChatRequest, Message, ToolChoice};

impl Run {
    pub(super) async fn compact(
        &mut self,
        trigger: CompactionTrigger,
    ) -> Result<(), CompactionError> {
        let middlewares = self.engine.middlewares.clone();
        let input = CompressionInput {
            session_id: self.session.clone(),
            step: self.state.step,
            trigger,
            tokens_before: self.view_tokens(),
        };
        let tokens_before = input.tokens_before;
        let this = &mut *self;
        let report = run_chain(
            &middlewares,
            input,
            |m, i, n| m.on_compress_context(i, n),
            Box::new(move |input: CompressionInput| {
                Box::pin(async move { this.compact_core(input.trigger).await })
            }),
        )
        .await?;
        self.emit(EventKind::ContextCompacted {
            tokens_before,
            tokens_after: report.tokens_after,
            summarized_messages: report.summarized_messages,
        });
        Ok(())
    }

    pub(super) async fn compact_core(
        &mut self,
        trigger: CompactionTrigger,
    ) -> Result<CompressionReport, CompactionError> {
        let context = self.engine.config.context.clone();
        let history = self.state.history.clone();
        // The task is pinned, never summarized.
        let pinned = usize::from(self.pinned_task().is_some());
        let region_start = self.state.projection.view_start.max(pinned);
        let turns = turn_starts(&history, region_start);
        let mut keep = context.keep_recent_turns.max(1);
        if trigger == CompactionTrigger::PromptTooLong {
            keep = (keep >> self.state.recovery.prompt_too_long_retries.min(16)).max(1);
            // The model refused the prompt, whatever the estimate below
            // says of the kept turns (a small model's tokenizer counts
            // more than the estimator): at least the oldest turn in view
            // is summarized when there are two.
            keep = keep.min(turns.len().saturating_sub(1)).max(1);
        }
        // Aim under the reserve: drop kept turns while the kept part alone
        // would not fit.
        let target = (context.window_tokens as f64 * (1.0 - context.reserve_ratio)) as u64;
        let estimator = self.engine.estimator.clone();
        while keep > 1 && turns.len() >= keep {
            let cut = turns[turns.len() - keep];
            let kept: u64 = history[cut..].iter().map(|m| estimator.estimate(m)).sum();
            if kept <= target {
                break;
            }
            keep -= 1;
        }
        if turns.len() <= keep {
            return Err(CompactionError::NothingToSummarize {
                turns: turns.len(),
                kept: keep,
            });
        }
        let cut = turns[turns.len() - keep];
        let older = &history[region_start..cut];
        let transcript =
            render_transcript(self.state.projection.summary.as_deref(), older, &context);
        let request = Arc::new(ChatRequest {
            messages: vec![
                Message::system(context.summary_instruction.clone()),
                Message::user(transcript),
            ],
            tools: Vec::new(),
            tool_choice: ToolChoice::None,
            max_tokens: self.engine.config.max_output_tokens,
            temperature: None,
        });
        let estimated_input = request.messages.iter().map(|m| estimator.estimate(m)).sum();
        let turn = self
            .model_turn(request, true)
            .await
            .map_err(CompactionError::Summarization)?;
        self.account_usage(&turn, estimated_input);
        let summary = turn.text.trim().to_owned();
        if summary.is_empty() {
            return Err(CompactionError::EmptySummary);
        }
        self.state.projection.summary = Some(summary);
        self.state.projection.view_start = cut;
        self.state.recovery.compactions += 1;
        self.sync_view();
        Ok(CompressionReport {
            summarized_messages: cut - region_start,
            tokens_after: self.view_tokens(),
        })
    }
}
