//! What each process role may publish and subscribe to on NATS, derived
//! from the subject layout in [`crate::subjects`], and the nats-server
//! `authorization` block that enforces it for a set of nkey users.
//!
//! - The leader is the control plane: it creates the streams and buckets
//!   and reads and writes everything.
//! - A worker daemon reads only its own task subjects (through its own
//!   durable consumer: no other JetStream consumer API), writes only the
//!   lease and quarantine keys of its own slices and its own membership
//!   key, publishes results, events, measurements and approval requests,
//!   and receives approval decisions; it may not publish a decision,
//!   create or delete streams, or read job records. Its replies arrive
//!   under its own inbox prefix, so it cannot read other clients' replies.
//! - A client (`mtswarm results`) only reads the measurements stream.

use std::fmt::Write as _;

use crate::subjects::{
    self, APPROVALS_BUCKET, CHECKPOINTS_BUCKET, LEASES_BUCKET, MEASUREMENTS_STREAM,
    QUARANTINE_BUCKET, TASKS_STREAM, WORKERS_BUCKET,
};

/// Allowed subjects of one identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    /// Subjects (wildcards allowed) the identity may publish to.
    pub publish: Vec<String>,
    /// Subjects (wildcards allowed) the identity may subscribe to.
    pub subscribe: Vec<String>,
}

/// The reply-subject prefix of a worker daemon's connection.
pub fn worker_inbox_prefix(worker_id: &str) -> String {
    format!("_INBOX_{worker_id}")
}

/// The reply-subject prefix of client connections.
pub const CLIENT_INBOX_PREFIX: &str = "_INBOX_client";

/// The leader: everything.
pub fn leader() -> Permissions {
    Permissions {
        publish: vec![">".into()],
        subscribe: vec![">".into()],
    }
}

/// JetStream API subjects for reading (not writing) a KV bucket: its
/// stream info, direct and stored gets, and watches (ordered consumers).
fn read_bucket(bucket: &str, publish: &mut Vec<String>) {
    read_stream(&format!("KV_{bucket}"), publish);
}

/// JetStream API subjects for reading (not writing) the stream `stream`:
/// its info, direct and stored gets, and ordered consumers over it.
fn read_stream(stream: &str, publish: &mut Vec<String>) {
    publish.extend([
        format!("$JS.API.STREAM.INFO.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}"),
        format!("$JS.API.DIRECT.GET.{stream}.>"),
        format!("$JS.API.STREAM.MSG.GET.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}"),
        format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
        format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
        format!("$JS.API.CONSUMER.INFO.{stream}.>"),
    ]);
}

/// A worker daemon `worker_id` owning `slice_ids` (bus ids, as in lease keys).
pub fn worker(worker_id: &str, slice_ids: &[String]) -> Permissions {
    let mut publish: Vec<String> = vec![
        "$JS.API.INFO".into(),
        format!("{}.result.>", subjects::PREFIX),
        format!("{}.event.>", subjects::PREFIX),
        format!("{}.measurement.>", subjects::PREFIX),
        format!("{}.approval.request.>", subjects::PREFIX),
        format!("$KV.{WORKERS_BUCKET}.{worker_id}"),
        // Checkpoints and approval records are keyed by session and
        // approval id, which move between workers with their sessions.
        format!("$KV.{CHECKPOINTS_BUCKET}.>"),
        format!("$KV.{APPROVALS_BUCKET}.>"),
        // Flow control of the ordered consumers behind KV watches.
        "$JS.FC.>".into(),
        // Stream info of the streams it publishes to (checks at start).
        format!("$JS.API.STREAM.INFO.{}", subjects::RESULTS_STREAM),
        format!("$JS.API.STREAM.INFO.{}", subjects::EVENTS_STREAM),
        format!("$JS.API.STREAM.INFO.{MEASUREMENTS_STREAM}"),
        format!("$JS.API.STREAM.INFO.{TASKS_STREAM}"),
        // A resumed session continues its agent's event sequence.
        format!("$JS.API.STREAM.MSG.GET.{}", subjects::EVENTS_STREAM),
        format!("$JS.API.DIRECT.GET.{}", subjects::EVENTS_STREAM),
        format!("$JS.API.DIRECT.GET.{}.>", subjects::EVENTS_STREAM),
    ];
    // Its liveness key, which keeps its slice claims.
    publish.push(format!("$KV.{LEASES_BUCKET}.daemon.{worker_id}"));
    for slice_id in slice_ids {
        publish.push(format!("$KV.{LEASES_BUCKET}.{slice_id}"));
        publish.push(format!("$KV.{QUARANTINE_BUCKET}.{slice_id}"));
    }
    // The daemon's one task consumer, and the per-slice consumers of an
    // earlier version, which it may only remove.
    let name = format!("tasks-{worker_id}");
    publish.extend([
        format!("$JS.API.CONSUMER.CREATE.{TASKS_STREAM}.{name}"),
        format!("$JS.API.CONSUMER.CREATE.{TASKS_STREAM}.{name}.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{TASKS_STREAM}.{name}"),
        format!("$JS.API.CONSUMER.INFO.{TASKS_STREAM}.{name}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{TASKS_STREAM}.{name}"),
        format!("$JS.ACK.{TASKS_STREAM}.{name}.>"),
    ]);
    publish.extend(
        slice_ids
            .iter()
            .map(|s| format!("$JS.API.CONSUMER.DELETE.{TASKS_STREAM}.tasks-{worker_id}-{s}")),
    );
    for bucket in [
        LEASES_BUCKET,
        WORKERS_BUCKET,
        QUARANTINE_BUCKET,
        CHECKPOINTS_BUCKET,
        APPROVALS_BUCKET,
    ] {
        read_bucket(bucket, &mut publish);
    }
    // Reading the measurements (query_results, job_observations): what a
    // client may read too. Writing stays the subject of its own records.
    read_stream(MEASUREMENTS_STREAM, &mut publish);
    publish.push(format!("$JS.API.CONSUMER.MSG.NEXT.{MEASUREMENTS_STREAM}.>"));
    Permissions {
        publish,
        subscribe: vec![
            format!("{}.>", worker_inbox_prefix(worker_id)),
            format!("{}.approval.decision.>", subjects::PREFIX),
        ],
    }
}

/// A client reading measurements (`mtswarm results`).
pub fn client() -> Permissions {
    let stream = MEASUREMENTS_STREAM;
    let mut publish = vec!["$JS.API.INFO".to_string()];
    read_stream(stream, &mut publish);
    publish.extend([
        format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("$JS.ACK.{stream}.>"),
        "$JS.FC.>".into(),
    ]);
    Permissions {
        publish,
        subscribe: vec![format!("{CLIENT_INBOX_PREFIX}.>")],
    }
}

/// One nkey user of the server configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NkeyUser {
    /// Public nkey (`U...`).
    pub public_key: String,
    /// What the user may publish and subscribe to.
    pub permissions: Permissions,
}

fn quoted_list(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("[{}]", quoted.join(", "))
}

/// The nats-server `authorization { users = [...] }` block for `users`;
/// everything not allowed is denied, and a client without a known nkey
/// cannot connect.
pub fn authorization_block(users: &[NkeyUser]) -> String {
    let mut text = String::from("authorization {\n  users = [\n");
    for user in users {
        let _ = write!(
            text,
            "    {{\n      nkey: \"{}\"\n      permissions: {{\n        publish: {{ allow: {} }}\n        subscribe: {{ allow: {} }}\n      }}\n    }}\n",
            user.public_key,
            quoted_list(&user.permissions.publish),
            quoted_list(&user.permissions.subscribe),
        );
    }
    text.push_str("  ]\n}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_get_no_jetstream_wildcard_and_no_decisions_to_publish() {
        let permissions = worker("worker-b0", &["b0-c0".into(), "b0-c1".into()]);
        for subject in &permissions.publish {
            assert_ne!(subject, "$JS.API.>");
            assert!(!subject.starts_with("$JS.API.STREAM.CREATE"), "{subject}");
            assert!(!subject.starts_with("$JS.API.STREAM.DELETE"), "{subject}");
            assert!(!subject.contains("approval.decision"), "{subject}");
            assert!(!subject.contains("mtswarm_jobs"), "{subject}");
        }
        assert!(
            permissions
                .publish
                .contains(&"$KV.mtswarm_leases.b0-c1".to_string())
        );
        assert!(
            permissions
                .publish
                .contains(&"$KV.mtswarm_leases.daemon.worker-b0".to_string()),
            "{:?}",
            permissions.publish
        );
        assert!(
            !permissions
                .publish
                .iter()
                .any(|s| s == "$KV.mtswarm_leases.>")
        );
        assert_eq!(permissions.subscribe[0], "_INBOX_worker-b0.>");
        // It reads the measurements (the job's observations), and cannot
        // remove any.
        assert!(
            permissions
                .publish
                .contains(&"$JS.API.CONSUMER.CREATE.MTSWARM_MEASUREMENTS".to_string())
        );
        for subject in &permissions.publish {
            assert!(!subject.contains("PURGE"), "{subject}");
            assert!(!subject.contains("MSG.DELETE"), "{subject}");
        }
    }

    #[test]
    fn the_authorization_block_lists_every_user() {
        let block = authorization_block(&[
            NkeyUser {
                public_key: "UABC".into(),
                permissions: leader(),
            },
            NkeyUser {
                public_key: "UDEF".into(),
                permissions: client(),
            },
        ]);
        assert!(block.contains("nkey: \"UABC\""));
        assert!(block.contains("nkey: \"UDEF\""));
        assert!(block.contains("\"$JS.API.STREAM.INFO.MTSWARM_MEASUREMENTS\""));
    }
}
