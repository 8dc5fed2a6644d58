//! Record/replay of model conversations.
//!
//! [`RecordingModel`] wraps any [`ChatModel`] and appends each exchange
//! (request plus the events or error it produced) as one JSON line to a
//! cassette file. [`ReplayModel`] plays such a file back, so a session that
//! once ran against a real endpoint can be re-run offline and deterministically.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use mtswarm_core::model::{ChatModel, ChatRequest, ModelError, ModelEvent, ModelStream};
use serde::{Deserialize, Serialize};

/// One recorded turn: what was asked and what came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// Position of the request among all requests made through the recorder
    /// (lines are written when a turn ends, which for concurrent turns may
    /// differ from the order they started in).
    pub seq: u64,
    /// The wrapped model's name.
    pub model: String,
    /// The request as the engine sent it.
    pub request: ChatRequest,
    /// What the wrapped model answered.
    pub outcome: Outcome,
}

/// How a recorded turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// `stream()` itself failed; no events were produced.
    Rejected {
        /// The error `stream()` returned.
        error: ModelError,
    },
    /// The stream started. `error` is the `Err` item that ended it, if any;
    /// `complete` is false when the consumer dropped the stream before its end.
    Streamed {
        /// Every event the stream yielded, in order.
        events: Vec<ModelEvent>,
        /// The error item that ended the stream; `None` when none did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ModelError>,
        /// The stream ran to its end (not dropped early by the consumer).
        complete: bool,
    },
}

/// Problems reading or writing a cassette file.
#[derive(Debug, thiserror::Error)]
pub enum CassetteError {
    /// The cassette file could not be opened (or created, for recording).
    #[error("cannot open cassette {path}: {source}")]
    Open {
        /// The cassette file.
        path: PathBuf,
        /// Why opening failed.
        source: std::io::Error,
    },
    /// Reading the cassette file failed part-way.
    #[error("cannot read cassette {path}: {source}")]
    Read {
        /// The cassette file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// A line of the cassette is not an [`Exchange`].
    #[error(
        "cassette {path} line {line} is not a recorded exchange: {}",
        crate::openai::truncate(&.source.to_string(), 300)
    )]
    Parse {
        /// The cassette file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// The JSON parser's error.
        source: serde_json::Error,
    },
}

/// Why an exchange could not be added to the cassette; the recorder hands
/// it to the engine as a [`ModelError::Other`].
#[derive(Debug, thiserror::Error)]
enum AppendError {
    /// The exchange does not encode as JSON.
    #[error("cannot encode exchange {seq}: {source}")]
    Encode {
        /// The exchange's sequence number.
        seq: u64,
        /// The encoder's error.
        source: serde_json::Error,
    },
    /// Writing the line failed.
    #[error("cannot append to cassette {}: {source}", path.display())]
    Write {
        /// The cassette file.
        path: PathBuf,
        /// Why writing failed.
        source: std::io::Error,
    },
}

impl From<AppendError> for ModelError {
    fn from(error: AppendError) -> Self {
        ModelError::Other(error.to_string())
    }
}

/// Appends exchange lines to a file; shared by all streams of one recorder.
#[derive(Debug)]
struct CassetteWriter {
    path: PathBuf,
    file: Mutex<File>,
}

impl CassetteWriter {
    fn append(&self, exchange: &Exchange) -> Result<(), AppendError> {
        let mut line = serde_json::to_vec(exchange).map_err(|source| AppendError::Encode {
            seq: exchange.seq,
            source,
        })?;
        line.push(b'\n');
        // A poisoned lock only means another writer panicked mid-call; the
        // file handle itself is still usable.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|source| AppendError::Write {
                path: self.path.clone(),
                source,
            })
    }
}

/// A [`ChatModel`] that forwards to `inner` and records every exchange.
pub struct RecordingModel<M> {
    inner: M,
    writer: Arc<CassetteWriter>,
    next_seq: AtomicU64,
}

impl<M: ChatModel> RecordingModel<M> {
    /// Records to `path`, appending if it already exists.
    pub fn new(inner: M, path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| CassetteError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            inner,
            writer: Arc::new(CassetteWriter {
                path,
                file: Mutex::new(file),
            }),
            next_seq: AtomicU64::new(0),
        })
    }

    /// The wrapped model.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The cassette file being written.
    pub fn path(&self) -> &Path {
        &self.writer.path
    }
}

/// Collects what a stream produced and writes it once, when the stream ends
/// or, failing that, when it is dropped.
struct PendingExchange {
    writer: Arc<CassetteWriter>,
    exchange: Option<Exchange>,
}

impl PendingExchange {
    fn push(&mut self, event: &ModelEvent) {
        if let Some(Exchange {
            outcome: Outcome::Streamed { events, .. },
            ..
        }) = &mut self.exchange
        {
            events.push(event.clone());
        }
    }

    fn finish(&mut self, error: Option<ModelError>) -> Result<(), AppendError> {
        let Some(mut exchange) = self.exchange.take() else {
            return Ok(());
        };
        if let Outcome::Streamed {
            error: slot,
            complete,
            ..
        } = &mut exchange.outcome
        {
            *slot = error;
            *complete = true;
        }
        self.writer.append(&exchange)
    }
}

impl Drop for PendingExchange {
    fn drop(&mut self) {
        if let Some(exchange) = self.exchange.take()
            && let Err(problem) = self.writer.append(&exchange)
        {
            tracing::error!(seq = exchange.seq, "{problem}");
        }
    }
}

#[async_trait]
impl<M: ChatModel> ChatModel for RecordingModel<M> {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    fn context_window(&self) -> Option<u64> {
        self.inner.context_window()
    }

    fn reads_whole_conversation(&self) -> bool {
        self.inner.reads_whole_conversation()
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let model = self.inner.model_name().to_string();
        match self.inner.stream(request.clone()).await {
            Err(error) => {
                let exchange = Exchange {
                    seq,
                    model,
                    request,
                    outcome: Outcome::Rejected {
                        error: error.clone(),
                    },
                };
                self.writer.append(&exchange)?;
                Err(error)
            }
            Ok(mut inner_stream) => {
                let mut pending = PendingExchange {
                    writer: Arc::clone(&self.writer),
                    exchange: Some(Exchange {
                        seq,
                        model,
                        request,
                        outcome: Outcome::Streamed {
                            events: Vec::new(),
                            error: None,
                            complete: false,
                        },
                    }),
                };
                let recorded = async_stream::stream! {
                    let mut ended_with = None;
                    while let Some(item) = inner_stream.next().await {
                        match item {
                            Ok(event) => {
                                pending.push(&event);
                                yield Ok(event);
                            }
                            Err(error) => {
                                ended_with = Some(error);
                                break;
                            }
                        }
                    }
                    let write_result = pending.finish(ended_with.clone());
                    if let Some(error) = ended_with {
                        yield Err(error);
                    }
                    if let Err(problem) = write_result {
                        yield Err(ModelError::from(problem));
                    }
                };
                Ok(Box::pin(recorded))
            }
        }
    }
}

/// Whether [`ReplayModel`] compares live requests with recorded ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestCheck {
    /// A live request must equal the recorded one, or the turn fails.
    #[default]
    Exact,
    /// Replay the recorded answers whatever is asked.
    Ignore,
}

/// A [`ChatModel`] that answers from a cassette, one exchange per turn, in
/// recorded order.
#[derive(Debug)]
pub struct ReplayModel {
    model: String,
    check: RequestCheck,
    total: usize,
    remaining: Mutex<VecDeque<Exchange>>,
}

impl ReplayModel {
    /// Loads a cassette written by [`RecordingModel`]. Blank lines are skipped.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, CassetteError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| CassetteError::Open {
            path: path.clone(),
            source,
        })?;
        let mut exchanges = Vec::new();
        for (number, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| CassetteError::Read {
                path: path.clone(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let exchange: Exchange =
                serde_json::from_str(&line).map_err(|source| CassetteError::Parse {
                    path: path.clone(),
                    line: number + 1,
                    source,
                })?;
            exchanges.push(exchange);
        }
        Ok(Self::from_exchanges(exchanges))
    }

    /// Replays `exchanges` ordered by their `seq`.
    pub fn from_exchanges(mut exchanges: Vec<Exchange>) -> Self {
        exchanges.sort_by_key(|e| e.seq);
        let model = exchanges
            .first()
            .map_or_else(|| "replay".to_string(), |e| e.model.clone());
        Self {
            model,
            check: RequestCheck::Exact,
            total: exchanges.len(),
            remaining: Mutex::new(exchanges.into()),
        }
    }

    /// Sets how live requests are compared with recorded ones (default
    /// [`RequestCheck::Exact`]).
    pub fn with_request_check(mut self, check: RequestCheck) -> Self {
        self.check = check;
        self
    }

    /// Exchanges not yet replayed.
    pub fn remaining(&self) -> usize {
        self.remaining
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

#[async_trait]
impl ChatModel for ReplayModel {
    fn model_name(&self) -> &str {
        &self.model
    }

    async fn stream(&self, request: ChatRequest) -> Result<ModelStream, ModelError> {
        let exchange = {
            let mut remaining = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
            let turn = self.total - remaining.len() + 1;
            let Some(front) = remaining.front() else {
                return Err(ModelError::Other(format!(
                    "replay cassette exhausted: it holds {} exchange(s) and turn {turn} has no recorded answer",
                    self.total
                )));
            };
            if self.check == RequestCheck::Exact && front.request != request {
                return Err(ModelError::Other(format!(
                    "replay diverged at turn {turn} (recorded seq {}): {}",
                    front.seq,
                    describe_difference(&front.request, &request)
                )));
            }
            remaining.pop_front()
        };
        let Some(exchange) = exchange else {
            return Err(ModelError::Other("replay cassette exhausted".into()));
        };
        match exchange.outcome {
            Outcome::Rejected { error } => Err(error),
            Outcome::Streamed { events, error, .. } => {
                let items: Vec<Result<ModelEvent, ModelError>> =
                    events.into_iter().map(Ok).chain(error.map(Err)).collect();
                Ok(Box::pin(futures::stream::iter(items)))
            }
        }
    }
}

/// Names the first thing that differs between two requests.
fn describe_difference(recorded: &ChatRequest, live: &ChatRequest) -> String {
    if let Some((index, (a, b))) = recorded
        .messages
        .iter()
        .zip(&live.messages)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        return format!(
            "message {index} differs: recorded {} but got {}",
            short_json(a),
            short_json(b)
        );
    }
    if recorded.messages.len() != live.messages.len() {
        return format!(
            "recorded request has {} message(s), live request has {}",
            recorded.messages.len(),
            live.messages.len()
        );
    }
    if recorded.tools != live.tools {
        let names = |r: &ChatRequest| r.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        return format!(
            "tools differ: recorded {:?}, live {:?}",
            names(recorded),
            names(live)
        );
    }
    format!(
        "request options differ: recorded {} but got {}",
        short_json(&(
            &recorded.tool_choice,
            recorded.max_tokens,
            recorded.temperature
        )),
        short_json(&(&live.tool_choice, live.max_tokens, live.temperature))
    )
}

fn short_json<T: Serialize>(value: &T) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|e| format!("<unprintable: {e}>"));
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
