//! The size limit of one stored record, checked before a record is sent.
//!
//! nats-server refuses a message over its `max_payload` (1 MiB unless
//! configured) with a bare "maximum payload exceeded" that names neither the
//! record nor the sizes, and on some paths the connection is closed instead.
//! Every KV write and JetStream publish of this crate therefore checks the
//! encoded size first and fails with [`BusError::RecordTooLarge`] naming the
//! record, its size and the limit.

use async_nats::HeaderMap;

use crate::connection::Bus;

use crate::error::BusError;

/// What a KV write adds to the value on the wire beyond the payload: its
/// subject-level headers (expected revision, per-key TTL).
pub(crate) const KV_HEADER_ALLOWANCE: usize = 128;

/// Where [`Bus::max_record_bytes`] takes its limit from.
const FROM_SERVER: &str = "the server's max_payload";
const FROM_CONFIG: &str = "the deployment's max record bytes, --nats-max-record-bytes";

impl Bus {
    /// The largest record this client stores, in bytes (payload and
    /// headers): the connected server's `max_payload`, capped by
    /// [`TopologyConfig::max_record_bytes`](crate::TopologyConfig) of the
    /// topology ensured or adopted through this connection.
    pub fn max_record_bytes(&self) -> usize {
        self.record_limit().0
    }

    /// The limit and where it comes from.
    fn record_limit(&self) -> (usize, &'static str) {
        let server = self.client().server_info().max_payload;
        let configured = self.topology_in_use().max_record_bytes;
        match (server, configured) {
            // Not connected yet: the server's limit is unknown.
            (0, Some(cap)) => (cap, FROM_CONFIG),
            (0, None) => (usize::MAX, FROM_SERVER),
            (server, Some(cap)) if cap < server => (cap, FROM_CONFIG),
            (server, _) => (server, FROM_SERVER),
        }
    }

    /// Fails with [`BusError::RecordTooLarge`] when a record of
    /// `payload_bytes` with `header_bytes` of headers is over the limit;
    /// `what` names it (only built on failure).
    pub(crate) fn check_record_size(
        &self,
        what: impl FnOnce() -> String,
        payload_bytes: usize,
        header_bytes: usize,
    ) -> Result<(), BusError> {
        let (limit, limit_from) = self.record_limit();
        let bytes = payload_bytes.saturating_add(header_bytes);
        check_size(what, bytes, limit, limit_from)
    }
}

/// Fails with [`BusError::RecordTooLarge`] when `bytes` is over `limit`.
pub(crate) fn check_size(
    what: impl FnOnce() -> String,
    bytes: usize,
    limit: usize,
    limit_from: &'static str,
) -> Result<(), BusError> {
    if bytes > limit {
        return Err(BusError::RecordTooLarge {
            what: what(),
            bytes,
            limit,
            limit_from,
        });
    }
    Ok(())
}

/// The size of `headers` as NATS sends them (`NATS/1.0` line, one
/// `name: value` line per value, blank line).
pub(crate) fn header_bytes(headers: &HeaderMap) -> usize {
    let lines: usize = headers
        .iter()
        .map(|(name, values)| {
            values
                .iter()
                .map(|value| name.to_string().len() + value.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum();
    "NATS/1.0\r\n\r\n".len() + lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_over_the_limit_is_named_with_both_sizes() {
        assert!(check_size(|| "x".into(), 10, 10, FROM_SERVER).is_ok());
        let error = check_size(
            || "mtswarm.v1.JobRecord record mtswarm_jobs/job-123".into(),
            1_468_006,
            1 << 20,
            FROM_SERVER,
        )
        .expect_err("over the limit");
        assert_eq!(
            error.to_string(),
            "mtswarm.v1.JobRecord record mtswarm_jobs/job-123 is 1.4 MiB (1468006 bytes), \
             over the 1 MiB limit (the server's max_payload)"
        );
    }

    #[test]
    fn headers_count_as_sent() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", "abc");
        assert_eq!(header_bytes(&headers), 12 + "Nats-Msg-Id".len() + 3 + 4);
    }
}
