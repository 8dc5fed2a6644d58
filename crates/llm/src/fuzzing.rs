//! The entry points of this crate's untrusted-input parsers for the fuzz
//! targets of `mtswarm-fuzz`: each runs the same code a live turn runs
//! (the SSE framing, the tool-call assembly, the text-mode call reader),
//! without a network, so bytes a server could send can be fed to it.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use mtswarm_core::model::{ModelError, ModelEvent, ToolCall};

use crate::openai::{framing_error, text_tools, turn_events};

/// How the turn's stream is read: what [`crate::OpenAiClient`] does with
/// a response body on a turn that offers tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnMode {
    /// Native tool calls, and calls a server returned as text.
    Native,
    /// The text tool mode: every call is read from the reply's text.
    Text,
}

/// Every item the client yields for a response body that arrives as
/// `chunks` (however the transport split it), in `mode`.
pub async fn sse_turn(chunks: Vec<Vec<u8>>, mode: TurnMode) -> Vec<Result<ModelEvent, ModelError>> {
    let body = futures::stream::iter(
        chunks
            .into_iter()
            .map(|chunk| Ok::<Bytes, Infallible>(Bytes::from(chunk))),
    );
    let events = crate::openai::framing::lines(body)
        .eventsource()
        .map(|item| item.map_err(|e| framing_error(e, |never| match never {})));
    let turn = turn_events(events, Duration::from_secs(5));
    let mut stream = match mode {
        TurnMode::Native => text_tools::tool_calls_in_native_text(turn),
        TurnMode::Text => text_tools::tool_calls_from_text(turn, true),
    };
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        items.push(item);
    }
    items
}

/// The tool calls a reply's text holds, as the text tool mode reads them.
pub fn text_calls(text: &str) -> Vec<ToolCall> {
    crate::openai::text_calls::read_calls(text)
}
