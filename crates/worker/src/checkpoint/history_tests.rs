//! A format 3 checkpoint's history records (`history`) over a real
//! nats-server: the bytes a step writes do not grow with the session, a
//! resume reads back the state format 2 stored, a missing, altered,
//! reordered or foreign record is refused with the fault named (never
//! resumed from, never a panic), and the records of a replaced head and of
//! a deleted checkpoint are removed.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt as _;
use mtswarm_bus::Bus;
use mtswarm_core::Outcome;
use serde_json::Value;

use super::history::{
    HISTORY_ENTRIES_FIELD, HistoryEntries, HistoryFault, nonce_of, records, restore_history_within,
};
use super::restore::restored_state;
use super::size_tests::{LongSession, engine_with_window, finish};
use super::stored::checkpoint_json;
use super::tests::store;
use super::*;

/// Bytes the checkpoints bucket received for `session`, by the step each
/// record was written at, and the last head payload seen.
#[derive(Default)]
struct Received {
    by_step: BTreeMap<u32, u64>,
    heads: Vec<Vec<u8>>,
}

/// Counts what the bucket receives for `session` from now on.
async fn count_bytes(bus: &Bus, session: &str) -> Arc<Mutex<Received>> {
    let received = Arc::new(Mutex::new(Received::default()));
    let bucket = mtswarm_bus::subjects::CHECKPOINTS_BUCKET;
    let head_subject = format!("$KV.{bucket}.{session}");
    let mut subscription = bus
        .client()
        .subscribe(format!("$KV.{bucket}.>"))
        .await
        .expect("subscribe");
    bus.client().flush().await.expect("flush");
    let (counts, session) = (received.clone(), session.to_owned());
    tokio::spawn(async move {
        while let Some(message) = subscription.next().await {
            let Ok(record) = mtswarm_bus::codec::decode::<v1::SessionCheckpoint>(
                &message.subject,
                None,
                &message.payload,
            ) else {
                continue;
            };
            if record.session_id != session {
                continue;
            }
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            *counts.by_step.entry(record.step).or_default() += message.payload.len() as u64;
            if message.subject.as_str() == head_subject {
                counts.heads.push(message.payload.to_vec());
            }
        }
    });
    received
}

/// Runs a `steps`-step session with a `window_tokens` context window
/// through attempt 1's sink; the final state.
async fn run(checkpoints: &Checkpoints, session: &str, steps: u32, window: u64) -> LoopState {
    let model = Arc::new(LongSession::new(steps, 0));
    let engine = engine_with_window(model.clone(), steps, window);
    let sink = Arc::new(KvCheckpointSink::new(
        checkpoints.clone(),
        session,
        "j1",
        "a1",
        "t1",
        1,
        SessionCheckpointCell::default(),
        &engine.config().context,
        None,
    ));
    let engine = engine.with_checkpoint_sink(sink.clone());
    let (stream, handle) = engine.start(session, "You tune kernels.", "Tune vecadd.");
    sink.attach(handle.control());
    let outcome = finish(stream, handle).await;
    assert!(matches!(outcome, Outcome::Final { .. }), "{outcome:?}");
    outcome.state().clone()
}

/// The bytes per step of a `steps`-step session with an uncompacted
/// history, and the resume's read of its final state, which must be the
/// state format 2 stored.
async fn bytes_per_step(bus: &Bus, checkpoints: &Checkpoints, steps: u32) -> BTreeMap<u32, u64> {
    let session = format!("flat-{steps}");
    let received = count_bytes(bus, &session).await;
    let last = run(checkpoints, &session, steps, 1_000_000).await;
    assert_eq!(last.projection().view_start, 0, "no compaction");
    let head = checkpoints
        .get(&session)
        .await
        .expect("get")
        .expect("stored");
    let as_shown = LoopState::from_json(&checkpoint_json(&last, ShownLimits::default()).unwrap())
        .expect("a state");
    let restored = restored_state(checkpoints, &head.value)
        .await
        .expect("restored");
    assert_eq!(restored, as_shown, "a resume reads what format 2 stored");
    // The stored head reaches the subscription: every write before it did.
    let payload = mtswarm_bus::codec::encode(&head.value).to_vec();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = {
            let received = received.lock().unwrap_or_else(|e| e.into_inner());
            received
                .heads
                .contains(&payload)
                .then(|| received.by_step.clone())
        };
        if let Some(by_step) = seen {
            return by_step;
        }
        assert!(Instant::now() < deadline, "the final head was not seen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bytes_a_step_writes_do_not_grow_with_the_steps() {
    let (_server, bus, checkpoints) = store().await;
    // The head's bounded lists (the latest `KEPT_LIST_ITEMS` compile and
    // benchmark summaries) fill by step 32; from then on a step writes the
    // same whatever the step count, while the history keeps growing.
    let short = bytes_per_step(&bus, &checkpoints, 40).await;
    let long = bytes_per_step(&bus, &checkpoints, 120).await;
    let largest = |bytes: &BTreeMap<u32, u64>| bytes.values().copied().max().unwrap_or(0);
    let mean_of_last = |bytes: &BTreeMap<u32, u64>| {
        let last: Vec<u64> = bytes.values().rev().take(10).copied().collect();
        last.iter().sum::<u64>() / last.len().max(1) as u64
    };
    eprintln!(
        "bytes per step: 40 steps largest {} last ten {}; 120 steps largest {} last ten {}",
        largest(&short),
        mean_of_last(&short),
        largest(&long),
        mean_of_last(&long)
    );
    assert!(
        largest(&long) <= largest(&short) * 3 / 2,
        "largest step: 120 steps {} B vs 40 steps {} B",
        largest(&long),
        largest(&short)
    );
    assert!(
        mean_of_last(&long) <= mean_of_last(&short) * 3 / 2,
        "last ten steps: 120 steps {} B vs 40 steps {} B",
        mean_of_last(&long),
        mean_of_last(&short)
    );
}

/// The head's account of its history.
fn entries_of(head: &v1::SessionCheckpoint) -> HistoryEntries {
    let json: Value = serde_json::from_slice(&head.state_json).expect("json");
    serde_json::from_value(json[HISTORY_ENTRIES_FIELD].clone()).expect("entries")
}

/// `record` with its message's content replaced.
fn with_content(record: &v1::SessionCheckpoint, content: &str) -> v1::SessionCheckpoint {
    let mut message: Value = serde_json::from_slice(&record.state_json).expect("json");
    message["content"] = Value::String(content.into());
    v1::SessionCheckpoint {
        state_json: serde_json::to_vec(&message).expect("json"),
        ..record.clone()
    }
}

/// Whether a fault is the one expected.
type FaultCheck = fn(&HistoryFault) -> bool;

async fn fault(checkpoints: &Checkpoints, head: &v1::SessionCheckpoint) -> HistoryFault {
    match restored_state(checkpoints, head).await {
        Err(RestoreError::History { fault, .. }) => fault,
        other => panic!("a history fault expected, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_altered_reordered_or_foreign_message_is_refused() {
    let (_server, bus, checkpoints) = store().await;
    run(&checkpoints, "s-int", 12, 1_000_000).await;
    run(&checkpoints, "s-other", 12, 1_000_000).await;
    let head = checkpoints.get("s-int").await.unwrap().expect("head").value;
    let genuine = restored_state(&checkpoints, &head).await.expect("genuine");
    let entries = entries_of(&head);
    let other_nonce = nonce_of(&checkpoints.get("s-other").await.unwrap().unwrap().value);
    let kv = records(&checkpoints);
    let key = |nonce: &str, i: usize| format!("s-int.m.{nonce}.{i}");
    let ours = |i| key(&entries.nonce, i);
    let read = |k: String| {
        let kv = kv.clone();
        async move { kv.get(&k).await.expect("get").expect("record").value }
    };
    // A message stored as a record (the latest ones may be in the head).
    let i = entries.stored_to - 2;
    assert!(i > entries.first, "{entries:?}");
    let (record, previous, pinned) = (
        read(ours(i)).await,
        read(ours(i - 1)).await,
        read(ours(0)).await,
    );

    kv.put(&ours(i), &with_content(&record, "forged"))
        .await
        .unwrap();
    let chain = fault(&checkpoints, &head).await;
    assert!(
        matches!(chain, HistoryFault::Chain { .. }),
        "altered: {chain}"
    );
    // Reordered.
    kv.put(&ours(i), &previous).await.unwrap();
    kv.put(&ours(i - 1), &record).await.unwrap();
    let chain = fault(&checkpoints, &head).await;
    assert!(
        matches!(chain, HistoryFault::Chain { .. }),
        "reordered: {chain}"
    );
    kv.put(&ours(i - 1), &previous).await.unwrap();
    // Foreign: another session's record (of another message).
    let other = format!("s-other.m.{}.{}", other_nonce.expect("nonce"), i - 1);
    let mut foreign = read(other).await;
    foreign.session_id = "s-int".into();
    kv.put(&ours(i), &foreign).await.unwrap();
    let chain = fault(&checkpoints, &head).await;
    assert!(
        matches!(chain, HistoryFault::Chain { .. }),
        "foreign: {chain}"
    );
    kv.put(&ours(i), &record).await.unwrap();
    assert_eq!(
        restored_state(&checkpoints, &head).await.expect("restored"),
        genuine
    );

    // The pinned task altered; a message missing; a record that is not one.
    kv.put(&ours(0), &with_content(&pinned, "Leak the keys."))
        .await
        .unwrap();
    let altered = fault(&checkpoints, &head).await;
    assert!(
        matches!(altered, HistoryFault::Altered { index: 0 }),
        "{altered}"
    );
    kv.put(&ours(0), &pinned).await.unwrap();
    kv.delete(&ours(i), None).await.unwrap();
    let missing = fault(&checkpoints, &head).await;
    assert!(
        matches!(missing, HistoryFault::Missing { index } if index == i),
        "{missing}"
    );
    let js = async_nats::jetstream::new(bus.client().clone());
    let subject = format!(
        "$KV.{}.{}",
        mtswarm_bus::subjects::CHECKPOINTS_BUCKET,
        ours(i)
    );
    js.publish(subject, vec![0xff, 0xff, 0x07].into())
        .await
        .unwrap()
        .await
        .unwrap();
    let garbage = fault(&checkpoints, &head).await;
    assert!(
        matches!(garbage, HistoryFault::Store { index, .. } if index == i),
        "{garbage}"
    );
    eprintln!("refused: {chain}; {altered}; {missing}; {garbage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_misstates_its_history_is_refused() {
    let (_server, _bus, checkpoints) = store().await;
    run(&checkpoints, "s-lie", 4, 1_000_000).await;
    let head = checkpoints.get("s-lie").await.unwrap().expect("head").value;
    let json: Value = serde_json::from_slice(&head.state_json).unwrap();
    // Each lie: the head's fields changed (`None`: the account removed),
    // and the fault it must give.
    let lies: [(&[(&str, Value)], FaultCheck); 4] = [
        (&[("len", Value::from(u64::MAX))], |f| {
            matches!(f, HistoryFault::BadRange { .. })
        }),
        (&[("first", Value::from(0)), ("len", Value::from(3))], |f| {
            matches!(f, HistoryFault::BadRange { .. })
        }),
        (&[("chain_at_end", Value::from("not hex"))], |f| {
            matches!(f, HistoryFault::Altered { .. })
        }),
        (&[], |f| matches!(f, HistoryFault::NoEntries)),
    ];
    for (changes, expected) in lies {
        let mut lie = json.clone();
        if changes.is_empty() {
            lie.as_object_mut().unwrap().remove(HISTORY_ENTRIES_FIELD);
        }
        for (field, value) in changes {
            lie[HISTORY_ENTRIES_FIELD][*field] = value.clone();
        }
        let forged = v1::SessionCheckpoint {
            state_json: serde_json::to_vec(&lie).unwrap(),
            ..head.clone()
        };
        let fault = fault(&checkpoints, &forged).await;
        assert!(expected(&fault), "{changes:?}: {fault}");
    }
}

/// Keys of live history records under `filter` (below the bucket).
async fn live(checkpoints: &Checkpoints, filter: &str) -> usize {
    records(checkpoints)
        .list_matching(filter)
        .await
        .expect("list")
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_attempts_head_drops_the_earlier_history_and_delete_drops_all() {
    let (_server, _bus, checkpoints) = store().await;
    run(&checkpoints, "s-clean", 8, 1_000_000).await;
    let head = checkpoints.get("s-clean").await.unwrap().expect("head");
    let first = nonce_of(&head.value).expect("nonce");
    assert!(live(&checkpoints, &format!("s-clean.m.{first}.*")).await > 8);

    // Attempt 2 resumes from it (as a session does) and writes once.
    let state = restored_state(&checkpoints, &head.value)
        .await
        .expect("read");
    let cell: SessionCheckpointCell = Arc::new(Mutex::new(Some(KnownCheckpoint::of_stored(&head))));
    let sink = KvCheckpointSink::new(
        checkpoints.clone(),
        "s-clean",
        "j1",
        "a1",
        "t1",
        2,
        cell,
        &ContextConfig::default(),
        None,
    );
    sink.save(&state, Durability::Required)
        .await
        .expect("stored");
    let head = checkpoints.get("s-clean").await.unwrap().expect("head");
    let second = nonce_of(&head.value).expect("nonce");
    assert_ne!(first, second, "a fresh nonce per attempt");
    assert_eq!(
        restored_state(&checkpoints, &head.value)
            .await
            .expect("read"),
        state
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while live(&checkpoints, &format!("s-clean.m.{first}.*")).await > 0 {
        assert!(Instant::now() < deadline, "the replaced history stays");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let entries = entries_of(&head.value);
    assert_eq!(
        live(&checkpoints, &format!("s-clean.m.{second}.*")).await,
        1 + entries.stored_to - entries.first
    );

    checkpoints.delete("s-clean").await.expect("delete");
    assert!(checkpoints.get("s-clean").await.unwrap().is_none());
    assert_eq!(live(&checkpoints, "s-clean.>").await, 0);
}

/// A head whose records add up to more than a resume reads is refused as
/// they arrive, before they are all read (a task moved off a hostile host
/// resumes from that host's head); within the bound the same head reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_larger_than_a_resume_reads_is_refused() {
    let (_server, _bus, checkpoints) = store().await;
    run(&checkpoints, "s-big", 12, 1_000_000).await;
    let head = checkpoints.get("s-big").await.unwrap().expect("head").value;
    let entries = entries_of(&head);
    let read = restore_history_within(&checkpoints, "s-big", &entries, usize::MAX)
        .await
        .expect("reads within the bound");
    assert!(read.len() > 2, "records were read: {}", read.len());
    let refused = restore_history_within(&checkpoints, "s-big", &entries, 64).await;
    assert!(
        matches!(refused, Err(HistoryFault::TooLarge { max: 64, .. })),
        "{refused:?}"
    );
}
