//! Protobuf encoding of bus messages with a content-type header, so a
//! receiver can tell a wrong message type from a corrupt one and never has to
//! guess. Decoding never panics: bad payloads become [`BusError::Decode`].

use async_nats::HeaderMap;
use bytes::Bytes;
use mtswarm_proto::v1;

use crate::BusError;

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
    ApprovalRequest,
    ApprovalDecision,
    ApprovalRecord,
    SliceLease,
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
