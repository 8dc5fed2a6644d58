//! The reassigner's two watches: the leases KV (a lease that lapsed, was
//! released or names another session) and the quarantine KV, each turned
//! into [`Trigger`]s and re-created with backoff when it ends or fails.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{Stream, StreamExt as _};
use mtswarm_bus::{Backoff, KvChange, LeaseEvent, reopen};
use tokio::sync::watch;

use super::{LeaseCache, MAX_BACKOFF, ReassignHandles, time_of};
use crate::trigger::Trigger;

/// Follows the stream `open` makes until shutdown, handing every item to
/// `handle`; a stream that fails or ends is made again with backoff.
async fn follow<S, T, E, O, Fut, OpenError>(
    what: &str,
    shutdown: &mut watch::Receiver<bool>,
    mut open: O,
    mut handle: impl FnMut(T),
) where
    S: Stream<Item = Result<T, E>> + Unpin,
    E: std::fmt::Display,
    O: FnMut() -> Fut,
    Fut: Future<Output = Result<S, OpenError>>,
    OpenError: std::fmt::Display,
{
    let mut backoff = Backoff::new(Duration::from_millis(200), MAX_BACKOFF);
    loop {
        let Some(mut changes) = reopen(what, &mut backoff, shutdown, &mut open).await else {
            return;
        };
        loop {
            let change = tokio::select! {
                change = changes.next() => change,
                _ = shutdown.changed() => return,
            };
            match change {
                Some(Ok(item)) => handle(item),
                Some(Err(error)) => {
                    tracing::warn!(%error, "{what} failed; re-creating it");
                    break;
                }
                None => break,
            }
        }
        if !backoff.sleep_or_shutdown(shutdown).await {
            return;
        }
    }
}

pub(super) async fn watch_leases(
    handles: Arc<ReassignHandles>,
    cache: LeaseCache,
    mut shutdown: watch::Receiver<bool>,
) {
    let open = || handles.leases.watch_with_current();
    follow("lease watch", &mut shutdown, open, |event| match event {
        LeaseEvent::Held(lease) => {
            let lease = lease.value;
            handles.lease_clock.observe(lease.ttl_seconds);
            let slice_id = lease.slice_id.clone();
            let session = lease.session_id.clone();
            let previous = cache.insert(slice_id.clone(), lease);
            if previous.is_none_or(|p| p.session_id != session) {
                handles.triggers.send(Trigger::Lease {
                    slice_id,
                    reason: if session.is_empty() {
                        "the slice's lease names no session".to_string()
                    } else {
                        format!("the slice's lease names session {session}")
                    },
                    cause_at: SystemTime::now(),
                });
            }
        }
        LeaseEvent::Released { slice_id } => {
            cache.remove(&slice_id);
            handles.triggers.send(Trigger::Lease {
                slice_id,
                reason: "the slice's lease was released".to_string(),
                cause_at: SystemTime::now(),
            });
        }
        LeaseEvent::Lapsed {
            slice_id,
            expired_at,
        } => {
            let cached = cache.remove(&slice_id);
            let expired_at =
                expired_at.or_else(|| cached.and_then(|(_, lease)| time_of(lease.expires_at)));
            handles.triggers.send(Trigger::Lease {
                slice_id,
                reason: "the slice's lease lapsed".to_string(),
                cause_at: expired_at.unwrap_or_else(SystemTime::now),
            });
        }
    })
    .await;
}

pub(super) async fn watch_quarantine(
    handles: Arc<ReassignHandles>,
    mut shutdown: watch::Receiver<bool>,
) {
    let open = || handles.quarantine.kv().watch();
    follow("quarantine watch", &mut shutdown, open, |change| {
        if let KvChange::Put { key, value } = change {
            let record = value.value;
            handles.triggers.send(Trigger::Quarantined {
                slice_id: key,
                reason: format!("slice quarantined: {}", record.reason),
                cause_at: time_of(record.since).unwrap_or_else(SystemTime::now),
            });
        }
    })
    .await;
}
