//! The durable store over the measurements stream: publish a record once,
//! scan the narrowest subject filter for a query.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{self, DeliverPolicy, pull};
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt as _;

use super::RESULT_RECORD_CONTENT_TYPE;
use super::query::ResultQuery;
use super::record::ResultRecord;
use crate::connection::Bus;
use crate::error::BusError;
use crate::messaging::PublishReceipt;
use crate::subjects;
use crate::topology::measurements_stream_config;
use crate::trace;

/// A scan that receives nothing for this long while records are still
/// pending fails instead of hanging.
const SCAN_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Header carrying the producer's signature over a record's payload
/// (hex), set when the store has a [`RecordSigner`].
pub const RECORD_SIGNATURE_HEADER: &str = "Mtswarm-Record-Signature";

/// Signs the stored bytes of each record a process writes: the worker's
/// record key (`mtswarm_auth::WorkerKey`), so the leader can tell which
/// worker produced a measurement.
pub trait RecordSigner: Send + Sync + std::fmt::Debug {
    /// The signature of `payload` (the record's JSON as stored); `None`
    /// leaves the record unsigned.
    fn sign(&self, record_id: &str, payload: &[u8]) -> Option<Vec<u8>>;
}

/// A stored record with the exact bytes it was stored as and the
/// producer's signature over them, if it carries one.
#[derive(Debug, Clone)]
pub struct SignedRecord {
    /// The record.
    pub record: ResultRecord,
    /// Its payload as stored (what the signature covers).
    pub payload: bytes::Bytes,
    /// The signature of [`RECORD_SIGNATURE_HEADER`], decoded.
    pub signature: Option<Vec<u8>>,
}

/// Durable store of measured candidates over the measurements stream.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct ResultsStore {
    bus: Bus,
    signer: Option<std::sync::Arc<dyn RecordSigner>>,
}

fn scan_error(source: impl Into<crate::error::NatsSource>) -> BusError {
    BusError::Consumer {
        stream: subjects::MEASUREMENTS_STREAM.to_string(),
        consumer: "ordered scan".to_string(),
        source: source.into(),
    }
}

impl ResultsStore {
    /// Opens the store, creating the measurements stream when
    /// [`Bus::ensure_topology`] has not run yet, shaped as the topology
    /// ensured or adopted through `bus` says (else the default one).
    pub async fn open(bus: &Bus) -> Result<ResultsStore, BusError> {
        let topology = bus.topology_in_use();
        bus.jetstream()
            .get_or_create_stream(measurements_stream_config(&topology))
            .await
            .map_err(|source| {
                bus.creation_error(
                    format!("stream {}", subjects::MEASUREMENTS_STREAM),
                    &topology,
                    source,
                )
            })?;
        Ok(ResultsStore {
            bus: bus.clone(),
            signer: None,
        })
    }

    /// Signs every record this store writes with `signer`.
    pub fn with_signer(mut self, signer: std::sync::Arc<dyn RecordSigner>) -> Self {
        self.signer = Some(signer);
        self
    }

    /// Stores `record` and returns its stream sequence (that of the first
    /// copy when the record id was stored before, within the duplicate window).
    pub async fn record(&self, record: &ResultRecord) -> Result<u64, BusError> {
        Ok(self.record_with_receipt(record).await?.sequence)
    }

    /// Like [`ResultsStore::record`], also telling whether the stream dropped
    /// the publish as a duplicate.
    pub async fn record_with_receipt(
        &self,
        record: &ResultRecord,
    ) -> Result<PublishReceipt, BusError> {
        record.validate()?;
        let subject = record.subject()?;
        let payload = serde_json::to_vec(record).map_err(|source| BusError::Publish {
            subject: subject.clone(),
            source: source.into(),
        })?;
        let mut headers = HeaderMap::new();
        headers.insert(
            crate::codec::CONTENT_TYPE_HEADER,
            RESULT_RECORD_CONTENT_TYPE,
        );
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            record.record_id.as_str(),
        );
        if let Some(signature) = self
            .signer
            .as_ref()
            .and_then(|signer| signer.sign(&record.record_id, &payload))
        {
            headers.insert(
                RECORD_SIGNATURE_HEADER,
                super::hex::encode(&signature).as_str(),
            );
        }
        trace::inject_current(&mut headers);
        let header_bytes = crate::limits::header_bytes(&headers);
        let what = || format!("result record {} on {subject}", record.record_id);
        self.bus
            .check_record_size(what, payload.len(), header_bytes)?;
        // The stream's own cap on one message (its `max_msg_size`).
        let stream_cap = self.bus.topology_in_use().measurement_max_record_bytes;
        if let Ok(cap) = usize::try_from(stream_cap)
            && cap > 0
        {
            crate::limits::check_size(
                what,
                payload.len() + header_bytes,
                cap,
                "the measurements stream's max message size",
            )?;
        }
        let publish = PublishMessage::build()
            .payload(payload.into())
            .headers(headers);
        let publish_error = |source: crate::error::NatsSource| BusError::Publish {
            subject: subject.clone(),
            source,
        };
        let ack = self
            .bus
            .jetstream()
            .send_publish(subject.clone(), publish)
            .await
            .map_err(|e| publish_error(e.into()))?
            .await
            .map_err(|e| publish_error(e.into()))?;
        Ok(PublishReceipt {
            stream: ack.stream,
            sequence: ack.sequence,
            duplicate: ack.duplicate,
        })
    }

    /// Records matching `query` in stream (storage) order; when more than
    /// `query.limit` match, the most recently stored `limit` of them. The
    /// scan reads every record under the query's subject filter, so narrow
    /// queries (job, kernel, slice) are the cheap ones.
    pub async fn query(&self, query: &ResultQuery) -> Result<Vec<ResultRecord>, BusError> {
        query.check()?;
        let mut kept: VecDeque<ResultRecord> = VecDeque::with_capacity(query.limit.min(1024));
        self.scan(query, |record, _| {
            if kept.len() == query.limit {
                kept.pop_front();
            }
            kept.push_back(record);
        })
        .await?;
        Ok(kept.into())
    }

    /// [`ResultsStore::query`] with each record's stored bytes and its
    /// producer's signature, for a reader that checks who produced it.
    pub async fn query_signed(&self, query: &ResultQuery) -> Result<Vec<SignedRecord>, BusError> {
        query.check()?;
        let mut kept: VecDeque<SignedRecord> = VecDeque::with_capacity(query.limit.min(1024));
        self.scan(query, |record, message| {
            if kept.len() == query.limit {
                kept.pop_front();
            }
            let signature = message
                .headers
                .as_ref()
                .and_then(|h| h.get(RECORD_SIGNATURE_HEADER))
                .and_then(|v| super::hex::decode(v.as_str()));
            kept.push_back(SignedRecord {
                record,
                payload: message.payload.clone(),
                signature,
            });
        })
        .await?;
        Ok(kept.into())
    }

    /// The `n` best trustworthy records of `kernel` (valid, unflagged, with a
    /// GFLOPS figure), highest GFLOPS first, over every job.
    pub async fn best_for_kernel(
        &self,
        kernel: &str,
        n: usize,
    ) -> Result<Vec<ResultRecord>, BusError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let query = ResultQuery {
            kernel: Some(kernel.to_string()),
            valid_only: true,
            limit: n,
            ..Default::default()
        };
        query.check()?;
        let mut best: Vec<ResultRecord> = Vec::new();
        self.scan(&query, |record, _| {
            if !record.trustworthy() {
                return;
            }
            best.push(record);
            // Trim in batches: memory stays within 2n, sorting amortized.
            if best.len() >= 2 * n.max(1) {
                best.sort_by(by_gflops_desc);
                best.truncate(n);
            }
        })
        .await?;
        best.sort_by(by_gflops_desc);
        best.truncate(n);
        Ok(best)
    }

    /// Feeds every record matching `query` to `visit`, in stream order.
    /// Records that do not decode are logged and skipped: one bad record
    /// must not hide the rest of the history.
    async fn scan(
        &self,
        query: &ResultQuery,
        mut visit: impl FnMut(ResultRecord, &async_nats::jetstream::Message),
    ) -> Result<(), BusError> {
        let stream = self
            .bus
            .jetstream()
            .get_stream_no_info(subjects::MEASUREMENTS_STREAM)
            .await
            .map_err(scan_error)?;
        let consumer: consumer::Consumer<pull::OrderedConfig> = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: query.filter_subject(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(scan_error)?;
        if consumer.cached_info().num_pending == 0 {
            return Ok(());
        }
        let mut messages = consumer.messages().await.map_err(scan_error)?;
        loop {
            let next = tokio::time::timeout(SCAN_IDLE_TIMEOUT, messages.next())
                .await
                .map_err(|_| {
                    scan_error(format!(
                        "no record arrived for {SCAN_IDLE_TIMEOUT:?} while the scan was incomplete"
                    ))
                })?;
            let Some(message) = next else {
                return Ok(());
            };
            let message = message.map_err(scan_error)?;
            let pending = message.info().map(|info| info.pending).unwrap_or(0);
            match decode_record(&message.subject, message.headers.as_ref(), &message.payload) {
                Ok(record) if query.matches(&record) => visit(record, &message),
                Ok(_) => {}
                Err(reason) => {
                    tracing::warn!(subject = %message.subject, %reason, "skipping undecodable result record")
                }
            }
            if pending == 0 {
                return Ok(());
            }
        }
    }
}

fn by_gflops_desc(a: &ResultRecord, b: &ResultRecord) -> std::cmp::Ordering {
    let figure = |r: &ResultRecord| r.gflops.unwrap_or(f64::NEG_INFINITY);
    figure(b).total_cmp(&figure(a))
}

/// Why a message on the measurements stream is not a result record.
#[derive(Debug, thiserror::Error)]
pub enum UndecodableRecord {
    /// Its content-type header names another type.
    #[error("content type {found:?} on {subject}, expected {RESULT_RECORD_CONTENT_TYPE:?}")]
    ContentType {
        /// The content type the message carries.
        found: String,
        /// Where it was stored.
        subject: String,
    },
    /// Its payload is not a record's JSON. The parser's message quotes a
    /// mistyped string whole; what is logged is its start.
    #[error("not a result record: {}", first_chars(&.0.to_string(), 300))]
    Json(#[from] serde_json::Error),
}

/// The first `max` characters of `text`, and `...` when it had more.
fn first_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Reads a message of the measurements stream as the store's readers do:
/// its content type, then the record's JSON.
pub fn decode_record(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<ResultRecord, UndecodableRecord> {
    if let Some(found) = headers.and_then(|h| h.get(crate::codec::CONTENT_TYPE_HEADER))
        && found.as_str() != RESULT_RECORD_CONTENT_TYPE
    {
        return Err(UndecodableRecord::ContentType {
            found: found.as_str().to_string(),
            subject: subject.to_string(),
        });
    }
    Ok(serde_json::from_slice(payload)?)
}
