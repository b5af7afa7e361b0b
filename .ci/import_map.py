#!/usr/bin/env python3
"""The import map of the engine crate: which room (file) names which, and its circles.

    python3 .ci/import_map.py            # prints the circles; exits 1 if there is one not in KNOWN
    python3 .ci/import_map.py --edges    # every arrow, `from -> to`

A room is a file under engine/src (a `mod.rs` is its folder's face). An arrow A -> B is a
`crate::`, `super::` or `self::` path in A (in `use` lines or inline) that resolves to a
module in B. A face file's arrows to its own folder's rooms (its `mod` lines and `pub use`
re-exports) are its job, and are not counted. A circle is a strongly connected set of two
or more rooms. Tests (`#[cfg(test)] mod tests` at a file's end) are not rooms' imports.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine", "src")
# Circles tolerated for now: none (issue 28 cut the last). A new one fails CI.
KNOWN = set()
# The house's floors, top to bottom (docs/design.md, "Code map"): a room may
# name rooms on its own floor or below, never above. A new top-level module
# must be given its floor here.
LAYERS = [
    "main", "cli", "loader", "images", "pack", "metrics", "cache", "tar", "tokens", "source", "reader",
    "planner", "manifest", "sampler", "say", "remote", "home",
]


def module_of(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def rooms():
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".rs"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)
                out[module_of(rel)] = rel
    return out


def strip(src):
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    cut = re.search(r"#\[cfg\(test\)\]\s*mod tests", src)
    return src[: cut.start()] if cut else src


def expand_use(body):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    body = re.sub(r"\s+", "", body)
    out = []

    def walk(prefix, s):
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for it in items:
            if not it:
                continue
            m = re.match(r"^(.*?)::\{(.*)\}$", it)
            if m:
                walk(prefix + m.group(1) + "::", m.group(2))
            else:
                out.append(prefix + it.split(" as ")[0])

    walk("", body)
    return out


def resolve(path, here, is_face, known):
    parts = path.split("::")
    if parts[0] == "crate":
        base, parts = (), parts[1:]
    elif parts[0] in ("super", "self"):
        base = here
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                base = base[:-1]
            parts = parts[1:]
    else:
        return None
    full = base + tuple(p for p in parts if p and p != "*")
    for n in range(len(full), -1, -1):
        if full[:n] in known:
            return full[:n]
    return None


def edges():
    known = rooms()
    out = set()
    for mod, rel in known.items():
        src = strip(open(os.path.join(ROOT, rel)).read())
        is_face = rel.endswith(("mod.rs", "lib.rs", "main.rs"))
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", src):
            paths += expand_use(m.group(1))
        paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", src)
        for p in paths:
            to = resolve(p, mod, is_face, known)
            if to is None or to == mod:
                continue
            if is_face and to[: len(mod)] == mod:
                continue  # a face names its own rooms
            if to == () or mod == ():
                continue  # the crate root (lib.rs) is everyone's face
            out.add((mod, to))
    return known, out


def circles(nodes, arrows):
    graph = {n: [] for n in nodes}
    for a, b in arrows:
        graph[a].append(b)
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return sorted(out)


def name(mod, known):
    return known[mod]


def main():
    known, arrows = edges()
    if "--edges" in sys.argv:
        for a, b in sorted(arrows):
            print("%s -> %s" % (name(a, known), name(b, known)))
        return 0
    found = circles(list(known), arrows)
    new = 0
    for comp in found:
        files = tuple(sorted(name(m, known) for m in comp))
        tag = "known" if files in KNOWN else "NEW"
        new += tag == "NEW"
        print("circle (%s): %s" % (tag, " <-> ".join(files)))
    up, unplaced = [], set()
    for a, b in sorted(arrows):
        fa, fb = (a[0] if a else "lib"), (b[0] if b else "lib")
        for f in (fa, fb):
            if f not in LAYERS:
                unplaced.add(f)
        if fa in LAYERS and fb in LAYERS and LAYERS.index(fb) < LAYERS.index(fa):
            up.append("%s -> %s" % (name(a, known), name(b, known)))
    for arrow in up:
        print("arrow running up (%s is above): %s" % (arrow.split(" -> ")[1].split("/")[0], arrow))
    for f in sorted(unplaced):
        print("module %s has no floor in LAYERS (.ci/import_map.py): give it one" % f)
    print("import map: %d rooms, %d arrows, %d circles (%d not known), %d arrows running up" % (len(known), len(arrows), len(found), new, len(up)))
    return 1 if new or up or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
