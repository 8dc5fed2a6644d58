//! Helpers of the command-line tests: the `mtswarm` binary under test with
//! a clean environment, the example kernels, and the stdout of a run that
//! must have succeeded.

#![allow(dead_code)] // every test binary uses its own part of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `examples/kernels` of the repository.
pub(crate) fn kernels() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kernels")
}

/// The `mtswarm` binary under test, with human output and no tracing
/// whatever the test's environment says.
pub(crate) fn mtswarm_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mtswarm"));
    command
        .env_remove("MTSWARM_JSON")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
    command
}

/// The stdout of a run that must have succeeded (`what` names it in the
/// panic, with its stderr, when it did not).
pub(crate) fn stdout_of(output: &Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
