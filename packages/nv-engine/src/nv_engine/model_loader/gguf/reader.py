"""Read a GGUF file: metadata as plain Python values, tensors dequantized to float32 numpy arrays.

Works with gguf>=0.10: metadata is decoded from `ReaderField.parts` directly (no `contents()`,
which older releases lack), and quantized blocks go through `gguf.quants.dequantize`.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# GGML types stored as plain floats: the reader already gives them their numpy dtype.
_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def open_gguf(path: str | Path):
    """A `gguf.GGUFReader` over `path` (memory-mapped); ValueError when it is not a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf is a dependency of nv-engine
        raise ImportError("reading .gguf files needs the `gguf` package: pip install gguf") from exc
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        reader = GGUFReader(path)
    except Exception as exc:   # the gguf package reports a short or garbled file in many raw ways
        raise ValueError(f"{path} is a truncated or corrupt GGUF file: its header, metadata or tensor "
                         f"index cannot be read ({type(exc).__name__}: {exc})") from exc
    size = path.stat().st_size
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise ValueError(f"{path} is a truncated GGUF file: tensor {tensor.name!r} ends at byte {end}, "
                             f"but the file has {size} bytes")
    return reader


def _field_value(field) -> Any:
    """One metadata field as str / int / float / bool / list of those."""
    from gguf import GGUFValueType

    def scalar(value_type, part) -> Any:
        if value_type == GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        value = part.tolist()[0] if part.ndim else part.item()
        return bool(value) if value_type == GGUFValueType.BOOL else value

    main_type = field.types[0]
    if main_type == GGUFValueType.ARRAY:
        item_type = field.types[-1]
        return [scalar(item_type, field.parts[i]) for i in field.data]
    return scalar(main_type, field.parts[field.data[0]])


def read_metadata(reader) -> dict[str, Any]:
    """Every key/value of the file except the GGUF header counters."""
    return {
        name: _field_value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }


def tensor_shape(tensor) -> tuple[int, ...]:
    """The tensor's shape in torch order (GGUF lists dimensions innermost first)."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def dequantize_tensor(tensor) -> np.ndarray:
    """`tensor` (a `gguf.ReaderTensor`) as float32 in torch order; ValueError for a format gguf can't read."""
    from gguf import quants

    type_name = tensor.tensor_type.name
    shape = tensor_shape(tensor)
    if type_name in _FLOAT_TYPES:
        data = np.asarray(tensor.data).view(_FLOAT_TYPES[type_name])
        return data.astype(np.float32).reshape(shape)
    try:
        data = quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    except (NotImplementedError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} is stored as {type_name}, a format nv cannot dequantize "
            f"(the installed gguf package has no dequantizer for it); use a GGUF with F32/F16/BF16, "
            f"Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 or K-quant tensors"
        ) from exc
    return np.asarray(data, dtype=np.float32).reshape(shape)


def iter_tensors(reader) -> Iterator[tuple[str, Any]]:
    """(name, ReaderTensor) pairs in file order."""
    for tensor in reader.tensors:
        yield tensor.name, tensor
