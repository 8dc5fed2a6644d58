//! What is checked of a kernel's sources before they are built, and the
//! scrubbing of what a build says about files outside the kernel.
//!
//! The barrier against kernels that game their measurement is the
//! emulator's design (device code runs as instrumented WebAssembly that can
//! reach only the device contract, see `crate::emu`), not a list of
//! refused constructs. What stays here gives clear errors: line markers
//! are refused in kernel sources ([`check_line_markers`]), a call of a host
//! facility is explained ([`host_facility_reason`]), and compiler
//! diagnostics are scrubbed so that no text of a file outside the allowed
//! directories reaches whoever reads the build log; for the native `host`
//! backend the files a kernel's translation unit opened are checked
//! against the allowed directories ([`check_includes`]).

mod facilities;
mod includes;
mod markers;

pub use facilities::host_facility_reason;
pub use includes::{TOOLCHAIN_INCLUDE_ROOTS, check_includes, parse_deps, scrub_diagnostics};
pub use markers::check_line_markers;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

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
