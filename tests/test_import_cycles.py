"""No import cycles between modules of nv's packages. Every import counts as an edge, wherever it is written:
at the top, inside a function, or under `if TYPE_CHECKING:`; and importing `a.b.c` also imports the packages
`a` and `a.b` (their `__init__` runs first). The graph is read from the source with `ast`, so nothing is imported.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC_DIRS = sorted(p for p in (ROOT / "packages").glob("*/src") if p.is_dir())


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under the packages' src dirs (a package is its __init__)."""
    modules = {}
    for src in SRC_DIRS:
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def with_parents(name: str) -> Iterator[str]:
    """'a.b.c' -> 'a', 'a.b', 'a.b.c': importing a module runs its parents' __init__ first."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def imported_modules(module: str, path: Path, files: dict[str, Path]) -> set[str]:
    """The modules that must finish running (or start, for a parent of this module) for `module` to import:
    each one an import statement names, and the parent packages of each (their __init__ runs first), except
    this module's own parents, which are already importing when it runs unless it names one explicitly."""
    is_package = path.name == "__init__.py"
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            submodules = {f"{base}.{alias.name}" for alias in node.names} & files.keys()
            named.update(submodules)  # `from a import b` with a.b a module: a is only a parent here
            if len(submodules) < len(node.names):  # some name is an attribute of `base` itself
                named.add(base)
    own_parents = set(with_parents(module)) - {module}
    loaded = set()
    for name in named:
        loaded.add(name)
        loaded.update(parent for parent in with_parents(name) if parent not in own_parents)
    return {m for m in loaded if m in files and m != module}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imported_modules(module, path, files) for module, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules (a few hundred)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [cycle_through(graph, set(component)) for component in components]


def cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A closed path a -> ... -> a inside one strongly connected component (breadth-first, so a shortest one)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in parents:
                    parents[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def test_cycles_are_found_and_printed_as_a_path():
    graph = {"a": {"a.b"}, "a.b": {"a.c"}, "a.c": set()}
    assert find_cycles(graph) == []
    graph["a.c"] = {"a"}
    assert find_cycles(graph) == [["a", "a.b", "a.c", "a"]]


def test_every_kind_of_import_is_an_edge(tmp_path: Path):
    sources = {
        "p/__init__.py": "from p.a import A\n",
        "p/a.py": "from p import b\nfrom . import c\nA = 1\ndef f():\n    from q.r.s import S\n",
        "p/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import A\n",
        "p/c.py": "",
        "q/__init__.py": "", "q/r/__init__.py": "", "q/r/s.py": "",
    }
    files = {}
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
        parts = name.removesuffix(".py").removesuffix("/__init__").split("/")
        files[".".join(parts)] = tmp_path / name
    edges = {module: imported_modules(module, path, files) for module, path in files.items()}
    assert edges["p"] == {"p.a"}
    assert edges["p.a"] == {"p.b", "p.c", "q", "q.r", "q.r.s"}  # parents of q.r.s; not p (already importing)
    assert edges["p.b"] == {"p"}  # under TYPE_CHECKING, and A is an attribute of p's __init__
    assert find_cycles(edges) == [["p", "p.a", "p.b", "p"]]
    assert list(with_parents("nv_engine.runner.memory")) == ["nv_engine", "nv_engine.runner", "nv_engine.runner.memory"]
    assert "nv_kernels.sampler_kernel" in import_graph()["nv_layers.sampler"]  # imported inside a function


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (every import counts, a module's parents included):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles)
