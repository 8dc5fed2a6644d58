#!/usr/bin/env python3
"""Fails when a source file outside the tests grows past 800 lines.

A file that long holds more than one job; split it along its seams before
it grows further. Counted: every `.rs` file under `crates/*/src` and
`tests/src`, test modules included, except files named `tests.rs` (a
module's unit tests moved out of it) and generated code (not in the tree).

Usage: file_lengths.py [WORKSPACE_ROOT] [--max N]   (exit 1 when one is over)
"""

import os
import sys

def main():
    args = sys.argv[1:]
    limit = 800
    if "--max" in args:
        i = args.index("--max")
        limit = int(args[i + 1])
        del args[i : i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(__file__), "..")
    tops = [os.path.join(root, "crates", c, "src") for c in sorted(os.listdir(os.path.join(root, "crates")))]
    tops.append(os.path.join(root, "tests", "src"))
    over = []
    for top in tops:
        for dirpath, _, files in os.walk(top):
            for name in files:
                if not name.endswith(".rs") or name == "tests.rs":
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    count = sum(1 for _ in f)
                if count > limit:
                    over.append((count, os.path.relpath(path, root)))
    for count, path in sorted(over, reverse=True):
        print(f"{path}: {count} lines (at most {limit})")
    if over:
        sys.exit(1)
    print(f"no source file over {limit} lines")

if __name__ == "__main__":
    main()
