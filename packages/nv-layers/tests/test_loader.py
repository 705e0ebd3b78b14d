"""load_safetensors: packed-module mapping, several files, tied heads, and the name errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from nv_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    load_safetensors,
)

PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
          "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


class Toy(nn.Module):
    packed_modules_mapping = PACKED

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(10, 4)
        self.block = nn.Module()
        self.block.qkv_proj = QKVParallelLinear(4, 2, 2, 1, bias=True)
        self.block.gate_up_proj = MergedColumnParallelLinear(4, [6, 6])
        self.block.down_proj = RowParallelLinear(6, 4)
        self.norm = RMSNorm(4)
        self.lm_head = ParallelLMHead(10, 4)
        if tied:
            self.lm_head.tie_to(self.embed)


def checkpoint(tied: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {"embed.weight": (10, 4), "block.q_proj.weight": (4, 4), "block.k_proj.weight": (2, 4),
              "block.v_proj.weight": (2, 4), "block.q_proj.bias": (4,), "block.k_proj.bias": (2,),
              "block.v_proj.bias": (2,), "block.gate_proj.weight": (6, 4), "block.up_proj.weight": (6, 4),
              "block.down_proj.weight": (4, 6), "norm.weight": (4,)}
    if not tied:
        shapes["lm_head.weight"] = (10, 4)
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def write(tmp_path: Path, tensors: dict[str, torch.Tensor], files: int = 1) -> Path:
    names = sorted(tensors)
    for i in range(files):
        save_file({n: tensors[n] for n in names[i::files]}, str(tmp_path / f"model-{i}.safetensors"))
    return tmp_path


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("files", [1, 3])
def test_loads_packed_and_plain_weights(tmp_path: Path, tied: bool, files: int) -> None:
    ckpt = checkpoint(tied)
    model = Toy(tied)
    load_safetensors(model, write(tmp_path, ckpt, files))
    b = model.block
    torch.testing.assert_close(b.qkv_proj.weight.data, torch.cat([ckpt[f"block.{x}_proj.weight"] for x in "qkv"]))
    torch.testing.assert_close(b.qkv_proj.bias.data, torch.cat([ckpt[f"block.{x}_proj.bias"] for x in "qkv"]))
    torch.testing.assert_close(b.gate_up_proj.weight.data,
                               torch.cat([ckpt["block.gate_proj.weight"], ckpt["block.up_proj.weight"]]))
    torch.testing.assert_close(b.down_proj.weight.data, ckpt["block.down_proj.weight"])
    torch.testing.assert_close(model.norm.weight.data, ckpt["norm.weight"])
    head = ckpt["embed.weight"] if tied else ckpt["lm_head.weight"]
    torch.testing.assert_close(model.lm_head.weight.data, head)


def test_tied_checkpoint_with_lm_head_keeps_embedding(tmp_path: Path) -> None:
    ckpt = checkpoint(tied=True)
    ckpt["lm_head.weight"] = torch.zeros(10, 4)
    ckpt["block.rotary_emb.inv_freq"] = torch.zeros(2)               # old checkpoints carry this
    model = Toy(tied=True)
    load_safetensors(model, write(tmp_path, ckpt))
    torch.testing.assert_close(model.embed.weight.data, ckpt["embed.weight"])


def test_missing_and_unexpected_names_are_listed(tmp_path: Path) -> None:
    ckpt = checkpoint(tied=False)
    del ckpt["block.k_proj.weight"], ckpt["norm.weight"]
    ckpt["block.extra.weight"] = torch.zeros(1)
    model = Toy(tied=False)
    with pytest.raises(ValueError) as err:
        load_safetensors(model, write(tmp_path, ckpt))
    msg = str(err.value)
    assert "missing weights: block.k_proj.weight, norm.weight" in msg
    assert "unexpected weights: block.extra.weight" in msg


def test_untied_head_absent_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing weights: lm_head.weight"):
        load_safetensors(Toy(tied=False), write(tmp_path, checkpoint(tied=True)))


def test_fused_checkpoint_names_load_directly(tmp_path: Path) -> None:
    ckpt = checkpoint(tied=True)
    fused = {k: v for k, v in ckpt.items() if "gate_proj" not in k and "up_proj" not in k}
    fused["block.gate_up_proj.weight"] = torch.cat([ckpt["block.gate_proj.weight"], ckpt["block.up_proj.weight"]])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = Toy(tied=True), Toy(tied=True)
    load_safetensors(a, write(tmp_path / "a", ckpt))
    load_safetensors(b, write(tmp_path / "b", fused))
    torch.testing.assert_close(a.block.gate_up_proj.weight, b.block.gate_up_proj.weight)


def test_shape_mismatch_and_empty_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_safetensors(Toy(tied=True), tmp_path)
    ckpt = checkpoint(tied=True)
    ckpt["norm.weight"] = torch.zeros(5)
    with pytest.raises(ValueError, match="shape"):
        load_safetensors(Toy(tied=True), write(tmp_path, ckpt))


@pytest.mark.parametrize("name, shape", [("block.q_proj.weight", (8, 4)), ("block.k_proj.weight", (4, 4)),
                                         ("block.gate_proj.weight", (12, 4)), ("block.down_proj.weight", (4, 12)),
                                         ("embed.weight", (12, 4))])
def test_larger_checkpoint_tensor_is_refused_not_sliced(tmp_path: Path, name: str, shape: tuple) -> None:
    """A config smaller than the checkpoint (fewer heads, a smaller MLP) must not load a cut tensor."""
    tensors = checkpoint(tied=True)
    tensors[name] = torch.randn(shape)
    with pytest.raises(ValueError, match=rf"{name}.*expected shape \(\d+, \d+\).*found \({shape[0]}, {shape[1]}\)"):
        load_safetensors(Toy(tied=True), write(tmp_path, tensors))
