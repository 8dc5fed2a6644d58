//! Tasks and results through JetStream: stored, acknowledged, and
//! deduplicated by `<task_id>.<attempt>`.

use async_nats::jetstream::message::PublishMessage;
use mtswarm_proto::v1;

use super::delivery::{PendingPublish, PublishReceipt, outgoing_headers};
use crate::codec::{self, BusMessage};
use crate::connection::Bus;
use crate::error::BusError;
use crate::subjects;

fn require_attempt(attempt: u32) -> Result<(), BusError> {
    if attempt == 0 {
        return Err(BusError::InvalidId {
            kind: "attempt",
            value: "0".into(),
            reason: "attempts start at 1",
        });
    }
    Ok(())
}

impl Bus {
    async fn publish_jetstream<T: BusMessage>(
        &self,
        subject: String,
        message_id: String,
        message: &T,
    ) -> Result<PendingPublish, BusError> {
        let mut headers = outgoing_headers::<T>();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message_id.as_str());
        let payload = codec::encode(message);
        self.check_record_size(
            || format!("{} on {subject}", T::TYPE_NAME),
            payload.len(),
            crate::limits::header_bytes(&headers),
        )?;
        let publish = PublishMessage::build().payload(payload).headers(headers);
        let ack = self
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|source| BusError::Publish {
                subject: subject.clone(),
                source: source.into(),
            })?;
        Ok(PendingPublish {
            subject,
            ack,
            bus: self.clone(),
        })
    }

    /// Sends `task` to `mtswarm.task.<worker_id>.<slice_id>` without waiting
    /// for the stream's acknowledgement (see [`PendingPublish`]).
    pub async fn publish_task_pipelined(
        &self,
        task: &v1::TaskAssignment,
    ) -> Result<PendingPublish, BusError> {
        subjects::validate_id("task id", &task.task_id)?;
        subjects::validate_id("job id", &task.job_id)?;
        require_attempt(task.attempt)?;
        let subject = subjects::task(&task.worker_id, &task.slice_id)?;
        let message_id = subjects::message_id(&task.task_id, task.attempt);
        self.publish_jetstream(subject, message_id, task).await
    }

    /// Stores `task` in the tasks stream and waits for the acknowledgement.
    /// A second publish of the same task id and attempt (within the duplicate
    /// window) is dropped by the stream: the receipt says `duplicate: true`.
    pub async fn publish_task(
        &self,
        task: &v1::TaskAssignment,
    ) -> Result<PublishReceipt, BusError> {
        self.publish_task_pipelined(task).await?.wait().await
    }

    /// Sends `result` to `mtswarm.result.<job_id>` without waiting for the ack.
    pub async fn publish_result_pipelined(
        &self,
        result: &v1::TaskResult,
    ) -> Result<PendingPublish, BusError> {
        subjects::validate_id("task id", &result.task_id)?;
        require_attempt(result.attempt)?;
        let subject = subjects::result(&result.job_id)?;
        let message_id = subjects::result_message_id(result);
        self.publish_jetstream(subject, message_id, result).await
    }

    /// Stores `result` in the results stream (deduplicated by task id and
    /// attempt) and waits for the acknowledgement.
    pub async fn publish_result(
        &self,
        result: &v1::TaskResult,
    ) -> Result<PublishReceipt, BusError> {
        self.publish_result_pipelined(result).await?.wait().await
    }
}
