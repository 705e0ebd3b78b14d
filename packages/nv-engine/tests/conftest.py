"""Fixtures for nv-engine's unit tests: tiny random Qwen3 checkpoints (with tokenizer) written once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nv_engine.model_loader.random_model import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("nv_engine_tiny") / "tiny", "tiny",
                                   dtype="float32", with_tokenizer=True, num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HF-written tiny Qwen3 of tests/conftest.py (std 0.1, randomised norms: varied greedy text)."""
    from tiny_checkpoints import write_tiny_checkpoint

    out_dir = tmp_path_factory.mktemp("tiny_qwen3")
    write_tiny_checkpoint(out_dir, "qwen3", 0, None, True, {})
    return out_dir


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """Tiny models run far faster on one thread (and do not stall on a busy 2-core machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
