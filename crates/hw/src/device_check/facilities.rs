//! Why a kernel cannot have what it calls: the reasons given when device
//! code links against a host facility.
//!
//! Under the emulator device code is linked with nothing but the device
//! contract (`crate::emu::contract`), so such a call cannot build; these
//! reasons make the link error say what the board offers instead.

/// Host facilities device code may call, each group with the reason none
/// of them is on the board. A symbol belongs to the first group that names
/// it or one of whose prefixes it starts with.
struct Facility {
    names: &'static [&'static str],
    prefixes: &'static [&'static str],
    reason: &'static str,
}

const FACILITIES: &[Facility] = &[
    Facility {
        names: &[
            "fopen",
            "fopen64",
            "fdopen",
            "freopen",
            "fclose",
            "fread",
            "fwrite",
            "fgets",
            "fputs",
            "fgetc",
            "fputc",
            "fprintf",
            "fscanf",
            "fseek",
            "ftell",
            "fflush",
            "open",
            "open64",
            "openat",
            "creat",
            "read",
            "write",
            "pread",
            "pwrite",
            "close",
            "lseek",
            "unlink",
            "rename",
            "mkdir",
            "rmdir",
            "stat",
            "fstat",
            "lstat",
            "access",
            "opendir",
            "readdir",
            "mmap",
            "munmap",
            "chdir",
            "getcwd",
            "remove",
            "tmpfile",
            "puts",
            "printf",
            "putchar",
            "__isoc99_fscanf",
            "__isoc99_scanf",
            "scanf",
            "__printf_chk",
            "__fprintf_chk",
            "__read_chk",
            "__open_2",
            "truncate",
            "ftruncate",
            "symlink",
            "link",
            "readlink",
        ],
        prefixes: &[],
        reason: "DSP cores have no file system (and no standard output: use hthread_printf)",
    },
    Facility {
        names: &["thrd_create"],
        prefixes: &["pthread_", "sem_"],
        reason: "a DSP core runs one hthread and cannot start host threads or take host locks",
    },
    Facility {
        names: &[
            "fork",
            "vfork",
            "clone",
            "execve",
            "execv",
            "execvp",
            "execl",
            "execlp",
            "system",
            "popen",
            "pclose",
            "posix_spawn",
            "posix_spawnp",
            "waitpid",
            "wait",
            "setsid",
            "kill",
            "exit",
            "_exit",
            "abort",
            "atexit",
        ],
        prefixes: &[],
        reason: "DSP cores cannot start, signal or end host processes",
    },
    Facility {
        names: &[
            "socket",
            "connect",
            "bind",
            "listen",
            "accept",
            "send",
            "sendto",
            "recv",
            "recvfrom",
            "getaddrinfo",
            "gethostbyname",
            "inet_pton",
            "inet_addr",
            "htons",
            "setsockopt",
        ],
        prefixes: &[],
        reason: "DSP cores have no network",
    },
    Facility {
        names: &[
            "signal",
            "sigaction",
            "raise",
            "alarm",
            "setitimer",
            "sigprocmask",
            "pause",
            "sleep",
            "usleep",
            "nanosleep",
        ],
        prefixes: &[],
        reason: "DSP cores have no signals or host timers",
    },
    Facility {
        names: &[
            "clock_gettime",
            "gettimeofday",
            "time",
            "clock",
            "times",
            "getrusage",
            "__rdtsc",
        ],
        prefixes: &[],
        reason: "host clocks are not the board's time: use get_clk (the modeled cycle counter)",
    },
    Facility {
        names: &["dlopen", "dlsym", "dlclose", "dlvsym"],
        prefixes: &[],
        reason: "DSP cores have no dynamic loading",
    },
    Facility {
        names: &[
            "getenv",
            "secure_getenv",
            "setenv",
            "unsetenv",
            "putenv",
            "environ",
            "__environ",
        ],
        prefixes: &[],
        reason: "DSP cores have no environment",
    },
    Facility {
        names: &[
            "malloc",
            "calloc",
            "realloc",
            "free",
            "aligned_alloc",
            "posix_memalign",
            "memalign",
            "valloc",
            "alloca",
        ],
        prefixes: &[],
        reason: "DSP cores have no host heap: use scalar_malloc (SM), vector_malloc (AM) or memory \
                 the host allocated with hthread_malloc (DDR)",
    },
    Facility {
        names: &["syscall"],
        prefixes: &["__tsan_atomic"],
        reason: "system calls and atomics are not part of the device libraries",
    },
];

/// Why device code cannot call `symbol`, when it is a host facility (files,
/// threads, processes, network, signals, clocks, environment, host heap).
pub fn host_facility_reason(symbol: &str) -> Option<&'static str> {
    FACILITIES
        .iter()
        .find(|f| f.names.contains(&symbol) || f.prefixes.iter().any(|p| symbol.starts_with(p)))
        .map(|f| f.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_facilities_have_reasons() {
        assert!(host_facility_reason("fopen").is_some_and(|r| r.contains("no file system")));
        assert!(host_facility_reason("pthread_create").is_some_and(|r| r.contains("host threads")));
        assert!(host_facility_reason("clock_gettime").is_some_and(|r| r.contains("get_clk")));
        assert!(host_facility_reason("malloc").is_some_and(|r| r.contains("vector_malloc")));
        assert_eq!(host_facility_reason("dma_p2p"), None);
    }
}
