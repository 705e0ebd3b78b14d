"""Root pytest configuration for every package's tests and tests/.

Triton reads TRITON_INTERPRET when it is first imported, and many modules import it (transformers,
torch, our kernels). Without a GPU the interpreter is the only way Triton kernels run, so set it
before anything imports Triton; tests that need compiled kernels carry the `gpu` marker.
"""
import os

try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:          # nv-kvcache's own venv has no torch
    pass
