"""One configuration surface, and an engine package a newcomer can find their way in.

- Environment variables are read in one module per package (`<package>/envs.py`), through a function called when
  the value is needed: no other module reads one by name, and importing any module reads none of them.
  Engine behaviour is set by engine arguments (EngineArgs -> EngineConfig), not by the environment.
- Each envs.py names every NV_* variable it reads in its docstring.
- nv_engine's top level stays small (folders by concern, vLLM v1's layout), and nv-engine's tests mirror its
  folders.
- Every maintained benchmark script is listed in benchmarks/README.md; scripts/ holds only the developer tools of
  scripts/dev/.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC_DIRS = sorted(p for p in (ROOT / "packages").glob("*/src") if p.is_dir())
ENGINE = ROOT / "packages" / "nv-engine" / "src" / "nv_engine"
ENGINE_TESTS = ROOT / "packages" / "nv-engine" / "tests"
MAX_TOP_LEVEL_ENTRIES = 14
MIN_TOP_LEVEL_MODULE_LINES = 50


def source_files() -> list[Path]:
    return [path for src in SRC_DIRS for path in sorted(src.rglob("*.py"))]


def is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def environment_reads(tree: ast.AST) -> list[int]:
    """Line numbers where a variable is read by name: os.getenv(...), os.environ.get(...), os.environ[...] (loaded)
    and `... in os.environ`. Writes (os.environ[...] = ..., setdefault, update, pop) and whole-environment copies
    for a child process read no variable by name and are left alone."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os":
                lines.append(node.lineno)
            elif func.attr == "get" and is_os_environ(func.value):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_os_environ(node.value) and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(is_os_environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return lines


def test_only_envs_modules_read_the_environment():
    offenders = []
    for path in source_files():
        if path.name == "envs.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(ROOT)}:{line}" for line in environment_reads(tree)]
    assert not offenders, ("environment variables read outside the packages' envs.py (add a function there and "
                           "call it):\n" + "\n".join(offenders))


def test_the_rule_catches_each_kind_of_read():
    code = "import os\nos.getenv('A')\nos.environ.get('B')\nx = os.environ['C']\n'D' in os.environ\n" \
           "os.environ['E'] = '1'\nos.environ.setdefault('F', '0')\nchild = dict(os.environ)\n"
    assert environment_reads(ast.parse(code)) == [2, 3, 4, 5]


# Imports every module of every package with os.environ replaced by a mapping that records each read made from
# a file of these packages; prints the reads as JSON. Modules whose optional dependencies are missing are skipped.
_IMPORT_ALL = r"""
import collections.abc, importlib, json, os, sys
src_dirs = json.loads(sys.argv[1])
reads = []

class RecordingEnviron(collections.abc.MutableMapping):
    def __init__(self, real):
        self.real = real
    def _note(self, key):
        caller = sys._getframe(2).f_code.co_filename
        if any(caller.startswith(src) for src in src_dirs):
            reads.append([key, caller])
    def __getitem__(self, key):
        self._note(key)
        return self.real[key]
    def get(self, key, default=None):
        self._note(key)
        return self.real.get(key, default)
    def __contains__(self, key):
        self._note(key)
        return key in self.real
    def __setitem__(self, key, value):
        self.real[key] = value
    def __delitem__(self, key):
        del self.real[key]
    def __iter__(self):
        return iter(self.real)
    def __len__(self):
        return len(self.real)
    def copy(self):
        return dict(self.real)

os.environ = RecordingEnviron(os.environ)
skipped = []
for src in src_dirs:
    for root, _, files in sorted(os.walk(src)):
        for name in sorted(files):
            if not name.endswith(".py") or name == "__main__.py":
                continue
            parts = os.path.relpath(os.path.join(root, name[:-3]), src).split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            try:
                importlib.import_module(".".join(parts))
            except ImportError as exc:   # an optional extra that is not installed (ray, ...)
                skipped.append([".".join(parts), str(exc)])
print(json.dumps({"reads": reads, "skipped": skipped}))
"""


@pytest.mark.slow  # imports every module (torch, transformers, triton): ~15 s on two cores
def test_importing_any_module_reads_no_environment_variable():
    src_dirs = [str(p) for p in SRC_DIRS]
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, json.dumps(src_dirs)], capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["reads"], f"environment read while importing: {report['reads']}"
    assert len(report["skipped"]) < 10, report["skipped"]     # the check really imported the packages


def test_each_envs_module_documents_its_variables():
    envs_modules = [path for path in source_files() if path.name == "envs.py"]
    assert ENGINE / "envs.py" in envs_modules
    for path in envs_modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        names = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and re.fullmatch(r"NV_[A-Z0-9_]+", node.value)}
        missing = sorted(name for name in names if name not in doc)
        assert not missing, f"{path.relative_to(ROOT)} reads {missing} without naming them in its docstring"


def test_nv_engine_top_level_is_small():
    entries = sorted(p.name for p in ENGINE.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, entries
    short = [name for name in entries if name.endswith(".py") and name != "__about__.py"
             and len((ENGINE / name).read_text(encoding="utf-8").splitlines()) < MIN_TOP_LEVEL_MODULE_LINES]
    assert not short, f"top-level modules under {MIN_TOP_LEVEL_MODULE_LINES} lines belong in a folder: {short}"


def test_nv_engine_tests_mirror_its_folders():
    test_dirs = {p.relative_to(ENGINE_TESTS) for p in ENGINE_TESTS.rglob("*")
                 if p.is_dir() and p.name != "__pycache__"}
    assert test_dirs, "nv-engine's tests are grouped in folders"
    unmatched = sorted(str(d) for d in test_dirs if not (ENGINE / d).is_dir())
    assert not unmatched, f"test folders that name no nv_engine folder: {unmatched}"


def test_every_benchmark_script_is_listed_in_its_readme():
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.suffix in (".py", ".sh"))
    assert scripts, "benchmarks/ holds the maintained benchmark scripts"
    assert not [name for name in scripts if name not in readme], "benchmarks/README.md lists each script"
    assert not [p.name for p in (ROOT / "scripts").iterdir() if p.is_file()], "scripts/ holds only dev/"
