"""Engine arguments that the engine core hands on: the grammar matcher placement, the collective timeout and the
long-prefill threshold."""
from __future__ import annotations

import pytest

import nv_engine.executor as executor_package
from nv_engine.config.engine_args import EngineArgs
from nv_engine.core.engine_core import EngineCore
from nv_engine.structured_output import manager


@pytest.mark.parametrize(("setting", "on_cuda", "cores", "wanted"), [
    (True, False, 1, True),     # asked for: a process of its own even on CPU with one core
    (False, True, 64, False),   # refused: in the engine's process even on a large CUDA host
    (None, True, 64, True),     # unset: CUDA with enough cores
    (None, True, manager.MATCHER_PROCESS_MIN_CORES - 1, False),
    (None, False, 64, False),
])
def test_grammar_matcher_process_setting_decides(monkeypatch, setting, on_cuda, cores, wanted):
    monkeypatch.setattr(manager, "usable_cores", lambda: cores)
    assert manager.matcher_process_wanted(setting, on_cuda) is wanted


def test_engine_core_applies_its_arguments(tiny_model_dir, monkeypatch):
    seen: dict[str, object] = {}
    real_create_executor = executor_package.create_executor

    def recording_create_executor(config, *args, **kwargs):
        seen["timeout_s"] = kwargs.get("timeout_s")
        return real_create_executor(config, *args, **kwargs)

    monkeypatch.setattr(executor_package, "create_executor", recording_create_executor)
    config = EngineArgs(str(tiny_model_dir), device="cpu", max_model_len=128, num_gpu_blocks_override=16,
                        grammar_matcher_process=False, distributed_timeout_s=42.0,
                        long_prefill_token_threshold=48).create_engine_config()
    core = EngineCore(config, [0])
    try:
        assert seen["timeout_s"] == 42.0
        assert core.structured_outputs.use_matcher_process is False
        assert core.scheduler.prefill_chunk_limit == 48
    finally:
        core.shutdown()
