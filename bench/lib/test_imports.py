"""No bench module imports one that imports it back, directly or around a longer circle.

Reads every bench/*.py and bench/lib/*.py (their `import` statements at any depth, so an import
inside a function counts too) and looks for a cycle among them. Run by tests/tooling.rs (so by
`cargo test`), or by hand: `python3 bench/lib/test_imports.py` prints the circle and exits 1.
"""

import ast
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent


def graph():
    """bench module -> the bench modules it imports ("lib" is the package, "lib.x" its parts)."""
    files = {p.stem: p for p in BENCH.glob("*.py")}
    files.update({("lib" if p.stem == "__init__" else f"lib.{p.stem}"): p
                  for p in (BENCH / "lib").glob("*.py")})
    g = {}
    for name, path in files.items():
        package = "lib" if name.startswith("lib") else ""
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package if node.level else (node.module or "")
                if node.level and node.module:
                    base = f"{base}.{node.module}"
                # `from lib import x`: x may be a module of the package
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        g[name] = edges
    return g


def cycle(g):
    """One import circle as a list of modules (first == last), or None."""
    done, path = set(), []

    def visit(m):
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        path.append(m)
        for n in sorted(g[m]):
            c = visit(n)
            if c:
                return c
        path.pop()
        done.add(m)
        return None

    for m in sorted(g):
        c = visit(m)
        if c:
            return c
    return None


def test_no_import_circles():
    g = graph()
    c = cycle(g)
    assert c is None, "import circle: " + " -> ".join(c)
    assert {"harness", "push_bench", "tiers_bench", "lib.common"} <= set(g), sorted(g)
    # Imports inside functions count: the harness loads the push and tiers benches in its run.
    assert {"push_bench", "tiers_bench"} <= g["harness"], sorted(g["harness"])
    # The package imports none of the scripts built on it.
    scripts = {m for m in g if not m.startswith("lib")}
    for m in g:
        if m.startswith("lib"):
            assert not (g[m] & scripts), f"{m} imports {sorted(g[m] & scripts)}"


if __name__ == "__main__":
    try:
        test_no_import_circles()
    except AssertionError as e:
        print(f"bench imports: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"bench imports: no circle among {len(graph())} modules")
