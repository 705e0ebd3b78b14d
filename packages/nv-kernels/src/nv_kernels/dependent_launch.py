"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (Hopper and newer).

At small batches a decode step is ~200 short kernels, each a few microseconds; between two of them the
GPU drains the first grid before it launches the second. With PDL (CUDA's programmatic stream
serialization, kept by CUDA-graph capture) a kernel may launch while the previous one still runs:
its programs start, set up their pointers and pull the weights they will stream into L2, then wait
(`griddepcontrol.wait`) until the previous grid has finished and its writes are visible.

The contract every kernel launched with `launch_options()` keeps (checked by reading, and by the GPU
tests that compare graph replays with PDL on and off):
- every program executes the wait before it reads anything an earlier kernel wrote and before it
  writes anything, and no program exits before it has waited: a grid that completes has then waited
  for its predecessor, so waits chain through the stream;
- before the wait it only reads what no kernel writes during a step, or prefetches: weights; the step's
  attention inputs (sequence lengths, block tables, positions, slots: staged by copies before its first kernel)
  with the rotary table; and the KV cache's entries of tokens before the step's new ones (written by earlier
  steps; the decode kernel stores a step's new token itself, after its wait).
Measured on the H200 (Qwen3-0.6B shape, CUDA graphs): batch 1 1.105 -> 1.038 ms per token, but batch 16
1.70 -> 1.81 ms per step (early-launched grids hold SM slots while they wait). So it applies to launches of
at most MAX_TOKENS (1) rows (tokens) only. `NV_PDL=0` (nv_kernels.envs, read at the first launch) or
`set_dependent_launch(False)` turns it off; it is also off off CUDA, before compute capability 9.0, and without
triton's support (triton >= 3.3).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from nv_kernels import envs

MAX_TOKENS = 1                 # the most rows of a launch with PDL (16 rows measured slower with it: see above)
_enabled: bool | None = None   # None: neither set nor read yet (the next launch reads NV_PDL)


def set_dependent_launch(enabled: bool | None) -> bool | None:
    """Turn PDL on or off for later launches (and graph captures); None forgets the setting, so the next launch
    reads NV_PDL again. Returns the previous setting, None when it was neither set nor read yet."""
    global _enabled
    previous, _enabled = _enabled, None if enabled is None else bool(enabled)
    return previous


def _switched_on() -> bool:
    """The setting: the one `set_dependent_launch` made, else NV_PDL (read now, then kept)."""
    global _enabled
    if _enabled is None:
        _enabled = envs.nv_pdl()
    return _enabled


@functools.lru_cache(maxsize=8)
def _device_supports(device: torch.device) -> bool:
    if device.type != "cuda" or envs.triton_interpret():
        return False
    if torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        from triton.language.extra import cuda as triton_cuda
    except ImportError:
        return False
    return hasattr(triton_cuda, "gdc_wait") and hasattr(triton_cuda, "gdc_launch_dependents")


def dependent_launch_enabled(device: torch.device, tokens: int) -> bool:
    """Whether a kernel over `tokens` rows on this device launches with PDL (its USE_PDL constexpr)."""
    return _switched_on() and tokens <= MAX_TOKENS and _device_supports(device)


def launch_options(device: torch.device, tokens: int) -> dict[str, Any]:
    """Keyword arguments for a Triton launch over `tokens` rows: USE_PDL for the kernel, launch_pdl for
    the launcher."""
    use = dependent_launch_enabled(device, tokens)
    return {"USE_PDL": use, "launch_pdl": True} if use else {"USE_PDL": False}
