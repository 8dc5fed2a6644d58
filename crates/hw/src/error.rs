//! The one error type of the hardware layer, so callers can tell a kernel
//! that cannot run on the chip (capacity, compile errors) from a broken
//! configuration or a failing host, while every variant still names the
//! limit, command, path or step involved.

use std::path::Path;
use std::sync::Arc;

/// Errors of the hardware layer. Messages name the limit or the command that
/// failed, the way the real toolchain or runtime would.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HwError {
    /// A fleet, chip spec, SDK or request setting is invalid.
    #[error("configuration error: {0}")]
    Config(String),
    /// The kernel directory is missing, unreadable or refused.
    #[error("kernel directory {0}")]
    Kernel(String),
    /// A build step failed; the message carries its diagnostics.
    #[error("compile failed: {0}")]
    Compile(String),
    /// The harness could not be started or its output could not be read.
    #[error("launch failed: {0}")]
    Launch(String),
    /// The run exceeded its time-out and was killed.
    #[error("run timed out after {0:?} (killed)")]
    Timeout(std::time::Duration),
    /// The configuration exceeds a capacity of the chip.
    #[error("{0}")]
    Capacity(String),
    /// A file-system step of the hardware layer failed.
    #[error("io error: {}{source}", step_prefix(.context))]
    Io {
        /// The step and the path involved, e.g. `writing /cache/emu-1/x.h`
        /// (empty only for errors converted with `?` outside this crate).
        context: String,
        /// The operating system's error (shared so the error stays `Clone`).
        #[source]
        source: Arc<std::io::Error>,
    },
}

impl HwError {
    /// An [`HwError::Io`] for `source`, with the step and path in `context`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

/// For callers that have no step to name (backends written outside this
/// crate); the crate itself always names one ([`HwError::io`]).
impl From<std::io::Error> for HwError {
    fn from(source: std::io::Error) -> Self {
        Self::io(String::new(), source)
    }
}

/// `context: `, or nothing for an unnamed step.
fn step_prefix(context: &str) -> String {
    if context.is_empty() {
        String::new()
    } else {
        format!("{context}: ")
    }
}

/// An [`HwError::Io`] for `what` (the step) on `path`.
pub(crate) fn io_err(what: &str, path: &Path, source: std::io::Error) -> HwError {
    HwError::io(format!("{what} {}", path.display()), source)
}

/// Equal when the variant and its message are; two I/O errors are equal
/// when their context and error kind are (an OS error has no equality).
impl PartialEq for HwError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Config(a), Self::Config(b))
            | (Self::Kernel(a), Self::Kernel(b))
            | (Self::Compile(a), Self::Compile(b))
            | (Self::Launch(a), Self::Launch(b))
            | (Self::Capacity(a), Self::Capacity(b)) => a == b,
            (Self::Timeout(a), Self::Timeout(b)) => a == b,
            (
                Self::Io {
                    context: a,
                    source: x,
                },
                Self::Io {
                    context: b,
                    source: y,
                },
            ) => a == b && x.kind() == y.kind(),
            _ => false,
        }
    }
}
