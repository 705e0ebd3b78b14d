"""Executors on CPU with gloo and a fake runner (nv_engine.executor.testing.FakeRunner)."""
from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import signal
import time

import pytest
import torch.distributed as dist

from nv_engine.executor import MultiProcExecutor, TorchrunExecutor, UniProcExecutor, create_executor
from nv_engine.executor.testing import FakeConfig, engine_decode_step, measure_call_latency

RUNNER = "nv_engine.executor.testing:FakeRunner"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _assert_clean(pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "worker processes left behind"
    assert not dist.is_initialized(), "the driver's process group was not destroyed"


@pytest.fixture(autouse=True, scope="module")
def _no_leftover_children():
    yield
    leftovers = [p for p in multiprocessing.active_children() if p.name.startswith("nv-tp-worker")]
    assert not leftovers, f"leftover workers: {leftovers}"


class TestHealthyExecutor:
    @pytest.fixture(scope="class")
    def executor(self):
        ex = create_executor(FakeConfig(tensor_parallel_size=2), RUNNER)
        yield ex
        ex.shutdown()

    def test_rank0_result_and_every_rank_ran(self, executor):
        assert isinstance(executor, MultiProcExecutor) and executor.driver_in_process
        assert executor.run_on_all_ranks("pid") == os.getpid()          # rank 0's result, from this process
        assert executor.run_on_all_ranks("rank_sum") == 3.0              # (0 + 1) + (1 + 1): both ranks ran it
        executor.run_on_all_ranks("rank_sum")
        assert executor.run_on_all_ranks("calls_sum") == 4.0             # each rank counted 2 calls
        assert executor.run_on_all_ranks("echo", value={"x": [1, 2]}) == {"x": [1, 2]}

    def test_50mb_message_goes_through(self, executor):
        blob = os.urandom(50 * 1024 * 1024)
        assert executor.run_on_all_ranks("nbytes_sum", blob) == 2 * len(blob)

    def test_unknown_method_keeps_executor(self, executor):
        with pytest.raises(AttributeError, match="no_such_method"):
            executor.run_on_all_ranks("no_such_method")
        assert executor.run_on_all_ranks("rank_sum") == 3.0

    def test_errors_after_the_collective_keep_executor_usable(self, executor):
        # rank 1 raises after the all_reduce: every rank finished, so the group is consistent
        with pytest.raises(RuntimeError, match=r"worker rank 1 raised in raise_on\(\)") as info:
            executor.run_on_all_ranks("raise_on", 1, before_collective=False)
        assert "Traceback" in str(info.value) and "after the collective" in str(info.value)
        # rank 0 (this process) raising reaches the caller as itself
        with pytest.raises(ValueError, match="fake failure on rank 0 after the collective"):
            executor.run_on_all_ranks("raise_on", 0, before_collective=False)
        assert executor.run_on_all_ranks("rank_sum") == 3.0

    def test_decode_step_latency(self, executor):
        step = engine_decode_step(num_seqs=256, context_len=1024)   # the engine's StepInput
        stats = measure_call_latency(executor, step, iters=100)
        print(f"\ndecode StepInput {len(pickle.dumps(step))} bytes: {stats}")
        assert stats["median_us"] < 5000

    def test_second_executor_in_the_same_process(self, executor):
        # this process already hosts rank 0 of `executor`, so the second one spawns all its ranks
        with create_executor(FakeConfig(tensor_parallel_size=2, tag=10), RUNNER) as other:
            assert not other.driver_in_process
            assert set(other.worker_pids) == {0, 1}
            for _ in range(3):
                assert other.run_on_all_ranks("rank_sum") == 23.0       # 3 + 2 * tag
                assert executor.run_on_all_ranks("rank_sum") == 3.0
            assert other.run_on_all_ranks("pid") == other.worker_pids[0]
            pids = list(other.worker_pids.values())
        assert not any(_alive(p) for p in pids)
        assert executor.run_on_all_ranks("rank_sum") == 3.0


def test_uniproc_when_tp_is_1():
    ex = create_executor(FakeConfig(tensor_parallel_size=1), RUNNER)
    assert isinstance(ex, UniProcExecutor) and ex.is_driver
    assert ex.run_on_all_ranks("rank_sum") == 1.0 and ex.run_on_all_ranks("pid") == os.getpid()
    ex.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        ex.run_on_all_ranks("rank_sum")


def test_tp_group_beside_a_live_in_process_runner_goes_to_workers():
    with create_executor(FakeConfig(tensor_parallel_size=1), RUNNER) as single:
        with create_executor(FakeConfig(tensor_parallel_size=2), RUNNER) as tp:
            assert not tp.driver_in_process           # would change the TP size `single` sees
            assert tp.run_on_all_ranks("rank_sum") == 3.0 and single.run_on_all_ranks("rank_sum") == 1.0
        assert not dist.is_initialized()


def test_bad_runner_and_bad_tp_size():
    with pytest.raises(ValueError, match="no class"):
        create_executor(FakeConfig(), "nv_engine.executor.testing:Missing")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        create_executor(FakeConfig(tensor_parallel_size=0), RUNNER)


def test_torchrun_executor_needs_matching_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="must equal WORLD_SIZE"):
        create_executor(FakeConfig(tensor_parallel_size=4), RUNNER)
    assert TorchrunExecutor  # the class the torchrun test drives end to end


def test_worker_init_failure_reports_traceback_and_cleans_up():
    with pytest.raises(RuntimeError, match=r"rank 1 raised in __init__\(\)") as info:
        MultiProcExecutor(FakeConfig(fail_init_rank=1), RUNNER)
    assert "fake init failure on rank 1" in str(info.value)
    assert not dist.is_initialized()


def test_worker_error_while_rank0_waits_closes_executor():
    ex = MultiProcExecutor(FakeConfig(), RUNNER, failure_grace_s=0.5)
    pids = list(ex.worker_pids.values())
    start = time.monotonic()
    # rank 1 raises before the all_reduce: rank 0 would wait forever in it
    with pytest.raises(RuntimeError, match="fake failure on rank 1") as info:
        ex.run_on_all_ranks("raise_on", 1)
    assert time.monotonic() - start < 5
    assert "Traceback" in str(info.value) and "executor is closed" in str(info.value)
    with pytest.raises(RuntimeError, match="closed"):
        ex.run_on_all_ranks("rank_sum")
    _assert_clean(pids)
    ex.shutdown()


@pytest.mark.parametrize("driver_in_process", [True, False])
def test_killed_worker_makes_next_call_raise(driver_in_process):
    ex = MultiProcExecutor(FakeConfig(), RUNNER, driver_in_process=driver_in_process)
    assert ex.run_on_all_ranks("rank_sum") == 3.0
    pids = list(ex.worker_pids.values())
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 .*(died|cannot be reached)"):
        ex.run_on_all_ranks("rank_sum")
    assert time.monotonic() - start < 5
    with pytest.raises(RuntimeError, match="closed"):
        ex.run_on_all_ranks("rank_sum")
    ex.shutdown()
    _assert_clean(pids)


def test_worker_dying_inside_a_call_raises():
    ex = MultiProcExecutor(FakeConfig(), RUNNER)
    pids = list(ex.worker_pids.values())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) died with exit code 7"):
        ex.run_on_all_ranks("exit_on", 1, 7)    # rank 0 sits in the all_reduce when rank 1 exits
    assert time.monotonic() - start < 5
    ex.shutdown()
    _assert_clean(pids)


def test_shutdown_and_garbage_collection_stop_workers():
    import torch

    threads = torch.get_num_threads()
    ex = MultiProcExecutor(FakeConfig(), RUNNER)
    pids = list(ex.worker_pids.values())
    ex.shutdown()
    ex.shutdown()   # idempotent
    assert torch.get_num_threads() == threads   # rank 0's share of the cores is given back
    _assert_clean(pids)
    with pytest.raises(RuntimeError, match="closed"):
        ex.run_on_all_ranks("rank_sum")

    ex = MultiProcExecutor(FakeConfig(), RUNNER)
    pids = list(ex.worker_pids.values())
    del ex
    gc.collect()
    _assert_clean(pids)


two_gpus = pytest.mark.skipif(
    not __import__("torch").cuda.is_available() or __import__("torch").cuda.device_count() < 2,
    reason="needs 2 CUDA GPUs")


@pytest.mark.gpu
@two_gpus
def test_nccl_two_gpus_calls_and_dead_worker():
    ex = create_executor(FakeConfig(tensor_parallel_size=2, device="cuda"), RUNNER)
    assert ex.driver_in_process and os.environ.get("NCCL_NVLS_ENABLE") == "0"
    assert ex.run_on_all_ranks("rank_sum") == 3.0
    blob = os.urandom(50 * 1024 * 1024)
    assert ex.run_on_all_ranks("nbytes_sum", blob) == 2 * len(blob)
    stats = measure_call_latency(ex, engine_decode_step(256, 1024), iters=100)
    print(f"\nNCCL decode StepInput round trip: {stats}")
    pids = list(ex.worker_pids.values())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="died"):
        ex.run_on_all_ranks("exit_on", 1, 7)    # rank 0 sits in an NCCL all_reduce: the executor aborts it
    assert time.monotonic() - start < 15
    ex.shutdown()
    _assert_clean(pids)


def test_unpicklable_config_fails_cleanly():
    config = FakeConfig(tag=lambda: None)   # a lambda cannot travel to a spawned worker
    with pytest.raises(Exception, match="pickle|lambda"):
        MultiProcExecutor(config, RUNNER)
    assert not dist.is_initialized()


def test_worker_error_before_rank0_enters_the_call_still_closes_executor(monkeypatch):
    # the failing rank's error can arrive before the driver's own rank starts the call (a busy machine); the grace
    # must then start when it does, or rank 0 waits in its collective until the store's timeout
    ex = MultiProcExecutor(FakeConfig(), RUNNER, failure_grace_s=0.5)
    group = ex._state.group
    set_busy = group.set_local_busy

    def late_driver(busy: bool) -> None:
        if busy:
            deadline = time.monotonic() + 10
            while not group.replies.qsize() and time.monotonic() < deadline:   # rank 1's error is in
                time.sleep(0.01)
        set_busy(busy)

    monkeypatch.setattr(group, "set_local_busy", late_driver)
    pids = list(ex.worker_pids.values())
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="fake failure on rank 1") as info:
        ex.run_on_all_ranks("raise_on", 1)
    assert time.monotonic() - start < 5
    assert "executor is closed" in str(info.value)
    _assert_clean(pids)
    ex.shutdown()
