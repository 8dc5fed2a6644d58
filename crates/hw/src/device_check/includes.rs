//! What the preprocessor opened and what the compiler says: only the
//! kernel directory, the emulator's headers and the toolchain's headers may
//! be included, and diagnostics are scrubbed of other files' text.

use std::path::{Path, PathBuf};

use crate::error::HwError;

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
            return Err(HwError::compile(format!(
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
