//! Record/replay: a recorded session replays to the same events, and replay
//! reports exhaustion and divergence clearly.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic here is a failed test, not a crash

use std::time::Duration;

use futures::StreamExt;
use mtswarm_llm::cassette::Outcome;
use mtswarm_llm::{
    ChatModel, ChatRequest, FinishReason, Message, ModelError, ModelEvent, RecordingModel,
    ReplayModel, RequestCheck, ScriptedModel, ScriptedTurn, ToolChoice,
};

fn request(user_text: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::system("sys"), Message::user(user_text)],
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: Some(100),
        temperature: Some(0.2),
    }
}

/// Every item of a turn, or the error `stream()` returned.
async fn take_turn(
    model: &dyn ChatModel,
    request: ChatRequest,
) -> Result<Vec<Result<ModelEvent, ModelError>>, ModelError> {
    let stream = model.stream(request).await?;
    let items = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
        .await
        .expect("turn did not finish within 10 s");
    Ok(items)
}

fn script() -> ScriptedModel {
    ScriptedModel::new([
        ScriptedTurn::call("call_1", "bench", "{\"n\": 3}")
            .with_thinking("plan")
            .with_usage(10, 4),
        ScriptedTurn::error(ModelError::RateLimited("HTTP 429: slow down".into())),
        ScriptedTurn {
            error: None,
            items: vec![Ok(ModelEvent::TextDelta {
                text: "Half".into(),
            })],
        }
        .then_fail(ModelError::Timeout(1500)),
        ScriptedTurn {
            error: None,
            items: vec![
                Ok(ModelEvent::TextDelta {
                    text: "Done.".into(),
                }),
                Ok(ModelEvent::Finish {
                    reason: FinishReason::Other("eos_token".into()),
                }),
            ],
        },
    ])
}

#[tokio::test]
async fn recorded_session_replays_identically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.jsonl");
    let requests = [
        request("one"),
        request("two"),
        request("three"),
        request("four"),
    ];

    let recorder = RecordingModel::new(script(), &path).unwrap();
    assert_eq!(recorder.model_name(), "scripted");
    let mut live = Vec::new();
    for req in &requests {
        live.push(take_turn(&recorder, req.clone()).await);
    }
    assert_eq!(recorder.inner().requests(), requests.to_vec());
    drop(recorder);

    // The script really produced the variety the cassette must keep.
    assert!(matches!(live[1], Err(ModelError::RateLimited(_))));
    assert_eq!(
        live[2].as_ref().unwrap().last(),
        Some(&Err(ModelError::Timeout(1500)))
    );

    let lines = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        lines.lines().count(),
        4,
        "one JSON line per exchange:\n{lines}"
    );

    let replay = ReplayModel::from_file(&path).unwrap();
    assert_eq!(replay.model_name(), "scripted");
    assert_eq!(replay.remaining(), 4);
    let mut replayed = Vec::new();
    for req in &requests {
        replayed.push(take_turn(&replay, req.clone()).await);
    }
    assert_eq!(replayed, live);
    assert_eq!(replay.remaining(), 0);

    let exhausted = take_turn(&replay, request("five")).await.unwrap_err();
    assert!(
        matches!(&exhausted, ModelError::Other(m) if m.contains("exhausted") && m.contains("turn 5")),
        "{exhausted:?}"
    );
}

#[tokio::test]
async fn replay_reports_the_first_divergent_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.jsonl");
    let recorder = RecordingModel::new(script(), &path).unwrap();
    take_turn(&recorder, request("one")).await.unwrap();
    drop(recorder);

    let strict = ReplayModel::from_file(&path).unwrap();
    let diverged = take_turn(&strict, request("something else"))
        .await
        .unwrap_err();
    match &diverged {
        ModelError::Other(m) => {
            assert!(m.contains("diverged at turn 1"), "{m}");
            assert!(m.contains("message 1 differs"), "{m}");
            assert!(m.contains("something else"), "{m}");
        }
        other => panic!("expected a divergence error, got {other:?}"),
    }
    assert_eq!(
        strict.remaining(),
        1,
        "a divergent request must not consume the exchange"
    );

    let lenient = ReplayModel::from_file(&path)
        .unwrap()
        .with_request_check(RequestCheck::Ignore);
    let items = take_turn(&lenient, request("something else"))
        .await
        .unwrap();
    assert_eq!(items.len(), 4);
}

#[tokio::test]
async fn stream_dropped_early_is_recorded_as_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.jsonl");
    let recorder = RecordingModel::new(script(), &path).unwrap();
    let mut stream = recorder.stream(request("one")).await.unwrap();
    let first = stream.next().await;
    assert_eq!(
        first,
        Some(Ok(ModelEvent::ThinkingDelta {
            text: "plan".into()
        }))
    );
    drop(stream);

    let line = std::fs::read_to_string(&path).unwrap();
    let exchange: mtswarm_llm::Exchange = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(exchange.request, request("one"));
    match exchange.outcome {
        Outcome::Streamed {
            events,
            error,
            complete,
        } => {
            assert_eq!(
                events,
                vec![ModelEvent::ThinkingDelta {
                    text: "plan".into()
                }]
            );
            assert_eq!(error, None);
            assert!(!complete);
        }
        other => panic!("expected a streamed outcome, got {other:?}"),
    }
}

#[test]
fn malformed_cassette_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(&path, "\n{\"not\": \"an exchange\"}\n").unwrap();
    let error = ReplayModel::from_file(&path).unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("line 2") && text.contains("bad.jsonl"),
        "{text}"
    );
}

#[test]
fn a_malformed_line_s_huge_value_is_quoted_in_part() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    let huge = "184465".repeat(3_000);
    let line = format!(
        "{{\"seq\":1,\"model\":\"m\",\"request\":{{\"messages\":[]}},\"outcome\":{{\"kind\":\"{huge}\"}}}}\n"
    );
    std::fs::write(&path, line).unwrap();
    let text = ReplayModel::from_file(&path).unwrap_err().to_string();
    assert!(text.len() < 1_000, "{} bytes", text.len());
    assert!(text.contains("line 1"), "{text}");
}
