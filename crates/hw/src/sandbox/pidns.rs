//! A fresh PID namespace for every confined program, so that nothing it
//! starts outlives it.
//!
//! A process group is not enough: `setsid` leaves it, and a daemonised
//! grandchild of a build survives the group kill. When the first process of
//! a PID namespace (its init) exits, the kernel kills every other process of
//! the namespace, whatever group or session it moved to.
//!
//! Between fork and exec the spawned child (A, the daemon's direct child)
//! unshares a PID namespace and forks its init (B, pid 1), which forks the
//! program (C) and returns to `exec` in C only:
//!
//! - C has ordinary signal semantics (a namespace init ignores signals it has
//!   no handler for, so `abort()` in pid 1 would not end it as SIGABRT);
//! - B reaps orphans while C runs, sends C's wait status to A through a
//!   pipe, then exits, which kills what is left in the namespace; B has
//!   `PR_SET_PDEATHSIG = SIGKILL`, so killing A (time-out, cancelled run)
//!   ends B and with it the whole namespace;
//! - A ends the way C ended: the same exit code, or the same signal.
//!
//! `std::process` reports a failed `exec` through a close-on-exec pipe: A
//! and B close every descriptor they inherited, so only C holds that pipe,
//! and a missing program is still reported as the spawn's error.
//!
//! Where the kernel refuses the namespace (no `CAP_SYS_ADMIN`, e.g. a
//! restricted pod), a warning is logged once and the process-group kill
//! stays the only guard.

use std::sync::OnceLock;

/// Whether this process may create PID namespaces (checked once, in a
/// throw-away child, so the answer is known before any spawn relies on it).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        super::may_unshare(
            (libc::CLONE_NEWPID, "CLONE_NEWPID"),
            "a PID namespace",
            "a build's or launch's descendants are killed by process group only, and one that \
             calls setsid can outlive it",
        )
    })
}

/// Close every descriptor except `keep` (async-signal-safe).
fn close_all_except(keep: libc::c_int) {
    // SAFETY: plain system calls on descriptors of this (forked) process.
    unsafe {
        let first = if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (keep - 1) as u32, 0u32)
        } else {
            0
        };
        let rest = libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
        if first == 0 && rest == 0 {
            return;
        }
        // Kernels before 5.9 lack close_range.
        let max = super::descriptor_limit();
        for fd in 0..max {
            if fd != keep {
                libc::close(fd);
            }
        }
    }
}

/// `waitpid` retried on EINTR; the wait status, or `None` on error.
fn wait_for(pid: libc::pid_t) -> Option<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: plain system call writing only `status`.
        let got = unsafe { libc::waitpid(pid, &mut status, 0) };
        if got >= 0 {
            return Some((got, status));
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// End this process the way the wait status `status` says its program
/// ended: the same exit code, or the same signal.
fn exit_like(status: libc::c_int) -> ! {
    // SAFETY: signal, kill, getpid and _exit are async-signal-safe.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        })
    }
}

/// Enter a new PID namespace between fork and exec (see the module docs).
/// Returns in the program's process only; an error is the spawn's error.
///
/// # Safety
/// Only in a `pre_exec` closure: the caller is a freshly forked child and
/// this function makes async-signal-safe system calls only.
pub unsafe fn enter_in_child() -> std::io::Result<()> {
    let last = std::io::Error::last_os_error;
    // SAFETY: async-signal-safe system calls in a forked child.
    unsafe {
        if libc::unshare(libc::CLONE_NEWPID) != 0 {
            return Err(last());
        }
        // The daemon's SIGCHLD handler (tokio's) must not run in A or B.
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut fds = [0 as libc::c_int; 2];
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(last());
        }
        let (status_read, status_write) = (fds[0], fds[1]);
        let init = libc::fork();
        if init < 0 {
            return Err(last());
        }
        if init > 0 {
            // A: wait for the namespace, end like the program.
            close_all_except(status_read);
            let mut buf = [0u8; 4];
            let mut got = 0usize;
            while got < buf.len() {
                let n = libc::read(status_read, buf[got..].as_mut_ptr().cast(), buf.len() - got);
                if n > 0 {
                    got += n as usize;
                } else if n == 0
                    || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)
                {
                    break;
                }
            }
            let init_status = wait_for(init).map_or(libc::SIGKILL, |(_, s)| s);
            exit_like(if got == buf.len() {
                libc::c_int::from_ne_bytes(buf)
            } else {
                // B died before reporting (killed with the process group).
                init_status
            });
        }
        // B: pid 1 of the namespace.
        libc::close(status_read);
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(last());
        }
        let program = libc::fork();
        if program < 0 {
            // B still holds std's exec-error pipe: the spawn reports this.
            return Err(last());
        }
        if program > 0 {
            close_all_except(status_write);
            let status = loop {
                // Orphans of the namespace are reaped here too.
                match wait_for(-1) {
                    Some((pid, status)) if pid == program => break status,
                    Some(_) => {}
                    None => break libc::SIGKILL,
                }
            };
            let bytes = status.to_ne_bytes();
            libc::write(status_write, bytes.as_ptr().cast(), bytes.len());
            // Exiting kills everything left in the namespace.
            libc::_exit(0);
        }
        // C: the program.
        libc::close(status_write);
        Ok(())
    }
}
