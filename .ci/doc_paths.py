#!/usr/bin/env python3
"""Every repository path a document cites exists.

Reads the Markdown files tracked by git and every `//!` / `///` doc comment
of the Rust sources, takes each backquoted span that names a path in the
tree (it starts with one of the top-level directories, or has a
directory and a source file's extension), and fails naming the document,
line and path of each one that is not there. Spans with placeholders
(`<crate>`, `*`, `{a,b}`, `...`, `$VAR`) are patterns, not paths, host
paths (`/etc/...`, `~/...`) and diff sides (`a/kernel.c`) are not the
tree's: all are skipped.

Usage: python3 .ci/doc_paths.py [repo root]
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
TOP = ("crates/", "tests/", "deploy/", "k8s/", "examples/", "proto/", ".ci/")
EXTENSIONS = (".rs", ".py", ".toml", ".json", ".c", ".h", ".md", ".yaml", ".sh", ".proto")
SPAN = re.compile(r"`([^`\n]+)`")
PATTERN = re.compile(r"[<>*{}$]|\.\.\.|\s")


def tracked(*globs):
    out = subprocess.run(
        ["git", "ls-files", "--", *globs], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [ROOT / line for line in out.splitlines() if line]


def candidate(span):
    """The path a span names, or None when it names none."""
    text = span.strip().rstrip(".,:;")
    text = re.sub(r":\d+(-\d+)?$", "", text)  # file.rs:120
    text = text.split("#", 1)[0]
    if PATTERN.search(text) or "/" not in text or "://" in text:
        return None
    # Host paths (`/etc/...`, `~/.mtswarm/...`) and diff sides (`a/kernel.c`)
    # are not the tree's.
    if text.startswith(("/", "~", "a/", "b/")):
        return None
    if text.startswith(TOP) or text.endswith(EXTENSIONS):
        return text
    return None


def crate_root(path):
    for parent in path.parents:
        if (parent / "Cargo.toml").exists():
            return parent
    return ROOT


def exists(path, cited_in, files):
    """Found from the root, the citing file's directory or its crate (and
    the crate's `src/`), or, for a short path (`session/task.rs` in a map
    of several crates), as the tail of some tracked file's path."""
    crate = crate_root(cited_in)
    bases = [ROOT, cited_in.parent, crate, crate / "src"]
    if any((base / path).exists() for base in bases):
        return True
    if path.startswith(TOP):
        return False
    tail = "/" + path
    return any(tail in "/" + f for f in files)


def lines_of(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if path.suffix == ".rs":
            stripped = line.lstrip()
            if not (stripped.startswith("//!") or stripped.startswith("///")):
                continue
        yield number, line


def main():
    missing = []
    files = [str(f.relative_to(ROOT)) for f in tracked()]
    for path in tracked("*.md", "*.rs"):
        for number, line in lines_of(path):
            for span in SPAN.findall(line):
                cited = candidate(span)
                if cited and not exists(cited, path, files):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: `{cited}` does not exist")
    for entry in missing:
        print(entry)
    if missing:
        print(f"{len(missing)} cited paths do not exist", file=sys.stderr)
        return 1
    print("every cited path exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
