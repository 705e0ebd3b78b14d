"""Which Triton kernels were compiled during a stretch of code (benchmarks: no JIT in the timed region).

Triton writes every compiled variant to its on-disk cache, one directory per variant holding
<kernel>.ttir. A variant is a kernel plus the specialisation of its arguments: integers equal to 1
become constants and integers / pointers divisible by 16 get a `tt.divisibility` hint, so a kernel
meets new variants as batch sizes or table widths change. `TritonCompileWatch` lists the cache
directories that appeared while it was open and describes each variant's signature compactly:
`name(arg, arg%16, ...)`; arguments specialised to the constant 1 are missing from the list.
"""
from __future__ import annotations

import re
from pathlib import Path

from nv_kernels import envs

_ARG_SPLIT = re.compile(r",\s*%")


def triton_cache_dir() -> Path:
    configured = envs.triton_cache_dir()
    if configured is not None:
        return Path(configured)
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):  # triton < 3.4
        return Path(envs.triton_home() or Path.home()) / ".triton" / "cache"


def _entries(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if p.is_dir()} if cache.is_dir() else set()


def describe_variant(entry: Path) -> str:
    """`kernel(arg, arg%16, ...)` from the variant's .ttir; the kernel name alone without one."""
    for ttir in entry.glob("*.ttir"):
        for line in ttir.read_text(errors="replace").splitlines():
            if "tt.func public @" in line:
                name, rest = line.split("@", 1)[1].split("(", 1)
                chunks = _ARG_SPLIT.split(rest.rsplit(" attributes", 1)[0].lstrip("%"))
                args = [c.split(":", 1)[0] + ("%16" if "divisibility" in c else "") for c in chunks if c]
                return f"{name}({', '.join(args)})"
        return ttir.stem
    return entry.name


class TritonCompileWatch:
    """with TritonCompileWatch() as watch: ...; then watch.variants lists what was compiled inside."""

    def __init__(self) -> None:
        self.cache = triton_cache_dir()
        self.variants: list[str] = []

    def __enter__(self) -> TritonCompileWatch:
        self._before = _entries(self.cache)
        return self

    def __exit__(self, *exc) -> None:
        new = sorted(_entries(self.cache) - self._before)
        # a variant is several entries (the kernel and its __grp__ index); keep those with a .ttir
        self.variants = [describe_variant(self.cache / e) for e in new if any((self.cache / e).glob("*.ttir"))]
