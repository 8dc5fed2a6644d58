//! Confinement of launched kernels and of builds.
//!
//! Kernel code is written by a model rewarded for speed and runs on the
//! daemon's host: it must not read the daemon's secrets or files, reach the
//! network (NATS listens on 127.0.0.1), write outside its launch directory,
//! start processes (a fork bomb, a `setsid` child that outlives the job) or
//! poison the shared caches. Each mechanism is a well-kept kernel feature:
//!
//! - a cleared environment with an allowlist (in [`crate::process::run_confined`]);
//! - Landlock (the `landlock` crate): reads only below the allowed paths,
//!   writes only below the writable ones, no TCP bind or connect;
//! - seccomp (the `seccompiler` crate): no `socket`, and for launches no
//!   `fork`, `vfork` or process-creating `clone` (threads still work), so a
//!   launch has no descendants that could outlive it;
//! - a new network namespace when the process may create one (root, as on
//!   CI and the farm's hosts): no interface, so nothing is reachable;
//! - a new PID namespace for every spawned program ([`pidns`]), so no
//!   descendant outlives it, `setsid` or not;
//! - for builds, a process-count limit ([`pids`]: a pids cgroup, else
//!   `RLIMIT_NPROC`).
//!
//! Rulesets and filters are prepared in the parent; the child only makes the
//! async-signal-safe system calls that apply them, between fork and exec.
//! Where the kernel lacks a mechanism a warning is logged once and the other
//! layers stay in force: the sandbox never fails open silently.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Once;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::HwError;

pub mod pidns;
pub mod pids;
pub mod view;

/// Processes and threads a build command may run at once (gcc's driver,
/// cc1, as and ld need a handful).
pub const BUILD_MAX_PROCESSES: u32 = 256;

/// What a confined process may touch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// Readable trees (the toolchain's and the system libraries are added).
    pub read: Vec<PathBuf>,
    /// Readable and writable trees.
    pub write: Vec<PathBuf>,
    /// No fork/vfork/clone of processes (threads are fine): for launches.
    pub no_processes: bool,
    /// At most this many processes and threads at once ([`pids`]): for
    /// builds, which must fork but not without end.
    pub max_processes: Option<u32>,
    /// A file system of its own holding only these paths ([`view`]): for
    /// the device compile, so no host path is even visible.
    pub view: Option<view::View>,
}

/// System trees every confined program needs to start (dynamic loader,
/// libc, the compiler's own files).
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/etc/ld.so.cache",
    "/dev/null",
    "/dev/urandom",
    "/sys/devices/system/cpu",
];

/// Writable by every confined program: compilers and shells send output
/// they do not want there.
const SYSTEM_WRITE: &[&str] = &["/dev/null"];

/// A policy prepared for one spawn: the Landlock ruleset fd and the seccomp
/// programs, ready to apply in the child.
#[derive(Debug)]
pub struct Prepared {
    landlock: Option<OwnedFd>,
    filters: Vec<BpfProgram>,
    view: Option<view::PreparedView>,
}

fn warn_once(once: &'static Once, what: &str, why: &str) {
    once.call_once(|| {
        tracing::warn!(
            "sandbox: {what} is not available on this host ({why}); launches and builds keep \
             the other confinement layers"
        );
    });
}

static LANDLOCK_MISSING: Once = Once::new();
static SECCOMP_MISSING: Once = Once::new();

impl Policy {
    /// Build the ruleset, filters and view (in the parent, before
    /// spawning a program that will run in `cwd`).
    pub fn prepare(&self, cwd: &Path) -> Result<Prepared, HwError> {
        let view = match &self.view {
            Some(v) if view::available() => Some(v.prepare(cwd)?),
            _ => None,
        };
        // Landlock rules follow the host's directory tree, which a view
        // replaces; the view is the stricter of the two (read-only binds,
        // nothing else present), so it stands instead.
        let landlock = if view.is_some() {
            None
        } else {
            self.landlock_ruleset()
        };
        Ok(Prepared {
            landlock,
            filters: self.filters()?,
            view,
        })
    }

    fn landlock_ruleset(&self) -> Option<OwnedFd> {
        let abi = ABI::V5;
        let build = || -> Result<Option<OwnedFd>, landlock::RulesetError> {
            let read_paths = SYSTEM_READ
                .iter()
                .map(PathBuf::from)
                .chain(self.read.iter().cloned())
                .filter(|p| p.exists());
            let created = Ruleset::default()
                .set_compatibility(CompatLevel::BestEffort)
                .handle_access(AccessFs::from_all(abi))?
                .handle_access(AccessNet::from_all(abi))?
                .create()?
                .add_rules(path_beneath_rules(
                    read_paths,
                    AccessFs::from_read(abi) | AccessFs::Execute,
                ))?
                .add_rules(path_beneath_rules(
                    self.write
                        .iter()
                        .map(PathBuf::as_path)
                        .chain(SYSTEM_WRITE.iter().map(Path::new))
                        .filter(|p| p.exists()),
                    AccessFs::from_all(abi),
                ))?;
            Ok(created.into())
        };
        match build() {
            Ok(Some(fd)) => Some(fd),
            Ok(None) => {
                warn_once(
                    &LANDLOCK_MISSING,
                    "Landlock",
                    "the kernel does not enable it",
                );
                None
            }
            Err(e) => {
                warn_once(&LANDLOCK_MISSING, "Landlock", &e.to_string());
                None
            }
        }
    }

    fn filters(&self) -> Result<Vec<BpfProgram>, HwError> {
        let arch = match TargetArch::try_from(std::env::consts::ARCH) {
            Ok(arch) => arch,
            Err(e) => {
                warn_once(&SECCOMP_MISSING, "seccomp", &format!("{e:?}"));
                return Ok(Vec::new());
            }
        };
        let err = |e: seccompiler::BackendError| {
            HwError::launch_caused(format!("seccomp filter: {e}"), e)
        };
        let mut denied: std::collections::BTreeMap<i64, Vec<SeccompRule>> = Default::default();
        denied.insert(libc::SYS_socket, Vec::new());
        denied.insert(libc::SYS_socketpair, Vec::new());
        let mut filters = Vec::new();
        if self.no_processes {
            #[cfg(target_arch = "x86_64")]
            {
                denied.insert(libc::SYS_fork, Vec::new());
                denied.insert(libc::SYS_vfork, Vec::new());
            }
            // clone without CLONE_THREAD creates a process.
            let no_thread = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
                0,
            )
            .map_err(err)?;
            denied.insert(
                libc::SYS_clone,
                vec![SeccompRule::new(vec![no_thread]).map_err(err)?],
            );
            // clone3 passes its flags in memory a filter cannot read: it
            // answers ENOSYS, and the C library falls back to clone.
            let mut clone3: std::collections::BTreeMap<i64, Vec<SeccompRule>> = Default::default();
            clone3.insert(libc::SYS_clone3, Vec::new());
            filters.push(deny_with(clone3, libc::ENOSYS, arch)?);
        }
        filters.push(deny_with(denied, libc::EPERM, arch)?);
        Ok(filters)
    }
}

/// A filter that lets every system call through except those of `rules`,
/// which fail with `errno`.
fn deny_with(
    rules: std::collections::BTreeMap<i64, Vec<SeccompRule>>,
    errno: i32,
    arch: TargetArch,
) -> Result<BpfProgram, HwError> {
    let err =
        |e: seccompiler::BackendError| HwError::launch_caused(format!("seccomp filter: {e}"), e);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// Whether this process may create a network namespace (checked once, in a
/// throw-away child, so the answer is known before any launch relies on it).
pub fn network_namespaces_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        may_unshare(
            (libc::CLONE_NEWNET, "CLONE_NEWNET"),
            "a network namespace",
            "launches and builds keep the other confinement layers",
        )
    })
}

/// Whether this process may `unshare` the namespace `flag` (its value and
/// its name), tried in a throw-away child (callers keep the answer: the
/// probe forks). When it may not, a warning says that `what` is missing and
/// what the sandbox does `without` it.
pub(crate) fn may_unshare(
    (flag, flag_name): (libc::c_int, &str),
    what: &str,
    without: &str,
) -> bool {
    // SAFETY: the child only calls unshare and _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = unsafe { libc::unshare(flag) } == 0;
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut ok = false;
    if pid > 0 {
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    }
    if !ok {
        tracing::warn!(
            "sandbox: {what} is not available on this host (unshare({flag_name}) is refused \
             without CAP_SYS_ADMIN); {without}"
        );
    }
    ok
}

/// How many descriptors a process may have open (`RLIMIT_NOFILE`, at most
/// 65536; 1024 when unknown): the range a child closes when the kernel
/// lacks `close_range`. Async-signal-safe.
pub(crate) fn descriptor_limit() -> libc::c_int {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system call writing only `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        limit.rlim_cur.min(1 << 16) as libc::c_int
    } else {
        1024
    }
}

impl Prepared {
    /// Apply in the child between fork and exec. Only async-signal-safe
    /// system calls; the first failure is returned (the spawn fails, which
    /// is never silent).
    pub fn apply_in_child(&self, new_netns: bool) -> std::io::Result<()> {
        if let Some(view) = &self.view {
            view.apply_in_child()?;
        }
        if new_netns {
            // SAFETY: plain system call.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: plain system calls on a valid ruleset fd.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = &self.landlock
                && libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        for filter in &self.filters {
            seccompiler::apply_filter(filter)
                .map_err(|e| std::io::Error::other(format!("seccomp: {e}")))?;
        }
        Ok(())
    }
}

/// Where `program` is: itself when it is a path, else the first match on
/// `search_path`.
pub fn find_program(program: &str, search_path: Option<&str>) -> Option<PathBuf> {
    if program.contains('/') {
        Some(PathBuf::from(program))
    } else {
        std::env::split_paths(search_path?)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    }
}

/// The install tree of a toolchain program (`/opt/cc/bin/gcc` -> `/opt/cc`,
/// a wrapper script -> its directory), which its build steps must read. A
/// bare name is looked up in `search_path` (the step's `PATH`).
pub fn toolchain_root(program: &str, search_path: Option<&str>) -> Option<PathBuf> {
    let found = find_program(program, search_path)?;
    let dir = std::fs::canonicalize(found).ok()?.parent()?.to_path_buf();
    match dir.file_name() {
        Some(name) if name == "bin" => dir.parent().map(Path::to_path_buf),
        _ => Some(dir),
    }
}

/// The policy of a launch in `dir`: it reads and writes its own directory
/// and reads the system libraries; no processes, no network.
pub fn launch_policy(dir: &Path) -> Policy {
    Policy {
        read: Vec::new(),
        write: vec![dir.to_path_buf()],
        no_processes: true,
        max_processes: None,
        view: None,
    }
}

/// The policy of a build step: reads `read` (kernel directory, emulator
/// headers and runtime) and the toolchain, writes `cwd`; no network.
pub fn build_policy(cwd: &Path, read: &[PathBuf]) -> Policy {
    Policy {
        read: read.to_vec(),
        write: vec![cwd.to_path_buf()],
        no_processes: false,
        max_processes: Some(BUILD_MAX_PROCESSES),
        view: None,
    }
}
