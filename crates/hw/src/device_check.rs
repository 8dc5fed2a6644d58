//! The contract of device code, checked before an emulated kernel counts.
//!
//! The emulator charges every instruction and memory access of device code
//! through compiler instrumentation, so a kernel that switches the
//! instrumentation off, hides work from it, or calls into the host (files,
//! threads, clocks) would be measured faster than any board can run it. This
//! module refuses such kernels at build time, naming the construct and its
//! line or the symbol and why: the checks run on the preprocessed source
//! (attributes, pragmas, inline assembly, host builtins), on the files the
//! preprocessor opened (only the kernel directory, the emulator's headers and
//! the toolchain's own headers), and on the compiled object's symbols (an
//! allowlist: the device libraries of MT3000.md, the emulator's hooks, a libm
//! subset and the charged memcpy/memmove/memset).
//!
//! It also scrubs compiler diagnostics so that no text of a file outside
//! the allowed directories reaches whoever reads the build log.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
const RESERVED_PREFIXES: &[&str] = &["__tsan_", "__sanitizer_", "mtswarm_issue", "mtswarm_dev_"];

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
        return Err(HwError::Compile(format!(
            "{}: refused: device code calls `{symbol}`: {reason}",
            at(symbol)
        )));
    }
    for symbol in defined {
        if RESERVED_PREFIXES.iter().any(|p| symbol.starts_with(p))
            || reserved_by_others.contains(symbol)
        {
            return Err(HwError::Compile(format!(
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

/// A construct of the preprocessed kernel source that is refused.
#[derive(Debug)]
struct Finding {
    file: String,
    line: usize,
    construct: String,
    reason: &'static str,
}

const INSTRUMENTATION_OFF: &str =
    "it switches off or dodges the instrumentation the cost model charges through";

/// Why a GNU attribute is refused (its name without surrounding `__`).
fn refused_attribute(name: &str, first_arg: Option<&str>) -> Option<&'static str> {
    match name {
        n if n.starts_with("no_sanitize") => Some(INSTRUMENTATION_OFF),
        "no_instrument_function"
        | "no_profile_instrument_function"
        | "no_address_safety_analysis"
        | "no_stack_limit"
        | "optimize"
        | "target"
        | "target_clones"
        | "naked" => Some(INSTRUMENTATION_OFF),
        "weak" | "weakref" | "alias" | "ifunc" | "symver" => {
            Some("weak, alias and ifunc symbols could replace the emulator runtime's functions")
        }
        "constructor" | "destructor" => {
            Some("device code runs only inside a thread group, never at host start-up or exit")
        }
        "section" if first_arg != Some("mtswarm_gsm") => {
            Some("only `__gsm__` may place device data in a section")
        }
        _ => None,
    }
}

/// Why a `#pragma` is refused.
fn refused_pragma(words: &[&str]) -> Option<&'static str> {
    let words: Vec<&str> = words.iter().map(|w| w.trim_start_matches("__")).collect();
    match words.as_slice() {
        ["GCC", "optimize" | "target" | "reset_options", ..] => Some(INSTRUMENTATION_OFF),
        ["weak", ..] | ["redefine_extname", ..] => {
            Some("weak and renamed symbols could replace the emulator runtime's functions")
        }
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

/// Scan preprocessed text (`gcc -E`, with line markers). Only text that
/// came from files under `kernel_dir` is checked: the emulator's own headers
/// use some of these constructs on purpose.
pub fn check_preprocessed(text: &str, kernel_dir: &Path) -> Result<(), HwError> {
    let mut file = String::new();
    let mut line_no = 0usize;
    let mut in_kernel = false;
    // Tokens of kernel files with their (file, line).
    let mut toks: Vec<(Tok, String, usize)> = Vec::new();
    for raw in text.lines() {
        let trimmed = raw.trim_start();
        if let Some(rest) = trimmed.strip_prefix('#') {
            let rest = rest.trim_start();
            let mut words = rest.split_whitespace();
            let first = words.next().unwrap_or("");
            if let Ok(n) = first.parse::<usize>() {
                // `# 12 "path" flags`: the next line is line 12 of path.
                if let Some(name) = rest[first.len()..].trim_start().strip_prefix('"') {
                    let name = name.split('"').next().unwrap_or("");
                    file = name.to_owned();
                    in_kernel = is_under(Path::new(name), kernel_dir);
                }
                line_no = n;
                continue;
            }
            if first == "pragma" && in_kernel {
                // Identifiers only: `optimize("O1")` is the word `optimize`.
                let words: Vec<&str> = words
                    .flat_map(|w| w.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
                    .filter(|w| !w.is_empty())
                    .collect();
                if let Some(reason) = refused_pragma(&words) {
                    return Err(refusal(&Finding {
                        file: file.clone(),
                        line: line_no,
                        construct: format!("#pragma {}", words.join(" ")),
                        reason,
                    }));
                }
            }
            line_no += 1;
            continue;
        }
        if in_kernel {
            for tok in tokenize(raw) {
                toks.push((tok, file.clone(), line_no));
            }
        }
        line_no += 1;
    }
    if let Some(finding) = scan_tokens(&toks) {
        return Err(refusal(&finding));
    }
    Ok(())
}

fn refusal(f: &Finding) -> HwError {
    let name = Path::new(&f.file)
        .file_name()
        .map_or_else(|| f.file.clone(), |n| n.to_string_lossy().into_owned());
    HwError::Compile(format!(
        "{name}:{}: refused: `{}`: {}",
        f.line, f.construct, f.reason
    ))
}

fn is_under(path: &Path, dir: &Path) -> bool {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.starts_with(dir)
}

/// A small C tokenizer: identifiers, string/char literals and punctuation
/// (numbers become identifiers, which is harmless here).
fn tokenize(line: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c == '"' || c == '\'' {
            let quote = c;
            i += 1;
            let mut s = String::new();
            while i < chars.len() && chars[i] != quote {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                s.push(chars[i]);
                i += 1;
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            out.push(Tok::Punct(c));
            i += 1;
        }
    }
    out
}

fn scan_tokens(toks: &[(Tok, String, usize)]) -> Option<Finding> {
    let found = |i: usize, construct: String, reason: &'static str| {
        let (_, file, line) = &toks[i];
        Some(Finding {
            file: file.clone(),
            line: *line,
            construct,
            reason,
        })
    };
    let mut i = 0;
    while i < toks.len() {
        let Tok::Ident(word) = &toks[i].0 else {
            // C2x `[[gnu::name]]` attributes.
            if toks[i].0 == Tok::Punct('[')
                && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('['))
                && let Some(f) = scan_attribute_list(toks, i + 2, ']')
            {
                return Some(f);
            }
            i += 1;
            continue;
        };
        match word.as_str() {
            "asm" | "__asm" | "__asm__" => {
                return found(
                    i,
                    word.clone(),
                    "inline assembly and assembler symbol names are invisible to the cost model",
                );
            }
            "__attribute__" | "__attribute" => {
                // __attribute__ (( list ))
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('('))
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('('))
                    && let Some(f) = scan_attribute_list(toks, i + 3, ')')
                {
                    return Some(f);
                }
            }
            w if w.starts_with("__builtin_ia32_") || w == "__builtin_cpu_supports" => {
                return found(
                    i,
                    word.clone(),
                    "host (x86) instruction builtins do not exist on the DSP and bypass the cost \
                     model",
                );
            }
            w if RESERVED_PREFIXES.iter().any(|p| w.starts_with(p)) => {
                return found(
                    i,
                    word.clone(),
                    "names of the emulator's instrumentation are reserved",
                );
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Attribute names at the top level of a list that ends with `close` (a
/// `))` or `]]`), each optionally followed by `(args)`.
fn scan_attribute_list(
    toks: &[(Tok, String, usize)],
    mut i: usize,
    close: char,
) -> Option<Finding> {
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct(c) if *c == close => return None,
            Tok::Ident(name) => {
                // gnu::name, __gnu__::name
                let mut name = name.clone();
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct(':'))
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct(':'))
                    && let Some((Tok::Ident(inner), _, _)) = toks.get(i + 3)
                {
                    name = inner.clone();
                    i += 3;
                }
                let base = name.trim_start_matches("__").trim_end_matches("__");
                let mut first_arg = None;
                let mut j = i + 1;
                if toks.get(j).map(|t| &t.0) == Some(&Tok::Punct('(')) {
                    if let Some((Tok::Str(s), _, _)) = toks.get(j + 1) {
                        first_arg = Some(s.as_str());
                    }
                    // Skip the balanced argument list.
                    let mut depth = 0usize;
                    while j < toks.len() {
                        match toks[j].0 {
                            Tok::Punct('(') => depth += 1,
                            Tok::Punct(')') => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                }
                if let Some(reason) = refused_attribute(base, first_arg) {
                    let (_, file, line) = &toks[i];
                    let construct = match first_arg {
                        Some(a) => format!("__attribute__(({base}(\"{a}\")))"),
                        None => format!("__attribute__(({base}))"),
                    };
                    return Some(Finding {
                        file: file.clone(),
                        line: *line,
                        construct,
                        reason,
                    });
                }
                i = j + 1;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The files a `gcc -M` dependency list names (target first, dropped).
pub fn parse_deps(text: &str) -> Vec<PathBuf> {
    let joined = text.replace("\\\n", " ");
    let body = joined.split_once(": ").map_or(joined.as_str(), |(_, b)| b);
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&' ') {
            current.push(' ');
            chars.next();
        } else if c.is_whitespace() {
            if !current.is_empty() {
                out.push(PathBuf::from(std::mem::take(&mut current)));
            }
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        out.push(PathBuf::from(current));
    }
    out
}

/// Directories of the toolchain's own headers that device code may include.
pub const TOOLCHAIN_INCLUDE_ROOTS: &[&str] =
    &["/usr/include", "/usr/lib/gcc", "/usr/local/include"];

/// Refuse a kernel whose preprocessing opened a file outside `allowed`
/// (paths are resolved first, so `..` and symlinks do not help). The error
/// names the file, never its content.
pub fn check_includes(deps: &[PathBuf], cwd: &Path, allowed: &[PathBuf]) -> Result<(), HwError> {
    for dep in deps {
        let path = if dep.is_absolute() {
            dep.clone()
        } else {
            cwd.join(dep)
        };
        let resolved = path.canonicalize().unwrap_or(path);
        if !allowed.iter().any(|root| resolved.starts_with(root)) {
            return Err(HwError::Compile(format!(
                "kernel.c: refused: it includes {}, outside the kernel directory and the \
                 emulator's and toolchain's headers (its content is not shown)",
                dep.display()
            )));
        }
    }
    Ok(())
}

/// Compiler diagnostics with every line that points into a file outside
/// `allowed` (and every quoted source line) removed, so a diagnostic cannot
/// carry another file's content to the reader.
pub fn scrub_diagnostics(text: &str, allowed: &[PathBuf]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut withheld = 0usize;
    for line in text.lines() {
        let trimmed = line.trim_start();
        // Caret lines: `   12 | code` and `      |   ^~~`.
        let quoted = trimmed
            .split_once('|')
            .is_some_and(|(lead, _)| lead.trim().chars().all(|c| c.is_ascii_digit()));
        let location = trimmed
            .trim_start_matches("In file included from ")
            .trim_start_matches("from ");
        let outside = location.starts_with('/')
            && location.split(':').next().is_some_and(|p| {
                let p = Path::new(p);
                let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
                !allowed.iter().any(|root| p.starts_with(root))
            });
        if quoted || outside {
            withheld += 1;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if withheld > 0 {
        out.push_str(&format!(
            "({withheld} diagnostic lines quoting source or files outside the kernel directory \
             withheld)\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(body: &str) -> String {
        format!("# 1 \"/k/kernel.c\"\n{body}\n")
    }

    #[test]
    fn refused_attributes_name_construct_and_line() {
        let text = pre("int x;\n__attribute__((no_sanitize_coverage, noinline)) void f(void) {}");
        let err = check_preprocessed(&text, Path::new("/k")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("kernel.c:2"), "{msg}");
        assert!(msg.contains("no_sanitize_coverage"), "{msg}");
        let text = pre("[[gnu::no_instrument_function]] void f(void) {}");
        assert!(check_preprocessed(&text, Path::new("/k")).is_err());
        let text = pre("void f(void) __attribute__((section(\"text\")));");
        assert!(check_preprocessed(&text, Path::new("/k")).is_err());
    }

    #[test]
    fn the_emulators_own_constructs_pass() {
        let text = pre(
            "static double b[4] __attribute__((section(\"mtswarm_gsm\"), aligned(128), used));\n\
             __attribute__((used, noinline, visibility(\"default\"))) void k(void) { int optimize = 1; }",
        );
        check_preprocessed(&text, Path::new("/k")).expect("allowed");
        // Header text is not the kernel's.
        let text = "# 1 \"/emu/include/m3000.h\"\nvoid g(void) { __asm__ volatile(\"\"); }\n";
        check_preprocessed(text, Path::new("/k")).expect("header constructs are the emulator's");
    }

    #[test]
    fn pragmas_and_asm_are_refused() {
        let text = pre("#pragma GCC optimize (\"O0\")\nvoid f(void) {}");
        let msg = check_preprocessed(&text, Path::new("/k"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("kernel.c:1") && msg.contains("optimize"),
            "{msg}"
        );
        let text =
            pre("#pragma GCC unroll 4\nvoid f(void) { }\nvoid g(void) { __asm__(\"nop\"); }");
        let msg = check_preprocessed(&text, Path::new("/k"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("kernel.c:3") && msg.contains("__asm__"),
            "{msg}"
        );
    }

    #[test]
    fn symbols_outside_the_contract_are_refused_with_a_reason() {
        let src = "void k(void) {\n  FILE *f = fopen(\"/tmp/x\", \"r\");\n}\n";
        let err = check_symbols(&["fopen".into()], &[], &BTreeSet::new(), src).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("kernel.c:2") && msg.contains("no file system"),
            "{msg}"
        );
        let err = check_symbols(&["pthread_create".into()], &[], &BTreeSet::new(), "").unwrap_err();
        assert!(err.to_string().contains("host threads"), "{err}");
        check_symbols(
            &["dma_p2p".into(), "__tsan_read8".into(), "sqrt".into()],
            &["k".into()],
            &BTreeSet::new(),
            "",
        )
        .expect("allowed");
        let err = check_symbols(&[], &["__tsan_read8".into()], &BTreeSet::new(), "").unwrap_err();
        assert!(err.to_string().contains("defines `__tsan_read8`"), "{err}");
    }

    #[test]
    fn deps_and_scrubbing() {
        let deps = parse_deps("kernel.o: /k/kernel.c /usr/include/stdint.h \\\n /etc/passwd\n");
        assert_eq!(deps.len(), 3);
        let allowed = vec![PathBuf::from("/k"), PathBuf::from("/usr/include")];
        let err = check_includes(&deps, Path::new("/k"), &allowed).unwrap_err();
        assert!(err.to_string().contains("/etc/passwd"), "{err}");
        let diag = "/etc/passwd:1:5: error: expected ';' before 'x'\n    1 | root:x:0:0\n      |     ^\n/k/kernel.c:3:1: warning: unused\n";
        let clean = scrub_diagnostics(diag, &allowed);
        assert!(!clean.contains("root"), "{clean}");
        assert!(clean.contains("/k/kernel.c:3:1"), "{clean}");
    }
}
