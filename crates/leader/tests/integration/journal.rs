//! The job journal on a real nats-server: worker events reach it without a
//! leader process (the server sources them), a batch of a worker's or the
//! leader loop's events is numbered event by event so a watch resumes
//! inside it, and what a
//! hostile worker publishes on a job's event subjects (a forged `JobEvent`,
//! another job's event, the leader agent's) neither reaches the watch nor
//! ends it; `settle` returns once a job's events are all in.

use futures::StreamExt as _;
use mtswarm_bus::{Bus, TopologyConfig, v1};
use mtswarm_leader::{JOB_EVENTS_STREAM, Journal};
use prost::Message as _;

use crate::common::{Env, eventually, within};

const JOB: &str = "job-journal";

fn state_change(current: v1::JobState, reason: &str) -> v1::job_event::Event {
    v1::job_event::Event::StateChange(v1::JobStateChange {
        current: current as i32,
        reason: reason.to_string(),
        ..Default::default()
    })
}

fn worker_event(job_id: &str, agent_id: &str, sequence: u64) -> v1::AgentEvent {
    v1::AgentEvent {
        job_id: job_id.to_string(),
        agent_id: agent_id.to_string(),
        session_id: format!("{agent_id}-session"),
        sequence,
        kind: v1::AgentEventKind::Log as i32,
        payload_json: format!("{{\"n\":{sequence}}}"),
        ..Default::default()
    }
}

/// What a watch shows of an event: the state change's reason, or the
/// worker event's agent and sequence.
fn shown(event: &v1::JobEvent) -> String {
    match &event.event {
        Some(v1::job_event::Event::StateChange(change)) => change.reason.clone(),
        Some(v1::job_event::Event::AgentEvent(agent)) => {
            format!("{}#{}", agent.agent_id, agent.sequence)
        }
        other => panic!("unexpected event {other:?}"),
    }
}

/// Reads a watch until the entry whose reason is `last`.
async fn watch_until(journal: &Journal, from: u64, last: &str) -> Vec<v1::JobEvent> {
    let mut events = journal.watch(JOB, from).await.expect("watch");
    within("the journal's last entry", async {
        let mut seen = Vec::new();
        while let Some(event) = events.next().await {
            let event = event.expect("a journal entry");
            let done = shown(&event) == last;
            seen.push(event);
            if done {
                return seen;
            }
        }
        panic!("the watch ended before {last}: {seen:?}");
    })
    .await
}

async fn journal_entries(bus: &Bus) -> u64 {
    let mut stream = bus
        .jetstream()
        .get_stream(JOB_EVENTS_STREAM)
        .await
        .expect("journal stream");
    stream.info().await.expect("journal info").state.messages
}

/// Publishes `payload` on the job's event subject of `agent_id` as a
/// `content_type` message, as a hostile worker may.
async fn publish_as(bus: &Bus, agent_id: &str, content_type: &str, payload: Vec<u8>) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(mtswarm_bus::codec::CONTENT_TYPE_HEADER, content_type);
    bus.client()
        .publish_with_headers(
            mtswarm_bus::subjects::event(JOB, agent_id).expect("subject"),
            headers,
            payload.into(),
        )
        .await
        .expect("publish");
}

const JOB_EVENT_TYPE: &str = "application/x-protobuf; proto=mtswarm.v1.JobEvent";
const AGENT_EVENT_TYPE: &str = "application/x-protobuf; proto=mtswarm.v1.AgentEvent";

#[tokio::test]
async fn worker_events_are_journaled_by_the_server_and_a_watch_resumes_inside_a_batch() {
    let env = Env::start().await;
    let bus = &env.bus;
    bus.ensure_topology(&TopologyConfig::small())
        .await
        .expect("topology");
    let journal = Journal::ensure(bus, &TopologyConfig::small())
        .await
        .expect("journal");

    // A retried append (same message id) is stored once.
    let first = journal
        .append_with_id(
            JOB,
            state_change(v1::JobState::Queued, "queued"),
            "q".into(),
        )
        .await
        .expect("append");
    let retried = journal
        .append_with_id(
            JOB,
            state_change(v1::JobState::Queued, "queued"),
            "q".into(),
        )
        .await
        .expect("append again");
    assert_eq!(first, retried, "the retry names the stored original");
    // The leader's own loop: two events in one entry of its subject.
    journal
        .append_leader_events(
            JOB,
            &[
                worker_event(JOB, "leader", 1),
                worker_event(JOB, "leader", 2),
            ],
        )
        .await
        .expect("leader events");
    // One message carrying three events, then a single one.
    bus.publish_events(&[
        worker_event(JOB, "a1", 1),
        worker_event(JOB, "a1", 2),
        worker_event(JOB, "a1", 3),
    ])
    .await
    .expect("batch");
    // A hostile worker: a `JobEvent` claiming the job succeeded, an event
    // of another job, and one in the leader agent's name.
    let forged = v1::JobEvent {
        job_id: JOB.to_string(),
        sequence: 0,
        timestamp: None,
        event: Some(state_change(v1::JobState::Succeeded, "forged success")),
    };
    publish_as(bus, "a9", JOB_EVENT_TYPE, forged.encode_to_vec()).await;
    let another_job = worker_event("another-job", "a9", 1);
    publish_as(bus, "a9", AGENT_EVENT_TYPE, another_job.encode_to_vec()).await;
    let as_leader = worker_event(JOB, "leader", 7);
    publish_as(bus, "leader", AGENT_EVENT_TYPE, as_leader.encode_to_vec()).await;
    bus.publish_event(&worker_event(JOB, "a1", 4))
        .await
        .expect("single");
    // Right after the journal was created its sourcing lags; `settle`
    // returns once everything published so far is in: the leader's two
    // entries, the batch, the three forged, the single one and the mark.
    journal.settle(JOB).await.expect("settled");
    assert_eq!(journal_entries(bus).await, 8);
    journal
        .append_confirmed(JOB, state_change(v1::JobState::Running, "marker"))
        .await
        .expect("marker");

    let events = watch_until(&journal, 0, "marker").await;
    let shown_all: Vec<String> = events.iter().map(shown).collect();
    assert_eq!(
        shown_all,
        [
            "queued", "leader#1", "leader#2", "a1#1", "a1#2", "a1#3", "a1#4", "marker"
        ],
        "the worker's events in order, nothing of the hostile worker's"
    );
    let sequences: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    // A batch's events are numbered one apart: one entry, a place each.
    assert_eq!(sequences[2], sequences[1] + 1, "{sequences:?}");
    assert_eq!(sequences[4], sequences[3] + 1, "{sequences:?}");
    assert_eq!(sequences[5], sequences[4] + 1, "{sequences:?}");
    assert!(
        events
            .iter()
            .all(|e| e.timestamp.is_some() && e.job_id == JOB)
    );

    // `sequence + 1` after a batch's first event resumes at its second.
    let resumed = watch_until(&journal, sequences[3] + 1, "marker").await;
    let shown_resumed: Vec<String> = resumed.iter().map(shown).collect();
    assert_eq!(shown_resumed, ["a1#2", "a1#3", "a1#4", "marker"]);
    assert_eq!(resumed[0].sequence, sequences[4]);
    let resumed = watch_until(&journal, sequences[1] + 1, "marker").await;
    assert_eq!(shown(&resumed[0]), "leader#2");

    // The journal is sourced again by a restarted leader without copying
    // the events stream a second time.
    let again = Journal::ensure(bus, &TopologyConfig::small())
        .await
        .expect("journal again");
    bus.publish_event(&worker_event(JOB, "a1", 5))
        .await
        .expect("after the restart");
    // Sourced from the start again, the events stream's seven messages
    // would be copied a second time: the count would pass 10.
    eventually("the next worker event sourced, once", || async {
        (journal_entries(bus).await == 10).then_some(())
    })
    .await;
    again
        .append_confirmed(JOB, state_change(v1::JobState::Succeeded, "end"))
        .await
        .expect("end");
    let tail: Vec<String> = watch_until(&again, sequences[7] + 1, "end")
        .await
        .iter()
        .map(shown)
        .collect();
    assert_eq!(tail, ["a1#5", "end"]);
}
