//! The compiled object's symbols against the device contract: an
//! allowlist of what device code may call (the device libraries of
//! MT3000.md, the emulator's hooks, a libm subset and the charged memory
//! functions) and the names it may not define.

use std::collections::BTreeSet;

use crate::HwError;

/// The hthreads device API (`hthread_device.h`, MT3000.md).
const DEVICE_API: &[&str] = &[
    "get_thread_id",
    "get_group_size",
    "get_core_id",
    "group_barrier",
    "core_barrier",
    "hthread_printf",
    "get_clk",
    "scalar_malloc",
    "scalar_free",
    "vector_malloc",
    "vector_free",
    "dma_p2p",
    "dma_wait",
    "dma_query",
    "vector_load",
    "vector_load_async",
    "vector_store",
    "vector_store_async",
    "scalar_load",
    "scalar_load_async",
    "scalar_store",
    "scalar_store_async",
];

/// The libm functions of the device's scalar library (slib3000) that device
/// code may call. Their work is charged as one call, like on the board's
/// library the cost is the library's, not the kernel's.
const LIBM_SUBSET: &[&str] = &[
    "sqrt", "sqrtf", "fabs", "fabsf", "exp", "expf", "log", "logf", "pow", "powf", "sin", "sinf",
    "cos", "cosf", "tanh", "tanhf", "floor", "floorf", "ceil", "ceilf", "fmin", "fminf", "fmax",
    "fmaxf", "fma", "fmaf",
];

/// Symbols the emulator's build and runtime provide to instrumented code.
const EMULATOR_SYMBOLS: &[&str] = &[
    "mtswarm_issue",
    "mtswarm_dev_memcpy",
    "mtswarm_dev_memmove",
    "mtswarm_dev_memset",
    "__sanitizer_cov_trace_pc",
    "__tsan_init",
    "__tsan_func_entry",
    "__tsan_func_exit",
    "__tsan_read_range",
    "__tsan_write_range",
    "_GLOBAL_OFFSET_TABLE_",
];

/// Prefixes of the emulator's instrumentation hooks (`__tsan_read8`,
/// `__tsan_unaligned_write4`, ...); atomics (`__tsan_atomic*`) are not hooks.
fn is_access_hook(symbol: &str) -> bool {
    let Some(rest) = symbol.strip_prefix("__tsan_") else {
        return false;
    };
    let rest = rest.strip_prefix("unaligned_").unwrap_or(rest);
    let rest = rest.strip_prefix("volatile_").unwrap_or(rest);
    ["read", "write"].iter().any(|op| {
        rest.strip_prefix(op)
            .is_some_and(|n| matches!(n, "1" | "2" | "4" | "8" | "16"))
    })
}

/// Names reserved for the emulator: a kernel that defines one could replace
/// the runtime's charging.
pub(super) const RESERVED_PREFIXES: &[&str] =
    &["__tsan_", "__sanitizer_", "mtswarm_issue", "mtswarm_dev_"];

/// Why a host facility is refused, by symbol.
fn host_facility(symbol: &str) -> Option<&'static str> {
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

/// Whether device code may reference `symbol`.
pub fn allowed_symbol(symbol: &str) -> bool {
    DEVICE_API.contains(&symbol)
        || LIBM_SUBSET.contains(&symbol)
        || EMULATOR_SYMBOLS.contains(&symbol)
        || is_access_hook(symbol)
}

/// The first line of `source` that mentions `word` as an identifier.
fn line_of(source: &str, word: &str) -> Option<usize> {
    source
        .lines()
        .position(|line| {
            line.match_indices(word).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + word.len()..].chars().next();
                let ident =
                    |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                !ident(before) && !ident(after)
            })
        })
        .map(|i| i + 1)
}

/// Refuse an object whose undefined symbols leave the device contract, or
/// that defines a name the emulator reserves or the runtime and harness
/// use (a definition would replace theirs). `source` is kernel.c, to point
/// at the line that uses the symbol.
pub fn check_symbols(
    undefined: &[String],
    defined: &[String],
    reserved_by_others: &BTreeSet<String>,
    source: &str,
) -> Result<(), HwError> {
    let at = |symbol: &str| {
        line_of(source, symbol).map_or_else(|| "kernel.c".to_owned(), |l| format!("kernel.c:{l}"))
    };
    for symbol in undefined {
        let symbol = symbol.split('@').next().unwrap_or(symbol);
        if allowed_symbol(symbol) {
            continue;
        }
        let reason = host_facility(symbol).unwrap_or(
            "not part of the device libraries (the hthread device API, the vector intrinsics, \
             a libm subset and memcpy/memmove/memset)",
        );
        return Err(HwError::compile(format!(
            "{}: refused: device code calls `{symbol}`: {reason}",
            at(symbol)
        )));
    }
    for symbol in defined {
        if RESERVED_PREFIXES.iter().any(|p| symbol.starts_with(p))
            || reserved_by_others.contains(symbol)
        {
            return Err(HwError::compile(format!(
                "{}: refused: device code defines `{symbol}`, a name of the emulator runtime or \
                 the C library; a definition would replace theirs",
                at(symbol)
            )));
        }
    }
    Ok(())
}

/// `nm` output lines -> (undefined, defined) symbol names. Every defined
/// symbol counts, local ones too: a `static __tsan_read8` would capture the
/// instrumentation's calls inside its own translation unit.
pub fn parse_nm(output: &str) -> (Vec<String>, Vec<String>) {
    let mut undefined = Vec::new();
    let mut defined = Vec::new();
    for line in output.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["U", name] | ["w", name] | ["v", name] => undefined.push((*name).to_owned()),
            [_, kind, name] if kind.len() == 1 => {
                if matches!(*kind, "U" | "w" | "v") {
                    undefined.push((*name).to_owned());
                } else if !name.starts_with('.') {
                    defined.push((*name).to_owned());
                }
            }
            _ => {}
        }
    }
    (undefined, defined)
}
