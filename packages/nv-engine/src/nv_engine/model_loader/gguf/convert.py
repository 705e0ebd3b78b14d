"""Convert a GGUF checkpoint into a HF-format directory once, cached by the file's content hash.

The directory holds config.json, generation_config.json, model*.safetensors (dequantized) and the
tokenizer files (built by transformers from the GGUF vocabulary, with the file's chat template), so
the rest of the engine loads it like any HF checkpoint.

Tensors keep an exact dtype: F16 / BF16 tensors stay as they are, quantized ones become float32
(a Q4_1 value d * q + m is not exact in bf16); the engine casts to its dtype when it loads them.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from nv_engine import envs
from nv_engine.model_loader.gguf import llama
from nv_engine.model_loader.gguf.reader import dequantize_tensor, iter_tensors, open_gguf, read_metadata, tensor_shape

# Bump when the output layout changes, so stale cache entries are not reused.
CONVERTER_VERSION = 1
_SHARD_BYTES = 2 << 30  # start a new safetensors shard after about 2 GiB
_SUPPORTED_ARCHITECTURES = {"llama"}
_DONE_MARKER = ".nv-complete"


def gguf_cache_root() -> Path:
    """$XDG_CACHE_HOME/nv/gguf (default ~/.cache/nv/gguf)."""
    return envs.cache_dir() / "gguf"


def find_gguf_file(path: str | os.PathLike) -> Path | None:
    """The .gguf file `path` names: the file itself, or the only .gguf in a directory that is not
    already a HF checkpoint (no config.json). None when `path` holds no GGUF checkpoint."""
    path = Path(path)
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(files) > 1:
        names = ", ".join(p.name for p in files)
        raise ValueError(f"{path} holds several .gguf files ({names}); pass the file to use")
    return files[0] if files else None


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir_for(path: str | os.PathLike, cache_root: str | os.PathLike | None = None) -> Path:
    """Where the conversion of `path` lives: <root>/<stem>-<size>-<sha256[:16]>-v<converter>."""
    path = Path(path)
    root = Path(cache_root) if cache_root is not None else gguf_cache_root()
    key = f"{path.stem}-{path.stat().st_size}-{_file_digest(path)[:16]}-v{CONVERTER_VERSION}"
    return root / key


def convert_gguf(path: str | os.PathLike, cache_root: str | os.PathLike | None = None) -> Path:
    """HF-format directory for the GGUF file `path`, converting it on first use.

    Concurrent callers each convert into a private temp dir and the first rename wins.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ValueError(f"GGUF file {path} does not exist")
    out = cache_dir_for(path, cache_root)
    if (out / _DONE_MARKER).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _convert_into(path, tmp)
        (tmp / _DONE_MARKER).write_text(str(path) + "\n")
        if out.exists():  # a partial leftover (no marker) from a killed run
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / _DONE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert_into(path: Path, out: Path) -> None:
    reader = open_gguf(path)
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in _SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {sorted(_SUPPORTED_ARCHITECTURES)})")
    tensors = dict(iter_tensors(reader))
    shapes = {name: tensor_shape(t) for name, t in tensors.items()}
    rope_factors = dequantize_tensor(tensors["rope_freqs.weight"]) if "rope_freqs.weight" in tensors else None
    config = llama.llama_config(meta, shapes, rope_factors)
    _write_weights(tensors, meta, out)
    config.save_pretrained(out)
    _write_generation_config(meta, out)
    if "tokenizer.ggml.model" in meta:
        _write_tokenizer(path, meta, out)


def _write_weights(tensors: dict[str, Any], meta: dict[str, Any], out: Path) -> None:
    """Dequantize every tensor, fix q/k row order, write ~2 GiB safetensors shards (+ index if several)."""
    import torch
    from safetensors.torch import save_file

    shard: dict[str, torch.Tensor] = {}
    written: list[tuple[Path, list[str]]] = []
    total = 0

    def flush() -> None:
        part = out / f"part-{len(written):05d}.safetensors"
        save_file(shard, str(part), metadata={"format": "pt"})
        written.append((part, list(shard)))
        shard.clear()

    for gguf_name, tensor in tensors.items():
        hf_name = llama.hf_tensor_name(gguf_name)
        if hf_name is None:
            continue
        value = torch.from_numpy(np.ascontiguousarray(llama.fix_tensor(hf_name, dequantize_tensor(tensor), meta)))
        kind = tensor.tensor_type.name
        if kind in ("F16", "BF16"):  # exact in its own dtype: keep it small
            value = value.to(torch.float16 if kind == "F16" else torch.bfloat16)
        if shard and sum(v.nbytes for v in shard.values()) + value.nbytes > _SHARD_BYTES:
            flush()
        shard[hf_name] = value
        total += value.nbytes
    flush()
    if len(written) == 1:
        written[0][0].rename(out / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for i, (part, names) in enumerate(written, start=1):
        name = f"model-{i:05d}-of-{len(written):05d}.safetensors"
        part.rename(out / name)
        weight_map.update(dict.fromkeys(names, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_generation_config(meta: dict[str, Any], out: Path) -> None:
    """bos / eos (plus the end-of-turn token when the file names one) / pad."""
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    generation = {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(eos)) if len(set(eos)) > 1 else (eos[0] if eos else None),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    generation = {k: v for k, v in generation.items() if v is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def _write_tokenizer(path: Path, meta: dict[str, Any], out: Path) -> None:
    """transformers builds a fast tokenizer from the GGUF vocabulary; keep the file's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                              trust_remote_code=False)
    template = meta.get("tokenizer.chat_template")
    if template:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
