"""One-off (issue 10, "Layout"): move graphcost modules into subpackages and rewrite every
import, in graphcost/, tests/, benchmarks/, examples/ and the docs' module paths.

usage: python tools/relayout.py REPO tools/layout.map [--dry]
then add an __init__.py with a docstring to each new subpackage, run the tests, and
commit the result as one move-only commit. Modules not in the map stay where they are
(the script prints them): add new modules to the map first.
MAPFILE lines: old.dotted.module -> new.dotted.module   (packages move with their contents)
"""
import ast, re, subprocess, sys
from pathlib import Path

repo = Path(sys.argv[1]).resolve()
dry = "--dry" in sys.argv
MAP = {}
for line in Path(sys.argv[2]).read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
        a, b = [x.strip() for x in line.split("->")]
        MAP[a] = b

pkg = repo / "graphcost"
def modname(p: Path) -> str:
    rel = p.relative_to(repo).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)

files = sorted(pkg.rglob("*.py"))
old_mods = {modname(p) for p in files}
is_pkg = {modname(p) for p in files if p.name == "__init__.py"}

def new_name(old: str) -> str:
    best = None
    for a in MAP:
        if old == a or old.startswith(a + "."):
            if best is None or len(a) > len(best):
                best = a
    return old if best is None else MAP[best] + old[len(best):]

missing = [m for m in old_mods if new_name(m) == m and m.count(".") == 1 and m not in ("graphcost.cli", "graphcost.__main__")]
print("staying at the top:", sorted(missing))

def resolve(fmod: str, is_init: bool, level: int, module: str | None) -> str:
    base = fmod.split(".") if is_init else fmod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))

edits = {}
pyfiles = files + [p for p in repo.rglob("*.py") if p.parts[len(repo.parts)] in ("tests", "benchmarks", "examples")]
for p in pyfiles:
    src = p.read_text()
    fmod = modname(p) if p in files else ""
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)
    reps = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "graphcost"):
            base = (resolve(fmod, p.name == "__init__.py", node.level, node.module) if node.level
                    else node.module)
            groups = {}
            for al in node.names:
                full = f"{base}.{al.name}"
                if full in old_mods:
                    nn = new_name(full)
                    parent, leaf = nn.rsplit(".", 1)
                    groups.setdefault(parent, []).append(leaf + (f" as {al.asname}" if al.asname else "") if leaf == al.name or al.asname else f"{leaf} as {al.name}")
                else:
                    groups.setdefault(new_name(base), []).append(al.name + (f" as {al.asname}" if al.asname else ""))
            indent = lines[node.lineno - 1][: node.col_offset]
            # keep a trailing comment of the last line
            last = lines[node.end_lineno - 1]
            tail = last[node.end_col_offset:].rstrip("\n")
            out = []
            for i, (mod, names) in enumerate(groups.items()):
                stmt = f"from {mod} import {', '.join(names)}"
                if len(indent) + len(stmt) > 99:
                    stmt = f"from {mod} import (" + ", ".join(names) + ")"
                out.append((indent if i else "") + stmt)
            text = "\n".join(out) + tail
            reps.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, text))
    if reps:
        reps.sort(reverse=True)
        for (l0, c0, l1, c1, text) in reps:
            before = lines[l0 - 1][:c0]
            after_nl = "\n" if lines[l1 - 1].endswith("\n") else ""
            lines[l0 - 1:l1] = [before + text + after_nl]
        edits[p] = "".join(lines)

# absolute references everywhere (code, tests, benchmarks, docs)
pat_mods = sorted(old_mods, key=len, reverse=True)
rx = re.compile(r"\bgraphcost((?:\.\w+)+)")
def abs_fix(text: str) -> str:
    def sub(m):
        dotted = "graphcost" + m.group(1)
        parts = dotted.split(".")
        for k in range(len(parts), 1, -1):
            head = ".".join(parts[:k])
            if head in old_mods:
                return new_name(head) + "".join("." + x for x in parts[k:])
        return dotted
    return rx.sub(sub, text)

targets = [p for p in repo.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".toml", ".yaml", ".txt")
           and ".git" not in p.parts and "_bundled" not in p.parts and "__pycache__" not in p.parts]
for p in targets:
    text = edits.get(p, p.read_text())
    new = abs_fix(text)
    # path mentions like graphcost/graph/settings.py in docs and comments
    def path_sub(m):
        mod = "graphcost." + m.group(1).replace("/", ".")
        if mod in old_mods:
            return new_name(mod).replace(".", "/") + ".py"
        return m.group(0)
    new = re.sub(r"\bgraphcost/([\w/]+)\.py\b", path_sub, new)
    def dir_sub(m):
        mod = "graphcost." + m.group(1)
        if mod in is_pkg:
            return new_name(mod).replace(".", "/") + "/"
        return m.group(0)
    new = re.sub(r"\bgraphcost/(\w+)/(?!\w)", dir_sub, new)
    if new != p.read_text():
        edits[p] = new

if dry:
    for p in sorted(edits):
        print("edit", p.relative_to(repo))
    sys.exit(0)
for p, t in edits.items():
    p.write_text(t)
# move files
moves = []
for p in files:
    m = modname(p)
    nm = new_name(m)
    if nm != m:
        if p.name == "__init__.py":
            dest = repo / Path(*nm.split(".")) / "__init__.py"
        else:
            dest = repo / (Path(*nm.split(".")).as_posix() + ".py")
        moves.append((p, dest))
for src, dest in moves:
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "mv", str(src), str(dest)], cwd=repo, check=True)
print(f"moved {len(moves)} files, edited {len(edits)}")
