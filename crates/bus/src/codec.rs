//! Protobuf encoding of bus messages with a content-type header, so a
//! receiver can tell a wrong message type from a corrupt one and never has to
//! guess. Decoding never panics: bad payloads become [`BusError::Decode`].

use async_nats::HeaderMap;
use bytes::Bytes;
use mtswarm_proto::v1;

use crate::error::BusError;

/// Header naming the payload's encoding and protobuf type.
pub const CONTENT_TYPE_HEADER: &str = "Content-Type";
/// Media type of every mtswarm bus payload.
pub const PROTOBUF_MEDIA_TYPE: &str = "application/x-protobuf";

/// A protobuf message that travels on the bus or is stored in KV.
pub trait BusMessage: prost::Message + Default + Send + Sync + 'static {
    /// Fully-qualified protobuf name, e.g. `mtswarm.v1.TaskAssignment`.
    const TYPE_NAME: &'static str;
    /// `application/x-protobuf; proto=<TYPE_NAME>`, the content-type header value.
    const CONTENT_TYPE: &'static str;
}

macro_rules! bus_messages {
    ($($name:ident),* $(,)?) => {
        $(impl BusMessage for v1::$name {
            const TYPE_NAME: &'static str = concat!("mtswarm.v1.", stringify!($name));
            const CONTENT_TYPE: &'static str =
                concat!("application/x-protobuf; proto=mtswarm.v1.", stringify!($name));
        })*
    };
}

bus_messages!(
    TaskAssignment,
    TaskResult,
    AgentEvent,
    AgentEventBatch,
    ApprovalRequest,
    ApprovalDecision,
    ApprovalRecord,
    SliceLease,
    DaemonLease,
    JobOwner,
    SliceQuarantine,
    WorkerRecord,
    SessionCheckpoint,
    JobRecord,
    AgentPlacement,
    TaskRecord,
    LeaderCheckpoint,
);

/// Encodes `message` as protobuf bytes.
pub fn encode<T: BusMessage>(message: &T) -> Bytes {
    Bytes::from(message.encode_to_vec())
}

/// Adds the content-type header for `T`.
pub fn set_content_type<T: BusMessage>(headers: &mut HeaderMap) {
    headers.insert(CONTENT_TYPE_HEADER, T::CONTENT_TYPE);
}

/// Decodes a payload received on `subject`. When `headers` carry a content
/// type it must name `T`; a payload without one (e.g. a KV value) is decoded
/// as `T` directly.
pub fn decode<T: BusMessage>(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<T, BusError> {
    if let Some(found) = headers.and_then(|h| h.get(CONTENT_TYPE_HEADER))
        && found.as_str() != T::CONTENT_TYPE
    {
        return Err(BusError::ContentType {
            subject: subject.to_string(),
            expected: T::CONTENT_TYPE.to_string(),
            found: found.as_str().to_string(),
        });
    }
    T::decode(payload).map_err(|source| BusError::Decode {
        subject: subject.to_string(),
        type_name: T::TYPE_NAME,
        source,
    })
}

/// Most events one message on an agent's event subject carries: a
/// publisher cuts longer runs into several messages, and a reader may drop
/// what a message carries beyond it (the job journal numbers an event by
/// its message and its place in it, `crates/leader/src/journal/watch.rs`).
pub const MAX_EVENTS_PER_MESSAGE: usize = 1000;

/// Decodes what was published on an agent's event subject: one
/// `AgentEvent`, or an `AgentEventBatch` of several (unpacked in order).
/// Every reader of agent events goes through here, so a batch is never
/// mistaken for a corrupt event. A payload without a content type is read
/// as one `AgentEvent`.
pub fn decode_agent_events(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Vec<v1::AgentEvent>, BusError> {
    let batch = headers
        .and_then(|h| h.get(CONTENT_TYPE_HEADER))
        .is_some_and(|found| found.as_str() == v1::AgentEventBatch::CONTENT_TYPE);
    if batch {
        return decode::<v1::AgentEventBatch>(subject, headers, payload).map(|batch| batch.events);
    }
    decode::<v1::AgentEvent>(subject, headers, payload).map(|event| vec![event])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_content_type() {
        let task = v1::TaskAssignment {
            task_id: "t1".into(),
            attempt: 2,
            ..Default::default()
        };
        let mut headers = HeaderMap::new();
        set_content_type::<v1::TaskAssignment>(&mut headers);
        let decoded: v1::TaskAssignment =
            decode("s", Some(&headers), &encode(&task)).expect("decodes");
        assert_eq!(decoded, task);
        assert_eq!(
            headers.get(CONTENT_TYPE_HEADER).map(|v| v.as_str()),
            Some("application/x-protobuf; proto=mtswarm.v1.TaskAssignment")
        );
    }

    #[test]
    fn agent_events_decode_single_and_batched() {
        let event = |sequence| v1::AgentEvent {
            job_id: "j1".into(),
            agent_id: "a1".into(),
            session_id: "s1".into(),
            sequence,
            ..Default::default()
        };
        let mut single = HeaderMap::new();
        set_content_type::<v1::AgentEvent>(&mut single);
        let decoded = decode_agent_events("s", Some(&single), &encode(&event(4))).expect("single");
        assert_eq!(decoded, vec![event(4)]);
        let decoded = decode_agent_events("s", None, &encode(&event(5))).expect("no header");
        assert_eq!(decoded, vec![event(5)]);

        let mut batched = HeaderMap::new();
        set_content_type::<v1::AgentEventBatch>(&mut batched);
        let batch = v1::AgentEventBatch {
            events: vec![event(6), event(7), event(8)],
        };
        let decoded = decode_agent_events("s", Some(&batched), &encode(&batch)).expect("batch");
        assert_eq!(
            decoded.iter().map(|e| e.sequence).collect::<Vec<_>>(),
            vec![6, 7, 8]
        );

        let mut other = HeaderMap::new();
        set_content_type::<v1::TaskResult>(&mut other);
        let error = decode_agent_events("s", Some(&other), &[]).expect_err("wrong type");
        assert!(matches!(error, BusError::ContentType { .. }), "{error}");
        let garbage = [0xff_u8; 11];
        let error = decode_agent_events("s", Some(&batched), &garbage).expect_err("garbage");
        assert!(
            matches!(
                error,
                BusError::Decode {
                    type_name: "mtswarm.v1.AgentEventBatch",
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn content_type_names_the_media_type_and_message() {
        assert_eq!(
            v1::JobRecord::CONTENT_TYPE,
            format!("{PROTOBUF_MEDIA_TYPE}; proto={}", v1::JobRecord::TYPE_NAME)
        );
    }

    #[test]
    fn wrong_type_and_garbage_are_errors_not_panics() {
        let mut headers = HeaderMap::new();
        set_content_type::<v1::TaskResult>(&mut headers);
        let error = decode::<v1::TaskAssignment>("s", Some(&headers), &[]).expect_err("type");
        assert!(matches!(error, BusError::ContentType { .. }), "{error}");

        let garbage = [
            0xff_u8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        let error = decode::<v1::TaskAssignment>("s", None, &garbage).expect_err("garbage");
        assert!(
            matches!(
                error,
                BusError::Decode {
                    type_name: "mtswarm.v1.TaskAssignment",
                    ..
                }
            ),
            "{error}"
        );
    }
}
