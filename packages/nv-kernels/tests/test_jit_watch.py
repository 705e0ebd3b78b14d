"""TritonCompileWatch: lists the Triton cache variants that appear inside the block, described compactly."""
from __future__ import annotations

from pathlib import Path

from nv_kernels.jit_watch import TritonCompileWatch, triton_cache_dir

# a signature line as Triton 3.x writes it to <kernel>.ttir: n_rows was 1 (a constant: absent),
# X and stride_x divisible by 16
TTIR = ('module {\n  tt.func public @_rms_norm_kernel(%X: !tt.ptr<bf16> {tt.divisibility = 16 : i32} '
        'loc("X"(#loc)), %W: !tt.ptr<bf16> loc("W"(#loc)), %stride_x: i32 {tt.divisibility = 16 : i32} '
        'loc("stride_x"(#loc)), %eps: f32 loc("eps"(#loc))) attributes {noinline = false} {\n')


def _variant(cache: Path, name: str, ttir: str | None) -> None:
    entry = cache / name
    entry.mkdir(parents=True)
    (entry / "__grp___rms_norm_kernel.json").write_text("{}")
    if ttir is not None:
        (entry / "_rms_norm_kernel.ttir").write_text(ttir)


def test_watch_lists_only_variants_compiled_inside(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert triton_cache_dir() == tmp_path
    _variant(tmp_path, "OLD", TTIR)
    with TritonCompileWatch() as watch:
        _variant(tmp_path, "NEW", TTIR)
        _variant(tmp_path, "GROUP_ONLY", None)       # an index entry, not a compiled variant
    assert watch.variants == ["_rms_norm_kernel(X%16, W, stride_x%16, eps)"]


def test_watch_of_a_missing_cache_is_empty(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "absent"))
    with TritonCompileWatch() as watch:
        pass
    assert watch.variants == []
