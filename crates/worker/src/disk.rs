//! Disk accounting of the workspace root: what an operator types for the
//! retention and the quota (`30m`, `10GiB`), the cached usage figure that
//! SpawnSession checks against the quota, and the walk that measures a
//! root without ever following a symbolic link. The janitor
//! (`crate::janitor`) decides what to remove; this module only measures
//! and keeps the figures, so it sits low enough for the shared state to
//! hold it.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytesize::ByteSize;
use tokio::sync::watch;

use crate::config::WorkerConfig;

/// Prefix of a workspace being removed: the janitor renames a workspace to
/// `<root>/.mtswarm-removing-<pid>-<pass>-<session>` before deleting it. Session
/// ids never start with a dot, so no session can own such a name.
pub(crate) const TRASH_PREFIX: &str = ".mtswarm-removing-";

/// A size or duration the operator gave is unusable, or the workspace root
/// is over its quota.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The workspace root uses its whole quota: SpawnSession is refused
    /// (RESOURCE_EXHAUSTED) until finished sessions' workspaces are removed.
    #[error(
        "workspace root {} uses {} of its {} quota; finished sessions' workspaces are removed after {} (--workspace-retention)",
        root.display(),
        ByteSize::b(*usage),
        ByteSize::b(*quota),
        short_duration(*retention)
    )]
    QuotaExceeded {
        /// The daemon's workspace root.
        root: PathBuf,
        /// Bytes under it at the last measurement.
        usage: u64,
        /// The configured quota in bytes.
        quota: u64,
        /// How long a finished session's workspace is kept.
        retention: Duration,
    },
    /// A size (`--disk-quota`) does not parse.
    #[error("`{text}` is not a size (e.g. 10GiB, 500MB, 1048576): {reason}")]
    Size {
        /// The text as given.
        text: String,
        /// What the parser objected to.
        reason: String,
    },
    /// A duration (`--workspace-retention`) does not parse.
    #[error("`{text}` is not a duration (e.g. 30m, 24h, 7days): {source}")]
    Duration {
        /// The text as given.
        text: String,
        /// What the parser objected to.
        #[source]
        source: humantime::DurationError,
    },
}

/// Parse a disk quota: plain bytes (`1048576`) or a number with a decimal
/// (`500MB`, `10 GB`) or binary (`10GiB`) unit, case-insensitive.
pub fn parse_disk_quota(text: &str) -> Result<u64, DiskError> {
    text.trim()
        .parse::<ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|reason| DiskError::Size {
            text: text.to_owned(),
            reason,
        })
}

/// Parse a retention in humantime form (`90s`, `30m`, `24h`, `7days`).
pub fn parse_retention(text: &str) -> Result<Duration, DiskError> {
    humantime::parse_duration(text.trim()).map_err(|source| DiskError::Duration {
        text: text.to_owned(),
        source,
    })
}

/// A duration the way an operator would type it back (`24h`, `30m`, `90s`).
pub(crate) fn short_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    if duration.subsec_nanos() != 0 || secs == 0 {
        return humantime::format_duration(duration).to_string();
    }
    if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// The workspace root's usage as last measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskUsage {
    /// The daemon's workspace root.
    pub root: PathBuf,
    /// Bytes under the root at the last janitor pass (apparent sizes of
    /// every file, directory and link, links not followed).
    pub bytes: u64,
    /// The configured quota, if any.
    pub quota: Option<u64>,
}

/// A workspace the janitor removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedWorkspace {
    /// The session the workspace belonged to (its directory name).
    pub session_id: String,
    /// Bytes it held.
    pub bytes: u64,
}

/// What one janitor pass did; the daemon keeps the latest
/// (`WorkerHandle::janitor_reports`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JanitorReport {
    /// Passes run so far, this one included (0 before the first).
    pub pass: u64,
    /// Bytes under the root after the pass.
    pub usage_bytes: u64,
    /// Workspaces of finished sessions removed by this pass.
    pub removed: Vec<RemovedWorkspace>,
    /// Errors met (each was logged); none of them stops the daemon.
    pub errors: usize,
}

/// The daemon's disk figures and the janitor's bookkeeping, in the shared
/// state.
pub(crate) struct DiskState {
    root: PathBuf,
    quota: Option<u64>,
    retention: Duration,
    usage: AtomicU64,
    passes: AtomicU64,
    /// Session ids admitted since the janitor's current pass took its
    /// snapshot of the table: their workspaces may be written again, so
    /// the pass leaves them alone. Written and cleared only under the
    /// session table's lock (lock order: table, then this).
    admitted_since_snapshot: Mutex<HashSet<String>>,
    reports: watch::Sender<JanitorReport>,
}

impl DiskState {
    pub(crate) fn new(config: &WorkerConfig) -> Self {
        Self {
            root: config.workspace_root.clone(),
            quota: config.disk_quota_bytes,
            retention: config.workspace_retention,
            usage: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            admitted_since_snapshot: Mutex::new(HashSet::new()),
            reports: watch::channel(JanitorReport::default()).0,
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn retention(&self) -> Duration {
        self.retention
    }

    /// Admission of a new session (SpawnSession calls it holding the
    /// session table's lock, as it reserves the slice): refused when the
    /// root's last measured usage reaches the quota. An admitted session's
    /// id is remembered for the janitor's pass under way, and its old
    /// workspace, if one is left, is marked in use (its modification time
    /// set to now) so that no other daemon sharing the root takes it for a
    /// finished one.
    pub(crate) fn admit(&self, session_id: &str) -> Result<(), DiskError> {
        if let Some(error) = self.over_quota() {
            return Err(error);
        }
        self.admitted().insert(session_id.to_owned());
        mark_in_use(&crate::workspace::session_workspace(&self.root, session_id));
        Ok(())
    }

    /// Start a pass: forget the sessions admitted before it. Call it
    /// holding the session table's lock, with the snapshot of the table.
    pub(crate) fn begin_pass(&self) -> u64 {
        self.admitted().clear();
        self.passes.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether `session_id` was admitted since the current pass began.
    /// Call it holding the session table's lock.
    pub(crate) fn admitted_during_pass(&self, session_id: &str) -> bool {
        self.admitted().contains(session_id)
    }

    fn admitted(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.admitted_since_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_usage(&self, bytes: u64) {
        self.usage.store(bytes, Ordering::SeqCst);
    }

    /// The quota error when the last measured usage reaches the quota.
    pub(crate) fn over_quota(&self) -> Option<DiskError> {
        let usage = self.usage.load(Ordering::SeqCst);
        let quota = self.quota?;
        (usage >= quota).then(|| DiskError::QuotaExceeded {
            root: self.root.clone(),
            usage,
            quota,
            retention: self.retention,
        })
    }

    pub(crate) fn usage(&self) -> DiskUsage {
        DiskUsage {
            root: self.root.clone(),
            bytes: self.usage.load(Ordering::SeqCst),
            quota: self.quota,
        }
    }

    pub(crate) fn publish(&self, report: JanitorReport) {
        self.reports.send_replace(report);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<JanitorReport> {
        self.reports.subscribe()
    }
}

/// Set a workspace's modification time to now (a workspace that does not
/// exist yet needs nothing; any other failure only weakens the mark and is
/// logged). Only a real directory is opened: never a link (it could lead
/// out of the root) and never a FIFO or device (opening one could block
/// while SpawnSession holds the session table's lock).
pub(crate) fn mark_in_use(workspace: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let result = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY | libc::O_NONBLOCK)
        .open(workspace)
        .and_then(|dir| dir.set_modified(SystemTime::now()));
    match result {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        // A link or something that is no directory: not a workspace of ours.
        Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {}
        Err(error) => {
            tracing::warn!(%error, workspace = %workspace.display(), "workspace not marked in use");
        }
    }
}

/// What a direct child of the workspace root is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildKind {
    /// A real directory (not a link) named like a session id.
    Workspace,
    /// A real directory left by an interrupted removal ([`TRASH_PREFIX`]).
    Trash,
    /// Anything else (files, links, other directories): counted, never
    /// removed.
    Other,
}

/// One direct child of the root, measured.
#[derive(Debug, Clone)]
pub(crate) struct Child {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) kind: ChildKind,
    /// Bytes in its tree (links not followed).
    pub(crate) bytes: u64,
    /// Latest modification time in its tree; `None` when some part could
    /// not be read (such a child is never removed).
    pub(crate) newest: Option<SystemTime>,
}

/// Measure every direct child of `root`. A root that does not exist yet
/// holds nothing. Errors inside one child are logged and leave that child
/// unremovable; `errors` counts them.
pub(crate) fn scan_root(root: &Path, errors: &mut usize) -> io::Result<Vec<Child>> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut children = Vec::new();
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => {
                *errors += 1;
                tracing::warn!(%error, path = %path.display(), "workspace root entry not measured");
                continue;
            }
        };
        let is_dir = meta.file_type().is_dir();
        let kind = if !is_dir {
            ChildKind::Other
        } else if name.starts_with(TRASH_PREFIX) {
            ChildKind::Trash
        } else if mtswarm_bus::subjects::validate_id("session id", &name).is_ok() {
            ChildKind::Workspace
        } else {
            ChildKind::Other
        };
        let (bytes, newest) = if is_dir {
            measure_tree(&path, errors)
        } else {
            (meta.len(), meta.modified().ok())
        };
        children.push(Child {
            name,
            path,
            kind,
            bytes,
            newest,
        });
    }
    Ok(children)
}

/// Bytes and latest modification time of the tree at `dir` (a real
/// directory), walked without following links: a link counts as itself.
fn measure_tree(dir: &Path, errors: &mut usize) -> (u64, Option<SystemTime>) {
    let mut bytes = 0u64;
    let mut newest: Option<SystemTime> = None;
    let mut complete = true;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Some(meta) = walk_step(
            std::fs::symlink_metadata(&current),
            &current,
            "workspace entry not measured",
            &mut complete,
            errors,
        ) else {
            continue;
        };
        bytes = bytes.saturating_add(meta.len());
        if let Ok(modified) = meta.modified() {
            newest = Some(newest.map_or(modified, |n| n.max(modified)));
        }
        if !meta.file_type().is_dir() {
            continue;
        }
        let Some(entries) = walk_step(
            std::fs::read_dir(&current),
            &current,
            "workspace directory not read",
            &mut complete,
            errors,
        ) else {
            continue;
        };
        for entry in entries {
            if let Some(entry) = walk_step(
                entry,
                &current,
                "workspace directory not read",
                &mut complete,
                errors,
            ) {
                pending.push(entry.path());
            }
        }
    }
    (bytes, newest.filter(|_| complete))
}

/// The value of one file-system step of the walk; `None` when the entry is
/// gone (a session's staging copy renamed meanwhile: nothing to count) or
/// unreadable (logged as `what`, counted, the tree marked incomplete).
fn walk_step<T>(
    result: io::Result<T>,
    path: &Path,
    what: &str,
    complete: &mut bool,
    errors: &mut usize,
) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => {
            *complete = false;
            *errors += 1;
            tracing::warn!(%error, path = %path.display(), "{what}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_as_operators_type_them() {
        assert_eq!(
            parse_disk_quota("10GiB").expect("GiB"),
            10 * 1024 * 1024 * 1024
        );
        assert_eq!(parse_disk_quota("500MB").expect("MB"), 500_000_000);
        assert_eq!(parse_disk_quota(" 1048576 ").expect("bytes"), 1_048_576);
        let error = parse_disk_quota("lots").expect_err("not a size");
        assert!(
            error.to_string().contains("`lots` is not a size"),
            "{error}"
        );
        assert_eq!(
            parse_retention("30m").expect("30m"),
            Duration::from_secs(1800)
        );
        assert_eq!(
            parse_retention("24h").expect("24h"),
            Duration::from_secs(86_400)
        );
        let error = parse_retention("5").expect_err("no unit");
        assert!(
            error.to_string().contains("`5` is not a duration"),
            "{error}"
        );
        assert_eq!(short_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(short_duration(Duration::from_secs(1800)), "30m");
        assert_eq!(short_duration(Duration::from_secs(90)), "90s");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1s 500ms");
    }

    #[test]
    fn the_quota_error_names_root_usage_quota_and_retention() {
        let error = DiskError::QuotaExceeded {
            root: PathBuf::from("/x"),
            usage: 10_952_166_605,
            quota: 10 * 1024 * 1024 * 1024,
            retention: Duration::from_secs(86_400),
        };
        assert_eq!(
            error.to_string(),
            "workspace root /x uses 10.2 GiB of its 10.0 GiB quota; finished sessions' workspaces are removed after 24h (--workspace-retention)"
        );
    }

    #[cfg(unix)]
    #[test]
    fn the_walk_counts_links_as_themselves_and_classifies_children() {
        let root = tempfile::tempdir().expect("root");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("big"), vec![0u8; 100_000]).expect("big");
        let ws = root.path().join("sess-1");
        std::fs::create_dir_all(ws.join("k")).expect("ws");
        std::fs::write(ws.join("k/kernel.c"), vec![b'x'; 1000]).expect("kernel");
        std::os::unix::fs::symlink(outside.path(), ws.join("escape")).expect("inner link");
        std::os::unix::fs::symlink(outside.path(), root.path().join("linked")).expect("link");
        std::fs::create_dir(root.path().join("not a session")).expect("other dir");
        std::fs::create_dir(root.path().join(format!("{TRASH_PREFIX}3-old"))).expect("trash");
        let mut errors = 0;
        let mut children = scan_root(root.path(), &mut errors).expect("scan");
        children.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(errors, 0);
        let kinds: Vec<(&str, ChildKind)> =
            children.iter().map(|c| (c.name.as_str(), c.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (".mtswarm-removing-3-old", ChildKind::Trash),
                ("linked", ChildKind::Other),
                ("not a session", ChildKind::Other),
                ("sess-1", ChildKind::Workspace),
            ]
        );
        let workspace = &children[3];
        assert!(workspace.bytes >= 1000, "{workspace:?}");
        assert!(
            workspace.bytes < 100_000,
            "the link was followed: {workspace:?}"
        );
        assert!(workspace.newest.is_some());
        assert!(children[1].bytes < 100_000, "the root link was followed");
        let missing = root.path().join("missing");
        assert!(
            scan_root(&missing, &mut errors)
                .expect("missing root")
                .is_empty()
        );
    }

    #[test]
    fn marking_in_use_touches_real_directories_only() {
        let root = tempfile::tempdir().expect("root");
        let outside = tempfile::tempdir().expect("outside");
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let modified = |path: &Path| {
            std::fs::symlink_metadata(path)
                .and_then(|m| m.modified())
                .expect("mtime")
        };
        let set_old = |path: &Path| {
            std::fs::File::open(path)
                .and_then(|f| f.set_modified(hour_ago))
                .expect("backdate");
        };
        let ws = root.path().join("sess-1");
        std::fs::create_dir(&ws).expect("ws");
        set_old(&ws);
        set_old(outside.path());
        std::os::unix::fs::symlink(outside.path(), root.path().join("linked")).expect("link");
        std::fs::write(root.path().join("file"), "x").expect("file");
        set_old(&root.path().join("file"));

        mark_in_use(&ws);
        mark_in_use(&root.path().join("linked"));
        mark_in_use(&root.path().join("file"));
        mark_in_use(&root.path().join("missing"));
        assert!(modified(&ws) > hour_ago + Duration::from_secs(1800));
        assert_eq!(modified(outside.path()), hour_ago, "the link was followed");
        assert_eq!(modified(&root.path().join("file")), hour_ago);
    }
}
