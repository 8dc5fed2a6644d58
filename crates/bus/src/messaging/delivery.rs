//! What publishing and consuming hand back: publish receipts, typed
//! deliveries with their acknowledgements, and the decoding streams behind them.

use std::pin::Pin;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::{AckKind, Acker};
use futures::{Stream, StreamExt as _};
use mtswarm_proto::v1;
use mtswarm_telemetry::TelemetryError;

use crate::codec::{self, BusMessage};
use crate::connection::Bus;
use crate::error::BusError;
use crate::trace;

/// Boxed stream of typed JetStream deliveries.
pub type DeliveryStream<T> = Pin<Box<dyn Stream<Item = Result<Delivery<T>, BusError>> + Send>>;
/// Boxed stream of typed core-NATS messages.
pub type ReceivedStream<T> = Pin<Box<dyn Stream<Item = Result<Received<T>, BusError>> + Send>>;

/// The stream's acknowledgement of a JetStream publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReceipt {
    /// Stream that stored the message.
    pub stream: String,
    /// Stream sequence of the stored message (of the original, for a duplicate).
    pub sequence: u64,
    /// True when the stream dropped this publish as a duplicate of an
    /// earlier one with the same message id.
    pub duplicate: bool,
}

/// A JetStream publish that was sent but whose acknowledgement has not been
/// awaited yet. Pipelining (send many, then wait for all) is what makes
/// JetStream publishing fast; every pending publish must still be waited on
/// to know it was stored.
#[must_use = "the publish is only known to be stored once `wait` succeeds"]
pub struct PendingPublish {
    pub(super) subject: String,
    pub(super) ack: PublishAckFuture,
    pub(super) bus: Bus,
}

impl PendingPublish {
    /// Waits for the stream's acknowledgement. When no stream stores the
    /// subject (it was deleted), the topology is re-created in the
    /// background so that the caller's retry finds it again.
    pub async fn wait(self) -> Result<PublishReceipt, BusError> {
        let subject = self.subject;
        let ack = match self.ack.await {
            Ok(ack) => ack,
            Err(source) => {
                if source.kind() == async_nats::jetstream::context::PublishErrorKind::StreamNotFound
                {
                    let bus = self.bus;
                    let what = format!("publish to {subject}");
                    tokio::spawn(async move {
                        if let Err(error) = bus.recover_topology(&what).await {
                            tracing::warn!(%error, "re-creating the topology failed");
                        }
                    });
                }
                return Err(BusError::Publish {
                    subject,
                    source: source.into(),
                });
            }
        };
        Ok(PublishReceipt {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }
}

/// Delivery metadata of a JetStream message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// Stream the message is stored in.
    pub stream: String,
    /// Durable consumer that delivered it.
    pub consumer: String,
    /// The message's sequence in the stream (stable across redeliveries).
    pub stream_sequence: u64,
    /// The consumer's delivery count, redeliveries included.
    pub consumer_sequence: u64,
    /// 1 on first delivery, 2 on the first redelivery, ...
    pub delivered: u64,
    /// Messages still pending for the consumer after this one.
    pub pending: u64,
}

/// A typed message from a durable JetStream consumer, to be acknowledged
/// with [`Delivery::ack`] (done), [`Delivery::nak`] (redeliver),
/// [`Delivery::in_progress`] (extend the ack deadline) or [`Delivery::term`]
/// (never redeliver).
pub struct Delivery<T> {
    message: T,
    subject: String,
    headers: HeaderMap,
    info: DeliveryInfo,
    acker: Acker,
    /// The ack subject, for [`Delivery::ack_confirmed`].
    reply: Option<async_nats::Subject>,
    client: async_nats::Client,
}

impl<T> std::fmt::Debug for Delivery<T>
where
    T: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.subject)
            .field("info", &self.info)
            .field("message", &self.message)
            .finish()
    }
}

impl<T> Delivery<T> {
    /// The decoded message.
    pub fn message(&self) -> &T {
        &self.message
    }
    /// Subject the message was published to.
    pub fn subject(&self) -> &str {
        &self.subject
    }
    /// The message's NATS headers (content type, message id, trace context).
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    /// Where the message sits in its stream and how often it was delivered.
    pub fn info(&self) -> &DeliveryInfo {
        &self.info
    }

    /// The publisher's trace context (no valid span when it sent none).
    pub fn trace_context(&self) -> opentelemetry::Context {
        trace::context_from_headers(&self.headers)
    }

    /// Makes the publisher's span the parent of `span` (call before entering it).
    pub fn set_span_parent(&self, span: &tracing::Span) -> Result<bool, TelemetryError> {
        trace::set_parent_from_headers(span, &self.headers)
    }

    async fn ack_kind(&self, kind: AckKind) -> Result<(), BusError> {
        self.acker
            .ack_with(kind)
            .await
            .map_err(|source| BusError::Ack {
                subject: self.subject.clone(),
                source,
            })
    }

    /// Marks the message processed; it will not be delivered again.
    pub async fn ack(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Ack).await
    }

    /// Acknowledges and waits until the server confirms it, so the message is
    /// known not to come back (e.g. before publishing the task's result).
    ///
    /// The confirmation comes back on the connection's shared reply inbox
    /// (one request), not on an inbox subscribed for this one ack.
    pub async fn ack_confirmed(&self) -> Result<(), BusError> {
        let Some(reply) = &self.reply else {
            return self
                .acker
                .double_ack()
                .await
                .map_err(|source| BusError::Ack {
                    subject: self.subject.clone(),
                    source,
                });
        };
        self.client
            .request(reply.clone(), bytes::Bytes::from_static(b"+ACK"))
            .await
            .map(|_| ())
            .map_err(|source| BusError::Ack {
                subject: self.subject.clone(),
                source: source.into(),
            })
    }

    /// Asks for redelivery, after `delay` when given.
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), BusError> {
        self.ack_kind(AckKind::Nak(delay)).await
    }

    /// Resets the ack-wait timer: the message is still being worked on.
    pub async fn in_progress(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Progress).await
    }

    /// Stops redelivery without processing (poison message).
    pub async fn term(&self) -> Result<(), BusError> {
        self.ack_kind(AckKind::Term).await
    }
}

/// A typed message from a core NATS subscription.
#[derive(Debug, Clone)]
pub struct Received<T> {
    /// The decoded message.
    pub message: T,
    /// Subject the message was published to.
    pub subject: String,
    /// The message's NATS headers (content type, trace context).
    pub headers: HeaderMap,
}

impl<T> Received<T> {
    /// The publisher's trace context (no valid span when it sent none).
    pub fn trace_context(&self) -> opentelemetry::Context {
        trace::context_from_headers(&self.headers)
    }

    /// Makes the publisher's span the parent of `span` (call before entering it).
    pub fn set_span_parent(&self, span: &tracing::Span) -> Result<bool, TelemetryError> {
        trace::set_parent_from_headers(span, &self.headers)
    }
}

/// An agent event read back from the events stream.
#[derive(Debug, Clone)]
pub struct ReplayedEvent {
    /// Position in the events stream of the message that carried the event
    /// (the events of one batch share it); resume with `stream_sequence + 1`
    /// after the event that is `last_of_message`.
    pub stream_sequence: u64,
    /// The event is the last (or only) one of its message.
    pub last_of_message: bool,
    /// The decoded event.
    pub event: v1::AgentEvent,
    /// The stored message's NATS headers (content type, trace context).
    pub headers: HeaderMap,
}

pub(super) async fn deliveries<T: BusMessage>(
    consumer: &PullConsumer,
    stream: &'static str,
    name: &str,
    batch: usize,
) -> Result<DeliveryStream<T>, BusError> {
    let messages = consumer
        .stream()
        .max_messages_per_batch(batch.max(1))
        .heartbeat(Duration::from_secs(5))
        .expires(Duration::from_secs(30))
        .messages()
        .await
        .map_err(|e| consumer_error(stream, name, e))?;
    let name: std::sync::Arc<str> = std::sync::Arc::from(name);
    let typed = messages.then(move |item| {
        let name = name.clone();
        async move {
            let message = item.map_err(|e| consumer_error(stream, &name, e))?;
            into_delivery::<T>(message).await
        }
    });
    Ok(Box::pin(typed))
}

async fn into_delivery<T: BusMessage>(
    message: async_nats::jetstream::Message,
) -> Result<Delivery<T>, BusError> {
    let info = message.info().map(|info| DeliveryInfo {
        stream: info.stream.to_string(),
        consumer: info.consumer.to_string(),
        stream_sequence: info.stream_sequence,
        consumer_sequence: info.consumer_sequence,
        delivered: u64::try_from(info.delivered).unwrap_or(0),
        pending: info.pending,
    });
    let client = message.context.client();
    let reply = message.reply.clone();
    let (message, acker) = message.split();
    let subject = message.subject.to_string();
    let info = match info {
        Ok(info) => info,
        Err(source) => {
            return Err(BusError::Ack { subject, source });
        }
    };
    let headers = message.headers.unwrap_or_default();
    match codec::decode::<T>(&subject, Some(&headers), &message.payload) {
        Ok(decoded) => Ok(Delivery {
            message: decoded,
            subject,
            headers,
            info,
            acker,
            reply,
            client,
        }),
        Err(error) => {
            // A payload that cannot be decoded now never will be: stop redelivery.
            if let Err(term_error) = acker.ack_with(AckKind::Term).await {
                tracing::warn!(%subject, error = %term_error, "could not terminate undecodable message");
            }
            Err(error)
        }
    }
}

pub(super) fn received_stream<T: BusMessage>(
    subscriber: async_nats::Subscriber,
) -> ReceivedStream<T> {
    Box::pin(subscriber.map(|message| {
        let subject = message.subject.to_string();
        let headers = message.headers.unwrap_or_default();
        let decoded = codec::decode::<T>(&subject, Some(&headers), &message.payload)?;
        Ok(Received {
            message: decoded,
            subject,
            headers,
        })
    }))
}

/// Headers every outgoing message carries: content type and trace context.
pub(super) fn outgoing_headers<T: BusMessage>() -> HeaderMap {
    let mut headers = HeaderMap::new();
    codec::set_content_type::<T>(&mut headers);
    trace::inject_current(&mut headers);
    headers
}

pub(super) fn consumer_error(
    stream: &str,
    consumer: &str,
    source: impl Into<crate::error::NatsSource>,
) -> BusError {
    BusError::Consumer {
        stream: stream.to_string(),
        consumer: consumer.to_string(),
        source: source.into(),
    }
}
