//! One append to the journal until the stream acknowledged it: sends that
//! fail and acknowledgements that do not come are retried under the same
//! `Nats-Msg-Id` (the stream drops a duplicate), within `APPEND_PATIENCE`.

use std::time::Duration;

use mtswarm_bus::{Backoff, Bus};

use super::APPEND_PATIENCE;
use crate::error::JournalError;

/// An event sent to the journal whose acknowledgement is still due.
pub(super) struct PendingAppend {
    bus: Bus,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
    /// The acknowledgement of the latest send, once it went out.
    ack: Option<async_nats::jetstream::context::PublishAckFuture>,
    give_up: tokio::time::Instant,
    backoff: Backoff,
    attempts: u32,
}

impl PendingAppend {
    /// An append of `payload` to `subject` not sent yet ([`Self::confirm`]
    /// sends it).
    pub(super) fn new(
        bus: Bus,
        subject: String,
        headers: async_nats::HeaderMap,
        payload: bytes::Bytes,
    ) -> Self {
        Self {
            bus,
            subject,
            headers,
            payload,
            ack: None,
            give_up: tokio::time::Instant::now() + APPEND_PATIENCE,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(2)),
            attempts: 0,
        }
    }

    /// Sends the event, retrying a send that fails (the client refuses while
    /// its outbound buffer is full or it is closed) until the patience ran out.
    async fn send(&mut self) -> Result<(), JournalError> {
        loop {
            self.attempts += 1;
            let sent = self
                .bus
                .jetstream()
                .publish_with_headers(
                    self.subject.clone(),
                    self.headers.clone(),
                    self.payload.clone(),
                )
                .await;
            match sent {
                Ok(ack) => {
                    self.ack = Some(ack);
                    return Ok(());
                }
                Err(error) => {
                    let error = JournalError::Publish {
                        subject: self.subject.clone(),
                        source: Box::new(error),
                    };
                    self.wait_or_give_up(error).await?;
                }
            }
        }
    }

    /// Waits before the next send, or returns `error` when the patience ran out.
    async fn wait_or_give_up(&mut self, error: JournalError) -> Result<(), JournalError> {
        let delay = self.backoff.next_delay();
        if tokio::time::Instant::now() + delay >= self.give_up {
            return Err(error);
        }
        tracing::debug!(%error, attempt = self.attempts, "journal append not stored yet; sending it again");
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// Waits until the stream stored the event (sending it again, same
    /// message id, while it is not acknowledged); returns its sequence.
    pub(super) async fn confirm(mut self) -> Result<u64, JournalError> {
        loop {
            let Some(ack) = self.ack.take() else {
                self.send().await?;
                continue;
            };
            match ack.await {
                Ok(ack) => {
                    if self.attempts > 1 {
                        tracing::info!(subject = %self.subject, attempts = self.attempts, duplicate = ack.duplicate, "journal append stored after a retry");
                    }
                    return Ok(ack.sequence);
                }
                Err(error) => {
                    let error = JournalError::NotAcknowledged {
                        subject: self.subject.clone(),
                        source: Box::new(error),
                    };
                    self.wait_or_give_up(error).await?;
                    self.send().await?;
                }
            }
        }
    }
}
