//! JSON log lines that name the trace they belong to: tracing-subscriber's
//! JSON event format with `trace_id` and `span_id` (W3C hex, as a trace
//! backend shows them) of the current span added, so a log shipper's line
//! leads to the job's trace and back. Lines outside any traced span are
//! left as they are.
//!
//! The ids live in the OpenTelemetry layer's span data, reached through the
//! dispatcher the format is part of. While an event is being dispatched the
//! thread's default dispatcher reads as "none", so the format is bound to
//! its dispatcher once that exists ([`DispatchBinder::bind`]); it holds it
//! weakly, as the dispatcher owns the format.

use std::fmt;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt as _;
use tracing::dispatcher::WeakDispatch;
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format with the current span's trace and span ids.
#[derive(Debug)]
pub struct TraceJsonFormat {
    inner: Format<Json>,
    dispatch: Arc<OnceLock<WeakDispatch>>,
}

/// Binds a [`TraceJsonFormat`] to the dispatcher it formats for.
#[derive(Debug, Clone)]
pub struct DispatchBinder(Arc<OnceLock<WeakDispatch>>);

impl DispatchBinder {
    /// Lines formatted from now on look the ids up in `dispatch`; a later
    /// call is ignored.
    pub fn bind(&self, dispatch: &Dispatch) {
        let _ = self.0.set(dispatch.downgrade());
    }
}

impl Default for TraceJsonFormat {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceJsonFormat {
    /// tracing-subscriber's default JSON format, with the ids.
    pub fn new() -> Self {
        Self {
            inner: tracing_subscriber::fmt::format().json(),
            dispatch: Arc::new(OnceLock::new()),
        }
    }

    /// The handle that binds this format to its dispatcher.
    pub fn binder(&self) -> DispatchBinder {
        DispatchBinder(self.dispatch.clone())
    }
}

/// `(trace_id, span_id)` of the OpenTelemetry span behind the current
/// `tracing` span, when it has a valid context.
fn current_ids<S, N>(
    ctx: &FmtContext<'_, S, N>,
    dispatch: &OnceLock<WeakDispatch>,
) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let id = ctx.lookup_current()?.id();
    let dispatch = dispatch.get()?.upgrade()?;
    let context = tracing_opentelemetry::get_otel_context(&id, &dispatch)?;
    let span = context.span();
    let span_context = span.span_context();
    span_context.is_valid().then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

impl<S, N> FormatEvent<S, N> for TraceJsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        if let Some((trace_id, span_id)) = current_ids(ctx, &self.dispatch)
            && let Some(close) = line.rfind('}')
        {
            // The object ends the line; the ids go in as its last members.
            line.insert_str(
                close,
                &format!(",\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\""),
            );
        }
        writer.write_str(&line)
    }
}
