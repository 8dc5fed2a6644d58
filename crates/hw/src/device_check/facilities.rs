//! Why a kernel cannot have what it calls: the reasons given when device
//! code links against a host facility.
//!
//! Under the emulator device code is linked with nothing but the device
//! contract (`crate::emu::contract`), so such a call cannot build; these
//! reasons make the link error say what the board offers instead.

/// Why device code cannot call `symbol`, when it is a host facility (files,
/// threads, processes, network, signals, clocks, environment, host heap).
pub fn host_facility_reason(symbol: &str) -> Option<&'static str> {
    const FILES: &[&str] = &[
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
    ];
    const THREADS: &[&str] = &[
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
    ];
    const NETWORK: &[&str] = &[
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
    ];
    const SIGNALS: &[&str] = &[
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
    ];
    const CLOCKS: &[&str] = &[
        "clock_gettime",
        "gettimeofday",
        "time",
        "clock",
        "times",
        "getrusage",
        "__rdtsc",
    ];
    const MEMORY: &[&str] = &[
        "malloc",
        "calloc",
        "realloc",
        "free",
        "aligned_alloc",
        "posix_memalign",
        "memalign",
        "valloc",
        "alloca",
    ];
    if FILES.contains(&symbol) {
        Some("DSP cores have no file system (and no standard output: use hthread_printf)")
    } else if symbol.starts_with("pthread_")
        || symbol.starts_with("sem_")
        || symbol == "thrd_create"
    {
        Some("a DSP core runs one hthread and cannot start host threads or take host locks")
    } else if THREADS.contains(&symbol) {
        Some("DSP cores cannot start, signal or end host processes")
    } else if NETWORK.contains(&symbol) {
        Some("DSP cores have no network")
    } else if SIGNALS.contains(&symbol) {
        Some("DSP cores have no signals or host timers")
    } else if CLOCKS.contains(&symbol) {
        Some("host clocks are not the board's time: use get_clk (the modeled cycle counter)")
    } else if symbol.starts_with("dl")
        && matches!(symbol, "dlopen" | "dlsym" | "dlclose" | "dlvsym")
    {
        Some("DSP cores have no dynamic loading")
    } else if matches!(
        symbol,
        "getenv" | "secure_getenv" | "setenv" | "unsetenv" | "putenv" | "environ" | "__environ"
    ) {
        Some("DSP cores have no environment")
    } else if MEMORY.contains(&symbol) {
        Some(
            "DSP cores have no host heap: use scalar_malloc (SM), vector_malloc (AM) or memory \
             the host allocated with hthread_malloc (DDR)",
        )
    } else if symbol == "syscall" || symbol.starts_with("__tsan_atomic") {
        Some("system calls and atomics are not part of the device libraries")
    } else {
        None
    }
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
