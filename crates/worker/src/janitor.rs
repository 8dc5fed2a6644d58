//! The janitor keeps a worker's disk from growing without bound: it
//! removes the workspaces (kernel copies and build outputs) of finished
//! sessions once they are older than `workspace_retention`, and refreshes
//! the usage figure that SpawnSession checks against `disk_quota_bytes`.
//! It runs once as the daemon starts (leftovers of a previous process) and
//! then every quarter of the retention (between 500 ms and a minute).
//!
//! # What it may remove
//!
//! Only a direct child of the workspace root that is a real directory (its
//! `symlink_metadata`, never a link, so nothing outside the root is
//! reached), is named like a session id, belongs to no session in the
//! table (running or being started), and whose whole tree was last
//! modified longer than the retention ago. Removal itself does not follow
//! links either (`remove_dir_all` deletes a link, not its target). Every
//! removal is logged with its session id and size; errors are logged and
//! counted, never fatal.
//!
//! # The race with a session starting under the same id
//!
//! A pass measures the root without holding the session table's lock, so
//! a session may be spawned under a directory's name meanwhile (a moved
//! session keeps its id). Three rules keep such a session's files:
//! - the pass snapshots the live sessions and begins under the table's
//!   lock, and SpawnSession admits a session (`DiskState::admit`) under the
//!   same lock as it reserves the slice, so every session is either in the
//!   snapshot or recorded as admitted during the pass, and the pass skips
//!   both;
//! - right before removing, under the table's lock again, the pass checks
//!   the table and that record once more and renames the directory to a
//!   trash name (`.mtswarm-removing-...`) that no session id can take; the
//!   slow delete runs after the lock is released, on the trash name. A
//!   session admitted after the rename finds no directory and starts with
//!   a fresh copy of its kernel, which is what an expired workspace means;
//! - a daemon sharing the root cannot see this daemon's table, so this
//!   daemon marks the workspaces of its live sessions in use every pass,
//!   and each admitted one at once (modification time = now): to every
//!   janitor they look fresh. Right before the rename the directory's own
//!   time is read again, which catches a session admitted by another
//!   daemon since the walk. Daemons sharing a root also share its quota.

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytesize::ByteSize;

use crate::disk::DiskState;
use crate::disk::{
    Child, ChildKind, JanitorReport, RemovedWorkspace, TRASH_PREFIX, mark_in_use, scan_root,
};
use crate::slices::{Slices, Table};

/// How often the janitor runs for a retention: a quarter of it, between
/// 500 ms (tests) and a minute, so a live session's workspace is marked in
/// use well within every retention.
pub(crate) fn interval_for(retention: Duration) -> Duration {
    (retention / 4).clamp(Duration::from_millis(500), Duration::from_secs(60))
}

/// What the janitor works with: the workspace root's bookkeeping and the
/// session table (a live session's workspace is never removed).
#[derive(Clone)]
pub(crate) struct Janitor {
    pub(crate) disk: Arc<DiskState>,
    pub(crate) slices: Arc<Slices>,
}

/// The janitor's loop (the daemon runs the first pass itself, before it
/// serves).
pub(crate) async fn run(janitor: Arc<Janitor>) {
    let every = interval_for(janitor.disk.retention());
    loop {
        tokio::time::sleep(every).await;
        run_pass(&janitor).await;
    }
}

/// One pass, off the async threads (it walks the file system).
pub(crate) async fn run_pass(janitor: &Arc<Janitor>) {
    let janitor = janitor.clone();
    if let Err(error) = tokio::task::spawn_blocking(move || pass(&janitor)).await {
        tracing::warn!(%error, "workspace janitor pass did not finish");
    }
}

/// Ids of the sessions the table knows: running, and being started (their
/// slice is reserved before their workspace exists).
fn live_ids(table: &Table) -> HashSet<String> {
    table
        .sessions
        .keys()
        .cloned()
        .chain(table.slice_owner.iter().flatten().cloned())
        .collect()
}

fn is_live(table: &Table, session_id: &str) -> bool {
    table.sessions.contains_key(session_id)
        || table
            .slice_owner
            .iter()
            .any(|owner| owner.as_deref() == Some(session_id))
}

/// Whether `time` is at least `retention` before `now` (a time in the
/// future is fresh).
fn expired(time: SystemTime, now: SystemTime, retention: Duration) -> bool {
    now.duration_since(time).is_ok_and(|age| age >= retention)
}

fn pass(janitor: &Janitor) {
    let disk = &janitor.disk;
    let root = disk.root();
    let retention = disk.retention();
    let (pass, live) = {
        let table = janitor.slices.table();
        (disk.begin_pass(), live_ids(&table))
    };
    for session_id in &live {
        mark_in_use(&crate::workspace::session_workspace(root, session_id));
    }
    let mut report = JanitorReport {
        pass,
        ..JanitorReport::default()
    };
    let children = match scan_root(root, &mut report.errors) {
        Ok(children) => children,
        Err(error) => {
            report.errors += 1;
            tracing::warn!(%error, root = %root.display(), "workspace root not measured");
            report.usage_bytes = disk.usage().bytes;
            disk.publish(report);
            return;
        }
    };
    let mut usage: u64 = children.iter().map(|c| c.bytes).sum();
    disk.set_usage(usage);
    let now = SystemTime::now();
    for child in &children {
        let removed = match child.kind {
            ChildKind::Trash => remove_trash(&child.path),
            ChildKind::Workspace
                if !live.contains(&child.name)
                    && child.newest.is_some_and(|t| expired(t, now, retention)) =>
            {
                remove_workspace(janitor, child, pass, now)
            }
            ChildKind::Workspace | ChildKind::Other => Ok(false),
        };
        match removed {
            Ok(false) => {}
            Ok(true) => {
                usage = usage.saturating_sub(child.bytes);
                disk.set_usage(usage);
                if child.kind == ChildKind::Trash {
                    tracing::info!(path = %child.path.display(), bytes = child.bytes, "removed the rest of an interrupted workspace removal ({})", ByteSize::b(child.bytes));
                } else {
                    tracing::info!(session.id = %child.name, bytes = child.bytes, "removed the workspace of finished session {} ({})", child.name, ByteSize::b(child.bytes));
                    report.removed.push(RemovedWorkspace {
                        session_id: child.name.clone(),
                        bytes: child.bytes,
                    });
                }
            }
            Err(error) => {
                report.errors += 1;
                tracing::warn!(%error, path = %child.path.display(), "workspace not removed");
            }
        }
    }
    report.usage_bytes = usage;
    match disk.over_quota() {
        Some(error) => tracing::warn!("{error}; SpawnSession is refused until usage drops"),
        None => tracing::debug!(
            root = %root.display(),
            bytes = usage,
            removed = report.removed.len(),
            "workspace janitor pass {pass}"
        ),
    }
    disk.publish(report);
}

/// Remove a finished session's workspace if, under the table's lock, it
/// still belongs to no session and still looks finished; `Ok(false)` when
/// it was kept.
fn remove_workspace(
    janitor: &Janitor,
    child: &Child,
    pass: u64,
    now: SystemTime,
) -> io::Result<bool> {
    let trash = janitor.disk.root().join(format!(
        "{TRASH_PREFIX}{}-{pass}-{}",
        std::process::id(),
        child.name
    ));
    {
        let table = janitor.slices.table();
        if is_live(&table, &child.name) || janitor.disk.admitted_during_pass(&child.name) {
            return Ok(false);
        }
        // Still a real directory (not replaced by a link), and not marked
        // in use by a daemon sharing the root since the walk.
        let meta = match std::fs::symlink_metadata(&child.path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(error),
        };
        if !meta.file_type().is_dir() || !expired(meta.modified()?, now, janitor.disk.retention()) {
            return Ok(false);
        }
        match std::fs::rename(&child.path, &trash) {
            Ok(()) => {}
            // Another daemon sharing the root took it first.
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(error),
        }
    }
    remove_trash(&trash)
}

/// Delete a trash directory: a real directory directly under the root
/// whose name carries [`TRASH_PREFIX`]; `Ok(false)` when it is gone
/// already (a daemon sharing the root removed it).
fn remove_trash(path: &Path) -> io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error),
    };
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory; not removed",
            path.display()
        )));
    }
    std::fs::remove_dir_all(path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_is_a_quarter_of_the_retention_within_bounds() {
        assert_eq!(
            interval_for(Duration::from_secs(86_400)),
            Duration::from_secs(60)
        );
        assert_eq!(
            interval_for(Duration::from_secs(60)),
            Duration::from_secs(15)
        );
        assert_eq!(
            interval_for(Duration::from_secs(1)),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn only_times_older_than_the_retention_expire() {
        let now = SystemTime::now();
        let hour = Duration::from_secs(3600);
        assert!(expired(now - 2 * hour, now, hour));
        assert!(!expired(now - hour / 2, now, hour));
        assert!(!expired(now + hour, now, hour));
    }
}
