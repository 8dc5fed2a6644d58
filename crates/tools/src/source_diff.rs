//! Which source a candidate was built from.
//!
//! An agent may rewrite a kernel's sources (`write_file`, `apply_patch`)
//! and build the variant like any other candidate. Its figure only means
//! something next to what changed, so every build is compared with the
//! pristine sources of its kernel directory: those of the kernel root the
//! task's kernel was copied from when the worker names them
//! ([`PristineSources::register`]), else the directory as it was when the
//! session's tools were made or when it was first built. The unified diff
//! (made with `diffy`, bounded to [`MAX_SOURCE_DIFF_BYTES`]) travels with the
//! artifact into the benchmark's result and from there into the candidate's
//! record; the kernel hash of the artifact stays the hash of what was built.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

/// Longest diff kept with an artifact (and stored with a record); a longer
/// one is cut at a line and ends with [`TRUNCATION_MARKER`].
pub use mtswarm_core::limits::MAX_SOURCE_DIFF_BYTES;

/// Ends a diff cut to [`MAX_SOURCE_DIFF_BYTES`].
pub const TRUNCATION_MARKER: &str = "\\ diff truncated: ";

/// Failed builds of edited sources whose diff a session keeps.
pub(crate) const MAX_FAILED_EDITS: usize = 16;

/// Starts the note a failed build of edited sources adds to its error.
const FAILED_EDIT_NOTE: &str = "(build ";
/// Follows the build id in that note.
const FAILED_EDIT_TAIL: &str = " of edited sources: ";

/// The note a failed build of edited sources ends its error with: its
/// build id and what changed.
pub(crate) fn failed_edit_note(build_id: &str, source: &SourceDiff) -> String {
    format!(
        "\n{FAILED_EDIT_NOTE}{build_id}{FAILED_EDIT_TAIL}{})",
        source.stat()
    )
}

/// The build id a failed build's error names when its sources were edited
/// (see `ToolEnv::failed_build_source` for its diff).
pub fn failed_edit_build(error_text: &str) -> Option<&str> {
    let start = error_text.rfind(FAILED_EDIT_NOTE)? + FAILED_EDIT_NOTE.len();
    let rest = &error_text[start..];
    let end = rest.find(FAILED_EDIT_TAIL)?;
    let id = &rest[..end];
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(id)
}

/// Largest source file read for a diff; a bigger one is compared by hash.
const MAX_SOURCE_FILE_BYTES: u64 = 1 << 20;

/// How a build's sources differ from the pristine ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SourceDiff {
    /// Some kernel source differs from the pristine one.
    pub edited: bool,
    /// Unified diff of the changed sources (`--- a/kernel.c` / `+++
    /// b/kernel.c` per file), at most [`MAX_SOURCE_DIFF_BYTES`]; empty when
    /// not edited.
    pub diff: String,
    /// The diff was cut to fit.
    pub truncated: bool,
    /// Names of the changed source files.
    pub files: Vec<String>,
    /// Lines added over all files.
    pub added: usize,
    /// Lines removed over all files.
    pub removed: usize,
}

impl SourceDiff {
    /// `kernel.c +12 -3`, or `pristine`.
    pub fn stat(&self) -> String {
        if !self.edited {
            return "pristine".to_owned();
        }
        format!(
            "{} +{} -{}",
            self.files.join(", "),
            self.added,
            self.removed
        )
    }
}

/// The kernel sources of a directory: name -> text.
type Sources = BTreeMap<String, String>;

/// Pristine kernel sources per kernel directory of the workspace.
#[derive(Default)]
pub struct PristineSources {
    by_dir: Mutex<BTreeMap<PathBuf, Sources>>,
}

impl PristineSources {
    /// Takes the sources of every kernel directory (a directory with a
    /// host.c) at the workspace root and one level below, as they are now.
    pub fn new(workspace: &Path) -> Self {
        let store = Self::default();
        for dir in crate::workspace::kernel_dirs(workspace) {
            store.lock().insert(dir.clone(), read_sources(&dir));
        }
        store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PathBuf, Sources>> {
        self.by_dir.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pristine sources of workspace directory `kernel_dir` are those
    /// of `origin` (the kernel root's copy), whatever the workspace holds
    /// now: a resumed session's edits are not pristine.
    pub fn register(&self, kernel_dir: &Path, origin: &Path) {
        self.lock()
            .insert(kernel_dir.to_path_buf(), read_sources(origin));
    }

    /// How the sources of `built` (the staged build directory of workspace
    /// directory `kernel_dir`) differ from `kernel_dir`'s pristine sources.
    /// A directory nobody registered is pristine as first seen here.
    pub fn diff(&self, kernel_dir: &Path, built: &Path) -> SourceDiff {
        let now = read_sources(built);
        let pristine = self
            .lock()
            .entry(kernel_dir.to_path_buf())
            .or_insert_with(|| read_sources(kernel_dir))
            .clone();
        diff_sources(&pristine, &now, |name| {
            mtswarm_hw::harness::is_harness_file(built, name)
        })
    }
}

/// `*.c` and `*.h` at the top of `dir` (what the kernel hash covers).
fn read_sources(dir: &Path) -> Sources {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Sources::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.ends_with(".c") || name.ends_with(".h")) {
                return None;
            }
            let text = match e.metadata() {
                Ok(m) if m.len() <= MAX_SOURCE_FILE_BYTES => std::fs::read(e.path())
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
                Ok(m) => format!("(a source of {} bytes, too large to compare)\n", m.len()),
                Err(_) => String::new(),
            };
            Some((name, text))
        })
        .collect()
}

/// The diff of the kernel sources (not the harness: the build always uses
/// the pristine harness) from `pristine` to `now`.
fn diff_sources(
    pristine: &Sources,
    now: &Sources,
    is_harness: impl Fn(&str) -> bool,
) -> SourceDiff {
    let mut names: Vec<&String> = pristine.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    let mut out = SourceDiff::default();
    let mut text = String::new();
    for name in names.into_iter().filter(|n| !is_harness(n)) {
        let (old, new) = (
            pristine.get(name).map_or("", String::as_str),
            now.get(name).map_or("", String::as_str),
        );
        if old == new && pristine.contains_key(name) == now.contains_key(name) {
            continue;
        }
        let patch = diffy::DiffOptions::new()
            .set_original_filename(if pristine.contains_key(name) {
                format!("a/{name}")
            } else {
                "/dev/null".to_owned()
            })
            .set_modified_filename(if now.contains_key(name) {
                format!("b/{name}")
            } else {
                "/dev/null".to_owned()
            })
            .create_patch(old, new);
        for hunk in patch.hunks() {
            for line in hunk.lines() {
                match line {
                    diffy::Line::Insert(_) => out.added += 1,
                    diffy::Line::Delete(_) => out.removed += 1,
                    diffy::Line::Context(_) => {}
                }
            }
        }
        text.push_str(&patch.to_string());
        out.files.push(name.clone());
    }
    out.edited = !out.files.is_empty();
    (out.diff, out.truncated) = bound_diff(text);
    out
}

/// Cuts `diff` at a line so that it and the marker fit in
/// [`MAX_SOURCE_DIFF_BYTES`]; returns it and whether it was cut.
pub fn bound_diff(diff: String) -> (String, bool) {
    if diff.len() <= MAX_SOURCE_DIFF_BYTES {
        return (diff, false);
    }
    let total = diff.len();
    // Room for the marker line with its figures.
    let budget = MAX_SOURCE_DIFF_BYTES - 96;
    let mut cut = budget;
    while !diff.is_char_boundary(cut) {
        cut -= 1;
    }
    let cut = diff[..cut].rfind('\n').map_or(cut, |i| i + 1);
    let mut kept = diff[..cut].to_owned();
    kept.push_str(&format!(
        "{TRUNCATION_MARKER}{cut} of {total} bytes shown\n"
    ));
    (kept, true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn sources(files: &[(&str, &str)]) -> Sources {
        files
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn unchanged_sources_are_pristine_and_harness_changes_are_ignored() {
        let a = sources(&[("kernel.c", "int x;\n"), ("host.c", "main\n")]);
        let b = sources(&[("kernel.c", "int x;\n"), ("host.c", "evil\n")]);
        let d = diff_sources(&a, &b, |n| n == "host.c");
        assert!(
            !d.edited && d.diff.is_empty() && d.files.is_empty(),
            "{d:?}"
        );
        assert_eq!(d.stat(), "pristine");
    }

    #[test]
    fn an_edit_gives_a_unified_diff_that_applies_to_the_pristine_source() {
        let old = "a\nb\nc\n";
        let new = "a\nB\nc\nd\n";
        let d = diff_sources(
            &sources(&[("kernel.c", old)]),
            &sources(&[("kernel.c", new), ("extra.h", "#define X 1\n")]),
            |_| false,
        );
        assert!(d.edited && !d.truncated);
        assert_eq!(d.files, ["extra.h", "kernel.c"]);
        assert_eq!((d.added, d.removed), (3, 1));
        for header in [
            "--- a/kernel.c\n+++ b/kernel.c\n",
            "--- /dev/null\n+++ b/extra.h\n",
        ] {
            assert!(d.diff.contains(header), "{header}: {}", d.diff);
        }
        let kernel_part = &d.diff[d.diff.find("--- a/kernel.c").unwrap()..];
        let patch = diffy::Patch::from_str(kernel_part).unwrap();
        assert_eq!(diffy::apply(old, &patch).unwrap(), new);
        assert_eq!(d.stat(), "extra.h, kernel.c +3 -1");
    }

    #[test]
    fn a_huge_diff_is_cut_at_a_line_with_a_marker() {
        let new: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        let d = diff_sources(
            &sources(&[("kernel.c", "")]),
            &sources(&[("kernel.c", &new)]),
            |_| false,
        );
        assert!(d.truncated && d.edited);
        assert!(d.diff.len() <= MAX_SOURCE_DIFF_BYTES, "{}", d.diff.len());
        let marker = d.diff.lines().last().unwrap();
        assert!(marker.starts_with(TRUNCATION_MARKER), "{marker}");
        assert!(marker.ends_with("bytes shown"), "{marker}");
        // Every line before the marker is whole.
        let body = &d.diff[..d.diff.len() - marker.len() - 1];
        assert!(body.ends_with('\n'));
        assert_eq!(bound_diff("short".into()), ("short".into(), false));
    }

    #[test]
    fn a_failed_edit_note_names_its_build() {
        let source = SourceDiff {
            edited: true,
            files: vec!["kernel.c".into()],
            added: 2,
            removed: 1,
            ..SourceDiff::default()
        };
        let text = format!(
            "compile failed: kernel.c:3: error{}",
            failed_edit_note("b12", &source)
        );
        assert!(
            text.ends_with("(build b12 of edited sources: kernel.c +2 -1)"),
            "{text}"
        );
        assert_eq!(failed_edit_build(&text), Some("b12"));
        assert_eq!(failed_edit_build("compile failed: (build of x"), None);
        assert_eq!(failed_edit_build("compile failed"), None);
    }

    #[test]
    fn a_registered_origin_is_the_pristine_source_not_the_workspace() {
        let origin = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let built = tempfile::tempdir().unwrap();
        std::fs::write(origin.path().join("kernel.c"), "orig\n").unwrap();
        std::fs::write(work.path().join("kernel.c"), "edited before\n").unwrap();
        std::fs::write(built.path().join("kernel.c"), "edited before\n").unwrap();
        let store = PristineSources::default();
        store.register(work.path(), origin.path());
        let d = store.diff(work.path(), built.path());
        assert!(
            d.edited && d.diff.contains("-orig\n+edited before\n"),
            "{d:?}"
        );
        // Unregistered: pristine as first seen.
        let other = PristineSources::default();
        assert!(!other.diff(work.path(), built.path()).edited);
    }
}
