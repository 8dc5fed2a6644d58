//! A process-count limit for builds.
//!
//! A launch cannot create processes at all (seccomp), but a build runs a
//! compiler driver that must fork, so a build whose compiler forks without
//! end would exhaust the host's process table and take the daemon with it.
//! Each build command gets its own pids cgroup (`pids.max`), created under
//! the daemon's own group in the cgroup v1 `pids` hierarchy or in cgroup v2,
//! and removed when the command has ended. Without a writable cgroup, a
//! non-root daemon lowers `RLIMIT_NPROC` instead (it counts all processes of
//! the user, so the limit is what the user runs now plus the allowance); a
//! root daemon, which the kernel exempts from that limit, logs a warning
//! once and keeps the other layers.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

static NO_LIMIT: Once = Once::new();
static NOT_REMOVED: Once = Once::new();

/// The limit chosen for one spawn; dropping it removes its cgroup.
#[derive(Debug)]
pub struct ProcessCap {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Cgroup {
        dir: PathBuf,
        /// `<dir>/cgroup.procs`, ready for the child to join.
        procs: CString,
    },
    Rlimit(u64),
    Unlimited,
}

/// Where new groups go: the daemon's own group in the pids hierarchy.
fn own_pids_group() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // cgroup v1 with a `pids` hierarchy first: it is where the controller
    // is on a hybrid host.
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [_, mount, "cgroup", options, ..] = fields[..]
            && options.split(',').any(|o| o == "pids")
        {
            let own = membership.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "pids")
                    .then(|| path.to_owned())
            })?;
            return Some(Path::new(mount).join(own.trim_start_matches('/')));
        }
    }
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [_, mount, "cgroup2", ..] = fields[..] {
            let own = membership.lines().find_map(|l| l.strip_prefix("0::"))?;
            return Some(Path::new(mount).join(own.trim_start_matches('/')));
        }
    }
    None
}

/// A new group below `parent` holding at most `max` tasks.
fn create_group(parent: &Path, max: u32) -> std::io::Result<PathBuf> {
    let dir = parent.join(format!(
        "mtswarm-build-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir(&dir)?;
    let limit = dir.join("pids.max");
    if !limit.exists() {
        // cgroup v2: the controller must be enabled for children first.
        let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+pids");
    }
    match std::fs::write(&limit, max.to_string()) {
        Ok(()) => Ok(dir),
        Err(e) => {
            let _ = std::fs::remove_dir(&dir);
            Err(e)
        }
    }
}

/// Tasks of this user now (what `RLIMIT_NPROC` counts).
fn user_tasks() -> u64 {
    // SAFETY: plain system call.
    let uid = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().as_bytes().iter().all(u8::is_ascii_digit))
        .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
        .map(|e| std::fs::read_dir(e.path().join("task")).map_or(1, |t| t.count() as u64))
        .sum()
}

impl ProcessCap {
    /// At most `max` processes and threads for one build command.
    pub fn new(max: u32) -> Self {
        let cgroup = own_pids_group().ok_or_else(|| "no pids cgroup hierarchy".to_owned());
        let created = cgroup.and_then(|parent| {
            create_group(&parent, max).map_err(|e| format!("{}: {e}", parent.display()))
        });
        let why = match created {
            Ok(dir) => match CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()) {
                Ok(procs) => {
                    return Self {
                        kind: Kind::Cgroup { dir, procs },
                    };
                }
                Err(e) => e.to_string(),
            },
            Err(why) => why,
        };
        // SAFETY: plain system call.
        if unsafe { libc::geteuid() } != 0 {
            return Self {
                kind: Kind::Rlimit(user_tasks() + u64::from(max)),
            };
        }
        NO_LIMIT.call_once(|| {
            tracing::warn!(
                "sandbox: no process-count limit for builds on this host (no writable pids \
                 cgroup: {why}; RLIMIT_NPROC does not bind root); builds keep the other \
                 confinement layers"
            );
        });
        Self {
            kind: Kind::Unlimited,
        }
    }

    /// The cgroup directory, when the limit is a cgroup.
    pub fn cgroup(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Cgroup { dir, .. } => Some(dir),
            _ => None,
        }
    }

    /// Apply in the child between fork and exec, before it forks anything:
    /// join the group (writing 0 to `cgroup.procs` moves the writer) or
    /// lower `RLIMIT_NPROC`. Only async-signal-safe system calls.
    pub fn apply_in_child(&self) -> std::io::Result<()> {
        match &self.kind {
            Kind::Cgroup { procs, .. } => {
                // SAFETY: open/write/close on a path prepared in the parent.
                unsafe {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(err);
                    }
                }
                Ok(())
            }
            Kind::Rlimit(max) => {
                let mut current = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: getrlimit/setrlimit write/read only these structs.
                unsafe {
                    if libc::getrlimit(libc::RLIMIT_NPROC, &mut current) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let value = (*max as libc::rlim_t).min(current.rlim_max);
                    let limit = libc::rlimit {
                        rlim_cur: value,
                        rlim_max: value,
                    };
                    if libc::setrlimit(libc::RLIMIT_NPROC, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            }
            Kind::Unlimited => Ok(()),
        }
    }
}

/// Kill whatever is still in the group at `dir`.
fn kill_members(dir: &Path) {
    // cgroup v2 kills a whole group in one write.
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: plain system call; ESRCH for one already gone is fine.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

impl Drop for ProcessCap {
    fn drop(&mut self) {
        let Kind::Cgroup { dir, .. } = &self.kind else {
            return;
        };
        // The command has been waited for, and its PID namespace took its
        // descendants along; a group that is still busy holds processes
        // that are dying or escaped the namespace (no namespace here). A
        // few quick tries cover the usual case; a loaded host can take
        // longer to reap the killed, and the drop must not hold the caller
        // up that long, so a thread of its own keeps trying.
        match remove_group(dir, QUICK_TRIES) {
            Removal::Done => {}
            Removal::Busy => {
                let dir = dir.clone();
                let spawned = std::thread::Builder::new()
                    .name("cgroup-removal".into())
                    .spawn(move || {
                        if matches!(remove_group(&dir, PATIENT_TRIES), Removal::Busy) {
                            NOT_REMOVED.call_once(|| {
                                tracing::warn!(
                                    "sandbox: the build cgroup {} still holds processes after they were killed",
                                    dir.display()
                                );
                            });
                        }
                    });
                if let Err(error) = spawned {
                    tracing::warn!(%error, "sandbox: cannot start the cgroup removal thread");
                }
            }
        }
    }
}

/// Tries of [`ProcessCap`]'s drop itself (about 0.1 s).
const QUICK_TRIES: u32 = 20;
/// Tries of the thread that takes over (about 30 s more).
const PATIENT_TRIES: u32 = 3000;

/// How removing a build cgroup ended.
enum Removal {
    /// Removed, gone already, or not removable at all (logged once).
    Done,
    /// Still holding processes after every try.
    Busy,
}

/// Removes the group `dir`, killing what is left in it between `tries`
/// tries (1 ms apart at first, then 10 ms).
fn remove_group(dir: &Path, tries: u32) -> Removal {
    for attempt in 0..tries {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Removal::Done,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                kill_members(dir);
                std::thread::sleep(Duration::from_millis(if attempt < 10 { 1 } else { 10 }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Removal::Done,
            Err(e) => {
                NOT_REMOVED.call_once(|| {
                    tracing::warn!(
                        "sandbox: cannot remove the build cgroup {}: {e}",
                        dir.display()
                    );
                });
                return Removal::Done;
            }
        }
    }
    Removal::Busy
}
