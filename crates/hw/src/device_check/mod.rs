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

mod includes;
mod source;
mod symbols;

pub use includes::{TOOLCHAIN_INCLUDE_ROOTS, check_includes, parse_deps, scrub_diagnostics};
pub use source::check_preprocessed;
pub use symbols::{allowed_symbol, check_symbols, parse_nm};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    fn pre(body: &str) -> String {
        format!("# 1 \"/k/kernel.c\"\n{body}\n")
    }

    /// Why `body` (as kernel.c) is refused.
    fn refusal(body: &str) -> String {
        check_preprocessed(&pre(body), Path::new("/k"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn refused_attributes_name_construct_and_line() {
        let msg =
            refusal("int x;\n__attribute__((no_sanitize_coverage, noinline)) void f(void) {}");
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
        let msg = refusal("#pragma GCC optimize (\"O0\")\nvoid f(void) {}");
        assert!(
            msg.contains("kernel.c:1") && msg.contains("optimize"),
            "{msg}"
        );
        let msg =
            refusal("#pragma GCC unroll 4\nvoid f(void) { }\nvoid g(void) { __asm__(\"nop\"); }");
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
