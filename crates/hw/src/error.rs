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
    /// The kernel directory is missing, unreadable or refused
    /// (`kernel directory …`).
    #[error(transparent)]
    Kernel(ErrorDetail),
    /// A build step failed; the message carries its diagnostics
    /// (`compile failed: …`).
    #[error(transparent)]
    Compile(ErrorDetail),
    /// The harness could not be started or its output could not be read
    /// (`launch failed: …`).
    #[error(transparent)]
    Launch(ErrorDetail),
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

/// An error another one wraps, shared so the error stays `Clone`.
type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// What an [`HwError::Kernel`], [`HwError::Compile`] or [`HwError::Launch`]
/// says, and the error it wraps, if any, as its `source`. Made by the
/// constructors of [`HwError`] ([`HwError::kernel`], [`HwError::compile`],
/// [`HwError::launch`] and their `_caused` forms), which also give it its
/// variant's prefix.
#[derive(Debug, Clone)]
pub struct ErrorDetail {
    prefix: &'static str,
    message: String,
    source: Option<Cause>,
}

impl ErrorDetail {
    fn new(prefix: &'static str, message: String, source: Option<Cause>) -> Self {
        Self {
            prefix,
            message,
            source,
        }
    }

    /// The message without its variant's prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error (prefix and source) with its message rewritten.
    pub(crate) fn map_message(self, f: impl FnOnce(&str) -> String) -> Self {
        Self {
            message: f(&self.message),
            ..self
        }
    }
}

impl std::fmt::Display for ErrorDetail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.prefix, self.message)
    }
}

impl std::error::Error for ErrorDetail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Equal when the variant's prefix and the message are (the message names
/// the wrapped error, which has no equality of its own).
impl PartialEq for ErrorDetail {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix && self.message == other.message
    }
}

const KERNEL: &str = "kernel directory ";
const COMPILE: &str = "compile failed: ";
const LAUNCH: &str = "launch failed: ";

impl HwError {
    /// An [`HwError::Kernel`] saying `message`.
    pub fn kernel(message: impl Into<String>) -> Self {
        Self::Kernel(ErrorDetail::new(KERNEL, message.into(), None))
    }

    /// An [`HwError::Kernel`] saying `message`, caused by `source`.
    pub fn kernel_caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Kernel(ErrorDetail::new(
            KERNEL,
            message.into(),
            Some(Arc::new(source)),
        ))
    }

    /// An [`HwError::Compile`] saying `message`.
    pub fn compile(message: impl Into<String>) -> Self {
        Self::Compile(ErrorDetail::new(COMPILE, message.into(), None))
    }

    /// An [`HwError::Compile`] saying `message`, caused by `source`.
    pub fn compile_caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Compile(ErrorDetail::new(
            COMPILE,
            message.into(),
            Some(Arc::new(source)),
        ))
    }

    /// An [`HwError::Launch`] saying `message`.
    pub fn launch(message: impl Into<String>) -> Self {
        Self::Launch(ErrorDetail::new(LAUNCH, message.into(), None))
    }

    /// An [`HwError::Launch`] saying `message`, caused by `source`.
    pub fn launch_caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Launch(ErrorDetail::new(
            LAUNCH,
            message.into(),
            Some(Arc::new(source)),
        ))
    }

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
            (Self::Config(a), Self::Config(b)) | (Self::Capacity(a), Self::Capacity(b)) => a == b,
            (Self::Kernel(a), Self::Kernel(b))
            | (Self::Compile(a), Self::Compile(b))
            | (Self::Launch(a), Self::Launch(b)) => a == b,
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn wrapping_variants_keep_their_text_and_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = HwError::kernel_caused("/k: gone", io);
        assert_eq!(e.to_string(), "kernel directory /k: gone");
        assert_eq!(e.source().map(|s| s.to_string()).as_deref(), Some("gone"));

        let e = HwError::compile("kernel.c:1: error");
        assert_eq!(e.to_string(), "compile failed: kernel.c:1: error");
        assert!(e.source().is_none());
        assert_eq!(
            HwError::launch("no harness").to_string(),
            "launch failed: no harness"
        );

        let timeout = HwError::Timeout(std::time::Duration::from_secs(2));
        let e = HwError::compile_caused("cc: compiler timed out after 2s", timeout.clone());
        assert_eq!(
            e.to_string(),
            "compile failed: cc: compiler timed out after 2s"
        );
        assert_eq!(e.source().map(|s| s.to_string()), Some(timeout.to_string()));
        assert_eq!(e, HwError::compile("cc: compiler timed out after 2s"));
        assert_ne!(e, HwError::kernel("cc: compiler timed out after 2s"));
    }
}
