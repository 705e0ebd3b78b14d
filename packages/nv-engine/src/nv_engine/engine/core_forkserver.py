"""CoreForkserver: engine-core processes forked from a server process that already imported the core's modules.

Spawned, an engine-core process imports torch, transformers and nv before it can build anything (~11 s on an H200
host), and `nv serve` spawns it only after the frontend has done the same imports and its own setup (~13 s): the
two import phases ran one after the other. `CoreForkserver.start()`, called first thing by the `nv serve` command
(before the frontend imports torch), starts multiprocessing's forkserver with those modules preloaded, so its
imports run while the frontend's do; the core is then forked from it, ready to build. AsyncLLM starts the core
before it reads the model's config (the core resolves the engine arguments itself), so the fork waits only for
the preload. For multiprocessing the frontend is still the core's parent (sentinel, exit code, join).

The preload covers everything the core imports before it is ready, not only the spawn target's imports: the HF
config class (transformers' model index, which reads the source of every model it ships: ~1 s of a CPU core), the
tokenizer and generation-config modules (the core reads its EOS ids) and the modules that building the core
imports (executor, model runner, CUDA's attention backend, the built-in models). A fork waits until the preload is
done, so work moved into it never delays the core: it either overlaps the frontend's own setup or would have run
after the fork anyway.

Safe because the forkserver never touches CUDA (it only imports). A forkserver child's environment is the
server's, taken when it started; EngineCoreProcess.main applies the variables the frontend sets for one core (a
data-parallel core's CUDA_VISIBLE_DEVICES) itself. Without start(), or with NV_CORE_FORKSERVER=0, cores are spawned
as before.
"""
from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver
from multiprocessing.context import BaseContext

from nv_engine import envs
from nv_engine.model_loader.registry import builtin_hf_config_modules, builtin_model_modules

PRELOAD = [
    "nv_engine.core.engine_core_process",    # the spawn target's module: torch, nv's kernels, zmq
    "transformers",
    # unpickling the config's HF config class: transformers' model index and AutoConfig's tables
    "transformers.models.auto.configuration_auto",
    # ... and the class's own module. Defining a config class runs transformers' docstring decorator, which imports
    # the modeling index (generation utils, torch.distributed.tensor, sympy): 4-6 s of a core, paid once here.
    "transformers.models.auto.modeling_auto",
    *builtin_hf_config_modules(),     # a module a transformers version lacks is skipped (the preload's ImportError)
    # a core started from the engine arguments alone reads the tokenizer (its EOS id) and generation config
    "transformers.models.auto.tokenization_auto",
    "transformers.generation.configuration_utils",
    # building the core: the executor, the model runner (layers, CUDA graphs), CUDA's default attention backend
    "nv_engine.executor",
    "nv_engine.runner.model_runner",
    "nv_kernels.triton_backend",
    *builtin_model_modules(),
]


class CoreForkserver:
    """Which multiprocessing context starts engine-core processes in this process."""

    _started = False

    @classmethod
    def start(cls) -> bool:
        """Start the forkserver (it imports PRELOAD in the background); later cores fork from it. False where the
        platform has no forkserver or NV_CORE_FORKSERVER=0 (cores are then spawned)."""
        if cls._started:
            return True
        if not envs.core_forkserver():
            return False
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return False
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
        cls._started = True
        return True

    @classmethod
    def context(cls) -> BaseContext:
        """The forkserver's context once start() ran, else spawn's."""
        return multiprocessing.get_context("forkserver" if cls._started else "spawn")
