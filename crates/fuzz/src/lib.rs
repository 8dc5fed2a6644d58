//! Fuzz targets over every boundary where the system reads what a party it
//! does not trust wrote (model output, tool arguments, a kernel's output,
//! bus messages and records, gRPC requests, MCP tool arguments, a task's
//! checks on the worker, configuration files), on
//! stable Rust. Each target drives the crate's real parser; the driver
//! ([`run`]) replays a target's checked-in corpus, then mutates it for a
//! time budget, and holds every input to the targets' property: no panic,
//! bounded time and memory, and either a valid value or an error that
//! says what is wrong.

mod alloc;
mod driver;
mod mutate;
pub mod targets;

pub use driver::{Failure, Report, RunConfig, run};

/// What one input came to, when it kept to the property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Accepted into a value (`false`: refused with an error).
    pub accepted: bool,
    /// The kind of value or error, a short label: distinct labels are the
    /// distinct outcomes a run counts.
    pub signature: String,
}

impl Outcome {
    /// An accepted input whose value is of kind `signature`.
    pub fn accepted(signature: impl Into<String>) -> Self {
        Self {
            accepted: true,
            signature: signature.into(),
        }
    }

    /// A refused input, its error of kind `signature`.
    pub fn refused(signature: impl Into<String>) -> Self {
        Self {
            accepted: false,
            signature: signature.into(),
        }
    }
}

/// An input broke the property of its target (a panic, a time or memory
/// bound, an error that does not say what is wrong, a codec that does not
/// give back what it encoded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

/// The result of one input.
pub type Checked = Result<Outcome, Violation>;

/// One fuzz target.
#[derive(Clone, Copy)]
pub struct Target {
    /// Its name, also its corpus directory's (`corpus/<name>/`).
    pub name: &'static str,
    /// What it drives, in a line.
    pub about: &'static str,
    /// Runs one input through the real parser and checks the property.
    pub check: fn(&[u8]) -> Checked,
    /// Tokens of the format, for the mutations to insert.
    pub dictionary: &'static [&'static [u8]],
    /// Longest input generated.
    pub max_len: usize,
    /// Inputs built in code from real values, replayed with the corpus
    /// (for binary formats, whose files could not be written by hand).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// No seeds beyond the corpus files.
pub fn no_seeds() -> Vec<Vec<u8>> {
    Vec::new()
}

/// The label of an error: the first words of its first line, digits and
/// quoted text left out, so that errors of one kind share a label whatever values they name.
pub fn error_kind(message: &str) -> String {
    let mut label = String::new();
    let mut quoted = false;
    for c in message.chars() {
        match c {
            '\n' => break,
            '"' | '`' | '\'' => quoted = !quoted,
            _ if quoted || c.is_ascii_digit() => {}
            _ => label.push(c),
        }
        if label.len() >= 48 {
            break;
        }
    }
    label
}

/// A refusal's error must say what is wrong: not empty, and not so long
/// that it floods a log or a model's context (an error quoting a whole
/// input would).
pub fn refused_with(message: &str, limit: usize) -> Checked {
    if message.trim().is_empty() {
        return Err(Violation("refused with an empty error".into()));
    }
    if message.len() > limit {
        return Err(Violation(format!(
            "refused with an error of {} bytes (at most {limit}): {}...",
            message.len(),
            message.chars().take(200).collect::<String>()
        )));
    }
    Ok(Outcome::refused(error_kind(message)))
}

/// The workspace directory (for the corpus and the example kernels).
pub fn workspace_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The checked-in corpus of target `name`.
pub fn corpus_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name)
}
