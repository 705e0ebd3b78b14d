"""Backend selection and its errors."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import nv_kernels
from nv_kernels import AttentionBackend, available_backends, get_backend


def test_torch_backend_is_always_available() -> None:
    backend = get_backend("torch", "cpu")
    assert backend.name == "torch" and isinstance(backend, AttentionBackend)
    assert "torch" in available_backends()


def test_default_on_cpu_is_torch() -> None:
    assert get_backend(None, "cpu").name == "torch"


def test_unknown_backend_raises() -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'nope'"):
        get_backend("nope")


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash_attn installed")
def test_flash_attn_unavailable_raises() -> None:
    with pytest.raises(ValueError, match="'flash_attn' is unavailable: .*nv-kernels\\[flash-attn\\]"):
        get_backend("flash_attn", "cuda")
    assert "flash_attn" not in available_backends()


def test_triton_on_cpu_without_interpreter_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="'triton' is unavailable"):
        get_backend("triton", "cpu")


def test_triton_without_package_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nv_kernels.registry, "_has_module", lambda name: False)
    with pytest.raises(ValueError, match="triton package is not installed"):
        get_backend("triton", torch.device("cuda"))


def test_bad_name_type_raises() -> None:
    with pytest.raises(TypeError):
        get_backend(3)  # type: ignore[arg-type]
