//! Waiting until the server has sourced a job's worker events into the
//! journal, so the job's final state change is stored after them.
//!
//! `WatchJob` ends at the final state change. The workers' events reach the
//! journal through the server's sourcing, which runs behind the events
//! stream by a moment (longer while a stream elects a leader or right after
//! the journal was created), so a final state appended at once could
//! overtake a job's last events, and a watcher would never see them.
//!
//! The barrier: the leader publishes a mark (an event of the leader agent
//! carrying a fresh random nonce) on the job's event subject, then reads
//! the journal's sourced entries of the job from where the journal stood
//! until the mark arrives. Sourcing keeps the events stream's order, so
//! everything published before the mark is in the journal by then. A copy
//! of the mark a worker could publish after reading it from the events
//! stream is stored after the real one, so it cannot end the wait early;
//! the watch drops leader-agent events of sourced entries, so the mark is
//! never shown.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use futures::StreamExt as _;
use mtswarm_bus::codec::decode_agent_events;
use mtswarm_bus::v1;

use super::{JOB_EVENTS_STREAM, Journal, read_entries, sourced_events_subject};
use crate::error::JournalError;
use crate::ids::{LEADER_AGENT_ID, leader_session_id};

/// How long the final state change waits for the job's events to be
/// sourced: a few stream leader elections. Past it the state is appended
/// anyway (a watcher may then miss the job's last events).
pub(crate) const SETTLE_PATIENCE: Duration = Duration::from_secs(15);

impl Journal {
    /// Returns once every worker event of `job_id` published before the
    /// call is in the journal (see the module doc), or an error when that
    /// could not be seen within [`SETTLE_PATIENCE`].
    pub async fn settle(&self, job_id: &str) -> Result<(), JournalError> {
        match tokio::time::timeout(SETTLE_PATIENCE, self.settle_unbounded(job_id)).await {
            Ok(settled) => settled,
            Err(_) => Err(JournalError::NotSettled {
                job_id: job_id.to_string(),
                waited: SETTLE_PATIENCE,
            }),
        }
    }

    async fn settle_unbounded(&self, job_id: &str) -> Result<(), JournalError> {
        let filter_subject = sourced_events_subject(job_id)?;
        let stood_at = self
            .bus
            .jetstream()
            .get_stream(JOB_EVENTS_STREAM)
            .await
            .map_err(|e| JournalError::OpenStream {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?
            .cached_info()
            .state
            .last_sequence;
        let mark = mark(job_id);
        self.bus.publish_event(&mark).await?;
        let mut entries = read_entries(
            &self.bus,
            vec![filter_subject.clone()],
            DeliverPolicy::ByStartSequence {
                start_sequence: stood_at + 1,
            },
        )
        .await?;
        while let Some(entry) = entries.next().await {
            let entry = entry.map_err(|e| JournalError::Read {
                stream: JOB_EVENTS_STREAM,
                source: Box::new(e),
            })?;
            // An entry that does not decode is some worker's, not the mark;
            // the watch logs it when it reads it.
            let events =
                decode_agent_events(&filter_subject, entry.headers.as_ref(), &entry.payload)
                    .unwrap_or_default();
            if events.contains(&mark) {
                return Ok(());
            }
        }
        Err(JournalError::NotSettled {
            job_id: job_id.to_string(),
            waited: SETTLE_PATIENCE,
        })
    }
}

/// The mark of one wait: a leader-agent event with a nonce no one can
/// guess before it is published.
fn mark(job_id: &str) -> v1::AgentEvent {
    v1::AgentEvent {
        job_id: job_id.to_string(),
        agent_id: LEADER_AGENT_ID.to_string(),
        session_id: leader_session_id(job_id),
        sequence: 0,
        step: 0,
        kind: v1::AgentEventKind::Log as i32,
        payload_json: serde_json::json!({
            "type": "journal_mark",
            "nonce": uuid::Uuid::new_v4().simple().to_string(),
        })
        .to_string(),
        timestamp: None,
    }
}
