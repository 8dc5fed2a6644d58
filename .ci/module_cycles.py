#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a circle.

Each crate's modules should import one way: a module may use its children
and anything below it in the layering, never something that uses it back.
For every module with child modules, this script collects the edges between
those children (`use crate::...`, `super::...`, inline `crate::a::b` paths,
re-exports followed to the module that defines the name) and reports every
strongly connected set of more than one child as a cycle.

Test code (`#[cfg(test)]` to the end of a file, `tests.rs` files) is left
out: tests may reach across modules without shaping the layering.

Usage: module_cycles.py [WORKSPACE_ROOT]   (exit 1 when a cycle is found)
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
USE_RE = re.compile(r"\buse\s+([^;]*?);", re.S)
INLINE_RE = re.compile(r"\b((?:crate|super|self)(?:::(?:super|%s))+)" % IDENT)
COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING_RE = re.compile(r'"(?:\\.|[^"\\])*"')


def strip(text):
    """Drops comments, strings and test code so only real paths remain."""
    text = COMMENT_RE.sub("", text)
    text = STRING_RE.sub('""', text)
    m = re.search(r"^#\[cfg\(test\)\]", text, re.M)
    if m:
        text = text[: m.start()]
    return text


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (as segment lists)."""
    tree = re.sub(r"\s+", "", tree)
    tree = re.sub(r"\bas" + IDENT, "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        i = s.find("{")
        if i < 0:
            return [prefix + [seg for seg in s.split("::") if seg]]
        head = [seg for seg in s[:i].split("::") if seg]
        inner = s[i + 1 : s.rfind("}")]
        out = []
        for part in split_top(inner):
            out.extend(walk(prefix + head, part))
        return out

    return walk([], tree)


class Crate:
    def __init__(self, src):
        self.src = src
        self.modules = {}  # tuple(path) -> stripped text
        for dirpath, _, files in os.walk(src):
            for name in files:
                if not name.endswith(".rs") or name == "tests.rs":
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, src)[:-3].split(os.sep)
                if rel in (["lib"], ["main"]):
                    mod = ()
                elif rel[-1] == "mod":
                    mod = tuple(rel[:-1])
                elif rel[0] == "bin":
                    continue
                else:
                    mod = tuple(rel)
                with open(path, encoding="utf-8") as f:
                    self.modules[mod] = strip(f.read())
        self.children = {}
        for mod in self.modules:
            if mod:
                self.children.setdefault(mod[:-1], set()).add(mod[-1])
        # name -> absolute path, per module, from its `use` statements
        self.imports = {}
        for mod, text in self.modules.items():
            table = {}
            for m in USE_RE.finditer(text):
                for segs in expand_use(m.group(1)):
                    absolute = self.absolute(mod, segs)
                    if absolute and absolute[-1] != "*":
                        table[absolute[-1] if segs[-1] != "self" else absolute[-1]] = absolute
            self.imports[mod] = table

    def absolute(self, mod, segs):
        """Resolves a path written in `mod` to segments from the crate root."""
        if not segs:
            return None
        if segs[0] == "crate":
            out = []
            rest = segs[1:]
        elif segs[0] in ("super", "self"):
            out = list(mod)
            rest = segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    if not out:
                        return None
                    out.pop()
                rest = rest[1:]
        elif segs[0] in self.children.get(mod, ()):
            out = list(mod)
            rest = segs
        else:
            return None
        out.extend(s for s in rest if s != "self")
        return out

    def resolve(self, path, depth=0):
        """Follows re-exports until the path names a module or leaves one."""
        mod = ()
        for i, seg in enumerate(path):
            if seg in self.children.get(mod, ()):
                mod = mod + (seg,)
                continue
            target = self.imports.get(mod, {}).get(seg)
            if target is not None and depth < 8 and target[: len(mod) + 1] != list(mod) + [seg]:
                return self.resolve(target + path[i + 1 :], depth + 1)
            break
        return mod

    def edges(self):
        """(parent, from_child, to_child) for every reference between siblings."""
        found = set()
        for mod, text in self.modules.items():
            paths = [segs for m in USE_RE.finditer(text) for segs in expand_use(m.group(1))]
            paths += [m.group(1).split("::") for m in INLINE_RE.finditer(text)]
            for segs in paths:
                absolute = self.absolute(mod, segs)
                if absolute is None:
                    continue
                target = self.resolve([s for s in absolute if s != "*"])
                common = 0
                while common < min(len(mod), len(target)) and mod[common] == target[common]:
                    common += 1
                if common < len(mod) and common < len(target):
                    found.add((mod[:common], mod[common], target[common]))
        return found


def cycles(edges):
    """Strongly connected sets of more than one node (Tarjan)."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    srcs = sorted(
        os.path.join(root, "crates", c, "src") for c in os.listdir(os.path.join(root, "crates"))
    )
    srcs.append(os.path.join(root, "tests", "src"))
    failed = False
    for src in srcs:
        if not os.path.isdir(src):
            continue
        crate = Crate(src)
        by_parent = {}
        for parent, a, b in crate.edges():
            by_parent.setdefault(parent, set()).add((a, b))
        name = os.path.relpath(os.path.dirname(src), root)
        for parent in sorted(by_parent):
            for group in cycles(by_parent[parent]):
                failed = True
                where = "::".join(("crate",) + parent)
                pairs = sorted((a, b) for a, b in by_parent[parent] if a in group and b in group)
                print(f"{name}: cycle under {where}: {' <-> '.join(group)}")
                for a, b in pairs:
                    print(f"    {a} -> {b}")
    if failed:
        sys.exit(1)
    print("no module cycles")


if __name__ == "__main__":
    main()
