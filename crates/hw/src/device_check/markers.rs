//! Line markers in kernel sources.
//!
//! `#line` directives (and their `# 17 "file"` form) make the compiler
//! attribute text to another file and line. Nothing in a kernel needs
//! them, and a kernel that had them would make its diagnostics point at
//! files it never included, so the kernel directory's sources may not
//! contain any.

use std::path::Path;

use crate::error::HwError;
use crate::error::io_err;

/// Whether `line` is a line-marker directive.
fn is_marker(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix('#') else {
        return false;
    };
    let rest = rest.trim_start();
    rest.starts_with(|c: char| c.is_ascii_digit())
        || rest
            .strip_prefix("line")
            .is_some_and(|r| r.is_empty() || r.starts_with(|c: char| c.is_whitespace()))
}

/// Refuse C sources and headers of `kernel_dir` that hold a line marker,
/// naming the file and line.
pub fn check_line_markers(kernel_dir: &Path) -> Result<(), HwError> {
    let entries = std::fs::read_dir(kernel_dir).map_err(|e| io_err("reading", kernel_dir, e))?;
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|x| x == "c" || x == "h" || x == "inc")
        })
        .collect();
    files.sort();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        // Backslash-newline joins lines before directives are read.
        let joined = text.replace("\\\r\n", "").replace("\\\n", "");
        if let Some(n) = joined.lines().position(is_marker) {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            return Err(HwError::compile(format!(
                "{}: refused: a line marker (`#line` or `# N \"file\"`) near line {}; kernel \
                 sources may not re-attribute their text to other files",
                name.unwrap_or_default(),
                n + 1
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_in_any_spelling_are_refused_and_other_directives_pass() {
        for marker in [
            "#line 1 \"x.h\"",
            "  #  line 7",
            "# 1 \"/usr/include/stdio.h\" 3",
            "#\\\nline 3",
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(
                dir.path().join("kernel.c"),
                format!("int a;\n{marker}\nint b;\n"),
            )
            .expect("write");
            let err = check_line_markers(dir.path()).unwrap_err();
            assert!(
                err.to_string().contains("kernel.c: refused: a line marker"),
                "{marker}: {err}"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("kernel.c"),
            "#include <stdint.h>\n#define linear 1\n#if linear\n#endif\nint line = 2;\n",
        )
        .expect("write");
        check_line_markers(dir.path()).expect("no markers");
    }
}
