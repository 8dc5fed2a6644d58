//! Typed publish and consume over NATS: tasks and results through JetStream
//! (durable, acked, deduplicated by `<task_id>.<attempt>`), events and
//! approval notifications through core NATS. Every outgoing message carries a
//! content-type header and the current span's trace context; every incoming
//! one is decoded into its protobuf type, and a payload that does not decode
//! is reported as an error item (and, for JetStream, terminated so it is not
//! redelivered forever) instead of stopping the stream.

mod consumers;
mod core_nats;
mod delivery;
mod jetstream;

pub use consumers::{ResultConsumer, ResultConsumerConfig, TaskConsumer, TaskConsumerConfig};
pub use delivery::{
    Delivery, DeliveryInfo, DeliveryStream, PendingPublish, PublishReceipt, Received,
    ReceivedStream, ReplayedEvent,
};
