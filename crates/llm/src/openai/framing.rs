//! Cuts a response body into lines before the SSE parser sees it, and
//! bounds an event's size. `eventsource-stream` parses the whole of its
//! buffer again on every chunk and copies the rest of it after every line:
//! a server that trickles one long line in small pieces, or sends many
//! lines in one piece, would cost the client time quadratic in the size.
//! Handed one line at a time, the parser's buffer holds one line, and the
//! cost is linear. An event (its lines up to the blank line that ends it)
//! longer than [`MAX_EVENT_BYTES`] ends the stream with an error instead
//! of growing the client's memory without bound.

use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

/// Longest event read: far above any chunk a chat-completion server sends.
pub(crate) const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// Why a body could not be cut into lines.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FramingError<E> {
    /// The connection failed.
    #[error("{0}")]
    Transport(E),
    /// An event is longer than [`MAX_EVENT_BYTES`].
    #[error("an event of the stream is longer than {MAX_EVENT_BYTES} bytes")]
    EventTooLong,
}

/// `body`, one line (with its line feed) per item.
pub(crate) fn lines<S, B, E>(
    mut body: S,
) -> Pin<Box<dyn Stream<Item = Result<Bytes, FramingError<E>>> + Send>>
where
    S: Stream<Item = Result<B, E>> + Send + Unpin + 'static,
    B: AsRef<[u8]> + Send,
    E: Send + 'static,
{
    Box::pin(async_stream::stream! {
        let mut pending = BytesMut::new();
        // Bytes of the event read so far (since the last blank line).
        let mut event_bytes = 0usize;
        while let Some(item) = body.next().await {
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(error) => {
                    yield Err(FramingError::Transport(error));
                    return;
                }
            };
            let mut scanned = pending.len();
            pending.extend_from_slice(chunk.as_ref());
            while let Some(at) = pending[scanned..].iter().position(|b| *b == b'\n') {
                let line = pending.split_to(scanned + at + 1).freeze();
                scanned = 0;
                event_bytes = if is_blank(&line) { 0 } else { event_bytes + line.len() };
                yield Ok(line);
            }
            if event_bytes + pending.len() > MAX_EVENT_BYTES {
                yield Err(FramingError::EventTooLong);
                return;
            }
        }
        if !pending.is_empty() {
            yield Ok(pending.freeze());
        }
    })
}

/// A line that ends an event: `\n` or `\r\n`.
fn is_blank(line: &[u8]) -> bool {
    matches!(line, b"\n" | b"\r\n")
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn cut(pieces: &[&str]) -> Vec<Result<Bytes, FramingError<Infallible>>> {
        let owned: Vec<Vec<u8>> = pieces.iter().map(|p| p.as_bytes().to_vec()).collect();
        let body = futures::stream::iter(owned.into_iter().map(Ok::<_, Infallible>));
        futures::executor::block_on(lines(body).collect())
    }

    #[test]
    fn a_body_comes_out_a_line_at_a_time_however_it_was_split() {
        let out: Vec<Bytes> = cut(&["da", "ta: a\n\nda", "ta: b\r\n", "\r\nrest"])
            .into_iter()
            .filter_map(Result::ok)
            .collect();
        assert_eq!(out, ["data: a\n", "\n", "data: b\r\n", "\r\n", "rest"]);
    }

    #[test]
    fn an_event_past_the_bound_is_an_error() {
        let line = format!("data: {}\n", "x".repeat(1024 * 1024));
        let pieces: Vec<&str> = std::iter::repeat_n(line.as_str(), 5).collect();
        let out = cut(&pieces);
        assert!(
            matches!(out.last(), Some(Err(FramingError::EventTooLong))),
            "{:?}",
            out.len()
        );
        let separate: Vec<String> = std::iter::repeat_n(format!("{line}\n"), 5).collect();
        let separate: Vec<&str> = separate.iter().map(String::as_str).collect();
        assert!(cut(&separate).iter().all(Result::is_ok));
    }
}
