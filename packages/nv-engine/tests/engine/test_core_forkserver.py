"""CoreForkserver: `nv serve` forks its engine core from a forkserver that imported the core's modules first.
Each test runs in a fresh interpreter: the forkserver is process-wide multiprocessing state."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import sys
    from nv_engine.engine.core_forkserver import CoreForkserver

    def preloaded(queue):
        # in the core's process, before anything of the target ran: what the forkserver imported
        queue.put(sorted(m for m in ("torch", "nv_engine.core.engine_core_process", "nv_engine.runner.model_runner",
                                     "nv_qwen3", "transformers.models.auto.configuration_auto",
                                     "transformers.models.qwen3.configuration_qwen3")
                         if m in sys.modules))

    if __name__ == "__main__":
        started = CoreForkserver.start()
        context = CoreForkserver.context()
        print("started", started, context.get_start_method(), "torch" in sys.modules)
        queue = context.Queue()
        child = context.Process(target=preloaded, args=(queue,))
        child.start()
        print("child", *queue.get(timeout=120))
        child.join(60)
        print("exit", child.exitcode)
''')


def _run(tmp_path, **env: str) -> list[str]:
    script = tmp_path / "forkserver_check.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env}, check=True)
    return out.stdout.splitlines()


def test_cores_fork_from_a_server_that_imported_their_modules(tmp_path):
    lines = _run(tmp_path)
    # the frontend itself has not imported torch yet; the forked process finds it loaded, with the core's module, what
    # building the core imports (model runner, models) and what unpickling its HF config needs (transformers' index
    # and the config class's module)
    assert lines == ["started True forkserver False",
                     "child nv_engine.core.engine_core_process nv_engine.runner.model_runner nv_qwen3 torch "
                     "transformers.models.auto.configuration_auto transformers.models.qwen3.configuration_qwen3",
                     "exit 0"]


def test_switched_off_cores_are_spawned(tmp_path):
    lines = _run(tmp_path, NV_CORE_FORKSERVER="0")
    assert lines == ["started False spawn False", "child", "exit 0"]


NO_CUDA_SCRIPT = textwrap.dedent('''
    import torch.cuda
    calls = []
    real = torch.cuda._lazy_init
    torch.cuda._lazy_init = lambda: calls.append("init") or real()
    from nv_engine.engine.core_forkserver import PRELOAD
    for name in PRELOAD:
        __import__(name)
    print("cuda inits", len(calls))
''')


def test_preloading_never_starts_cuda(tmp_path):
    # a CUDA context made in the forkserver would be inherited, broken, by every forked core
    script = tmp_path / "preload_check.py"
    script.write_text(NO_CUDA_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.splitlines()[-1] == "cuda inits 0"
