//! A format 3 checkpoint's history, stored message by message so that a
//! write stores only what is new and its bytes do not grow with the steps.
//!
//! - **Keys.** Message `i` of the state's history (cut as the model is
//!   shown it) is a record of its own at `<session>.m.<nonce>.<i>`, next to
//!   the head at `<session>`. The nonce is fresh per sink (per task
//!   attempt): these records are written without the head's
//!   compare-and-set, so a stale attempt writing them can never overwrite
//!   the records a later attempt's head names. A record is a
//!   `SessionCheckpoint` carrying the message's JSON in `state_json` (and
//!   the step it was written at), unsigned: the signed head vouches for it.
//! - **Writes.** The engine's history is append-only: a sink writes every
//!   shown message it has not written yet, then the head, which names the
//!   nonce and the shown range (the pinned task, message 0, and
//!   `first..len`). The first write of a sink (a resumed run's, too)
//!   writes the shown history once under its nonce. While the messages not
//!   stored as records are few and small ([`INLINE_MESSAGES`],
//!   [`INLINE_BYTES`]) the head keeps them itself instead, so that most
//!   durable points are one write (the head), not two in turn; once they
//!   are more, they become records together.
//! - **Integrity.** Every bucket writer can write these keys (a hostile
//!   worker host too), so the head carries a hash chain over the messages:
//!   `c_i = SHA-256(c_{i-1} || SHA-256(record_i))`, kept by the sink (32
//!   bytes a message); the head names `c_{first-1}` and the value after
//!   its last record and the hash of message 0, and the seal's signature
//!   over the head covers them (and the messages it keeps itself).
//!   A resume reads the records, recomputes the chain and refuses a
//!   missing, altered, reordered or foreign message ([`HistoryFault`]).
//! - **Cleanup.** The records of a nonce go when a head of another nonce
//!   replaces the head that named them (the sink deletes them once its
//!   head landed) and when the session's checkpoint is deleted
//!   (`Checkpoints::delete` removes everything under the session's key).

use futures::{StreamExt as _, TryStreamExt as _};
use mtswarm_bus::{BusError, Checkpoints, TypedKv, v1};
use mtswarm_core::{LoopState, Message};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::stored::{
    CHECKPOINT_FORMAT_VERSION, ShownLimits, cut_message, head_fields, shown_range,
};

/// The head's field naming where its history is ([`HistoryEntries`]).
pub(crate) const HISTORY_ENTRIES_FIELD: &str = "history_entries";

/// Messages a resume reads at most (a hostile head cannot make it read
/// without end); far above what a context budget shows.
const MAX_RESTORED_MESSAGES: usize = 100_000;

/// Bytes of records a resume reads at most. A head is signed by the worker
/// that ran the attempt, and a task moved off a hostile host resumes on an
/// honest one from that host's head: without this bound its records (each
/// up to the server's payload limit) could make the resume read gigabytes.
/// Far above a context budget's shown history.
const MAX_RESTORED_BYTES: usize = 64 * 1024 * 1024;

/// History records read at once by a resume.
const CONCURRENT_READS: usize = 32;

/// History records written at once (the first write of a sink).
const CONCURRENT_WRITES: usize = 32;

/// Messages not stored as records yet that the head keeps itself, at
/// most: most durable points add a message or two, and keeping them in
/// the head makes the point one write, not two in turn.
const INLINE_MESSAGES: usize = 8;

/// Bytes of such messages the head keeps, at most (one cut tool result
/// fits; the head's size stays bounded).
const INLINE_BYTES: usize = 8 * 1024;

/// A SHA-256 value.
type Hash = [u8; 32];

/// The chain value before a nonce's first message.
const CHAIN_SEED: Hash = [0; 32];

/// Where a head's history is: its records and the chain that checks them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HistoryEntries {
    /// The nonce in the records' keys.
    pub(crate) nonce: String,
    /// First shown message after the pinned one (message 0).
    pub(crate) first: usize,
    /// Messages in the history (shown: 0 and `first..len`).
    pub(crate) len: usize,
    /// End of the messages stored as records (`first..stored_to`).
    pub(crate) stored_to: usize,
    /// The messages after those (`stored_to..len`), kept in the head.
    pub(crate) inline: Vec<Value>,
    /// SHA-256 of message 0's record, in hex (empty: no history).
    pub(crate) h0: String,
    /// The chain value before message `first`, in hex.
    pub(crate) chain_at_start: String,
    /// The chain value after message `stored_to - 1`, in hex.
    pub(crate) chain_at_end: String,
}

/// Why a format 3 checkpoint's history could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum HistoryFault {
    /// The head does not name its history.
    #[error("the head does not say where its history is")]
    NoEntries,
    /// The head's account of its history is not well formed.
    #[error("the head's account of its history does not decode: {0}")]
    BadEntries(#[source] serde_json::Error),
    /// The head's range is not one a worker writes.
    #[error("the head names an impossible history range (first {first}, length {len})")]
    BadRange {
        /// First shown message after the pinned one.
        first: usize,
        /// Messages in the history.
        len: usize,
    },
    /// The records add up to more than a resume reads.
    #[error("the history's records exceed {max} bytes (at message {index})")]
    TooLarge {
        /// The message at which the bound was passed.
        index: usize,
        /// The bound.
        max: usize,
    },
    /// A message is not in the bucket.
    #[error("history message {index} is missing")]
    Missing {
        /// Its index in the history.
        index: usize,
    },
    /// The message read is not the one the head names.
    #[error("history message {index} is not the one the head names (altered or foreign)")]
    Altered {
        /// Its index in the history.
        index: usize,
    },
    /// The messages do not chain to the head's value.
    #[error("history messages {first}..{len} do not match the head's hash chain")]
    Chain {
        /// First message checked.
        first: usize,
        /// End of the range checked.
        len: usize,
    },
    /// A message is not a message in JSON.
    #[error("history message {index} does not decode: {source}")]
    Decode {
        /// Its index in the history.
        index: usize,
        /// What the JSON decoder found wrong.
        #[source]
        source: serde_json::Error,
    },
    /// The bucket refused or did not answer (or a record is not a record).
    #[error("reading history message {index}: {source}")]
    Store {
        /// Its index in the history.
        index: usize,
        /// What the bucket said.
        #[source]
        source: BusError,
    },
}

/// `state` as the head of a format 3 checkpoint stores it (see
/// `stored`), naming where its history is (`entries`), in JSON.
pub(crate) fn head_json(
    state: &LoopState,
    limits: ShownLimits,
    entries: &HistoryEntries,
) -> Result<String, serde_json::Error> {
    let mut fields = head_fields(state, limits)?;
    fields.insert(HISTORY_ENTRIES_FIELD.into(), serde_json::to_value(entries)?);
    serde_json::to_string(&fields)
}

/// The view of the checkpoints bucket holding history records.
pub(crate) fn records(store: &Checkpoints) -> TypedKv<v1::SessionCheckpoint> {
    store.kv().nested_view()
}

/// The key of message `index` under `nonce` of `session`.
fn record_key(session: &str, nonce: &str, index: usize) -> String {
    format!("{session}.m.{nonce}.{index}")
}

/// The key pattern of every record under `nonce`, below the session's key.
pub(crate) fn nonce_filter(nonce: &str) -> String {
    format!("m.{nonce}.*")
}

fn sha256(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// The chain value after a record hashed `record` follows `previous`.
fn link(previous: &Hash, record: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update(previous);
    hasher.update(record);
    hasher.finalize().into()
}

/// What a sink wrote of its state's history under its nonce.
#[derive(Debug)]
pub(crate) struct HistoryLog {
    nonce: String,
    /// Hash of message 0's record, once written.
    h0: Option<Hash>,
    /// First message of the chain (the records below it are not needed).
    base: usize,
    /// `chain[k]` = c_{base + k}: messages `base..base + chain.len()` are
    /// written.
    chain: Vec<Hash>,
}

/// The records a write must store before its head, and the head's account
/// of the history once they are.
#[derive(Debug)]
pub(crate) struct HistoryWrite {
    /// (index, record JSON) of each message not written yet.
    records: Vec<(usize, Vec<u8>)>,
    h0: Option<Hash>,
    base: usize,
    /// The chain values of the new messages (appended to the log's, or
    /// replacing them when `base` moved).
    chain: Vec<Hash>,
    restart: bool,
    /// What the head says.
    pub(crate) entries: HistoryEntries,
}

impl Default for HistoryLog {
    fn default() -> Self {
        Self::new()
    }
}

/// The nonce of the history records a stored head names (`None`: a head
/// of format 1 or 2, or one that names none).
pub(crate) fn nonce_of(checkpoint: &v1::SessionCheckpoint) -> Option<String> {
    if checkpoint.format_version < 3 {
        return None;
    }
    let head: Value = serde_json::from_slice(&checkpoint.state_json).ok()?;
    Some(head[HISTORY_ENTRIES_FIELD]["nonce"].as_str()?.to_owned())
}

impl HistoryLog {
    /// A log under a fresh nonce.
    pub(crate) fn new() -> Self {
        Self {
            nonce: uuid::Uuid::new_v4().simple().to_string(),
            h0: None,
            base: 1,
            chain: Vec::new(),
        }
    }

    /// The nonce in this log's keys.
    pub(crate) fn nonce(&self) -> &str {
        &self.nonce
    }

    /// What storing `state` takes: the shown messages this log has not
    /// written, and the head's account of its history.
    pub(crate) fn plan(
        &self,
        state: &LoopState,
        limits: ShownLimits,
    ) -> Result<HistoryWrite, serde_json::Error> {
        let range = shown_range(state);
        let history = state.history();
        let record = |message: &Message| match cut_message(message, limits) {
            Some(cut) => serde_json::to_vec(&cut),
            None => serde_json::to_vec(message),
        };
        let mut records = Vec::new();
        let mut h0 = self.h0;
        if let (None, Some(pinned)) = (h0, history.first()) {
            let bytes = record(pinned)?;
            h0 = Some(sha256(&bytes));
            records.push((0, bytes));
        }
        // The chain goes on while the shown range starts within what was
        // written (a compaction moves `first` forward); otherwise it starts
        // again at `first`.
        let written_to = self.base + self.chain.len();
        let restart = range.first < self.base || range.first > written_to;
        let (base, prior): (usize, &[Hash]) = if restart {
            (range.first, &[])
        } else {
            (self.base, &self.chain)
        };
        // The messages past the records: kept in the head while they are
        // few (one write per durable point), else stored as records.
        let stored_to = base + prior.len();
        let pending = history
            .iter()
            .skip(stored_to)
            .map(&record)
            .collect::<Result<Vec<_>, _>>()?;
        let inline_bytes: usize = pending.iter().map(Vec::len).sum();
        let spill = pending.len() > INLINE_MESSAGES || inline_bytes > INLINE_BYTES;
        let mut last = prior.last().copied().unwrap_or(CHAIN_SEED);
        let mut chain = Vec::new();
        let (stored_to, inline) = if spill {
            for (index, bytes) in (stored_to..).zip(pending) {
                last = link(&last, &sha256(&bytes));
                chain.push(last);
                records.push((index, bytes));
            }
            (range.len.max(stored_to), Vec::new())
        } else {
            (stored_to, pending)
        };
        let value_at = |index: usize| -> Hash {
            match index.checked_sub(base) {
                None => CHAIN_SEED,
                Some(k) if k < prior.len() => prior[k],
                Some(k) => chain[k - prior.len()],
            }
        };
        let chain_at_start = value_at(range.first - 1);
        let chain_at_end = if stored_to > range.first {
            value_at(stored_to - 1)
        } else {
            chain_at_start
        };
        let inline = inline
            .iter()
            .map(|bytes| serde_json::from_slice(bytes))
            .collect::<Result<_, _>>()?;
        let entries = HistoryEntries {
            nonce: self.nonce.clone(),
            first: range.first,
            len: range.len,
            stored_to,
            inline,
            h0: h0.map(hex::encode).unwrap_or_default(),
            chain_at_start: hex::encode(chain_at_start),
            chain_at_end: hex::encode(chain_at_end),
        };
        Ok(HistoryWrite {
            records,
            h0,
            base,
            chain,
            restart,
            entries,
        })
    }

    /// Stores the records of `write` (stamped `session`, `step`); the log
    /// takes them in once all are stored.
    pub(crate) async fn store(
        &mut self,
        store: &Checkpoints,
        session: &str,
        step: u32,
        write: &mut HistoryWrite,
    ) -> Result<(), BusError> {
        let kv = records(store);
        let records = std::mem::take(&mut write.records);
        futures::stream::iter(records)
            .map(|(index, json)| {
                let kv = &kv;
                let record = v1::SessionCheckpoint {
                    session_id: session.to_owned(),
                    step,
                    state_json: json,
                    format_version: CHECKPOINT_FORMAT_VERSION,
                    ..Default::default()
                };
                let key = record_key(session, &self.nonce, index);
                async move { kv.put(&key, &record).await }
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        self.h0 = write.h0;
        if write.restart {
            self.chain.clear();
        }
        self.base = write.base;
        self.chain.append(&mut write.chain);
        Ok(())
    }
}

/// The shown history `entries` names, read from `store` and checked
/// against the head's hashes: the messages in JSON, in order.
pub(crate) async fn restore_history(
    store: &Checkpoints,
    session: &str,
    entries: &HistoryEntries,
) -> Result<Vec<Value>, HistoryFault> {
    restore_history_within(store, session, entries, MAX_RESTORED_BYTES).await
}

/// [`restore_history`], reading at most `max_bytes` of records.
pub(super) async fn restore_history_within(
    store: &Checkpoints,
    session: &str,
    entries: &HistoryEntries,
    max_bytes: usize,
) -> Result<Vec<Value>, HistoryFault> {
    let (first, len, stored_to) = (entries.first, entries.len, entries.stored_to);
    if len == 0 {
        return Ok(Vec::new());
    }
    if first == 0
        || first > stored_to
        || stored_to > len
        || len - stored_to != entries.inline.len()
        || len - first >= MAX_RESTORED_MESSAGES
    {
        return Err(HistoryFault::BadRange { first, len });
    }
    let hash_of = |text: &str, index| -> Result<Hash, HistoryFault> {
        hex::decode(text)
            .ok()
            .and_then(|bytes| Hash::try_from(bytes).ok())
            .ok_or(HistoryFault::Altered { index })
    };
    let (h0, start, end) = (
        hash_of(&entries.h0, 0)?,
        hash_of(&entries.chain_at_start, first)?,
        hash_of(&entries.chain_at_end, stored_to.max(1) - 1)?,
    );
    let kv = records(store);
    let indices = std::iter::once(0).chain(first..stored_to);
    let mut read = futures::stream::iter(indices)
        .map(|index| {
            let (kv, key) = (&kv, record_key(session, &entries.nonce, index));
            async move {
                match kv.get(&key).await {
                    Ok(Some(record)) => Ok((index, record.value.state_json)),
                    Ok(None) => Err(HistoryFault::Missing { index }),
                    Err(source) => Err(HistoryFault::Store { index, source }),
                }
            }
        })
        .buffered(CONCURRENT_READS);
    let mut chain = start;
    let mut jsons = Vec::with_capacity(len - first + 1);
    let mut bytes = 0usize;
    while let Some((index, json)) = read.try_next().await? {
        bytes = bytes.saturating_add(json.len());
        if bytes > max_bytes {
            return Err(HistoryFault::TooLarge {
                index,
                max: max_bytes,
            });
        }
        let hash = sha256(&json);
        if index == 0 {
            if hash != h0 {
                return Err(HistoryFault::Altered { index });
            }
        } else {
            chain = link(&chain, &hash);
        }
        jsons.push((index, json));
    }
    if chain != end {
        return Err(HistoryFault::Chain {
            first,
            len: stored_to,
        });
    }
    let mut messages = jsons
        .into_iter()
        .map(|(index, json)| {
            serde_json::from_slice(&json).map_err(|source| HistoryFault::Decode { index, source })
        })
        .collect::<Result<Vec<Value>, _>>()?;
    messages.extend(entries.inline.iter().cloned());
    Ok(messages)
}
