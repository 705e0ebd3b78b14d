"""Rotary embeddings against transformers' own rotary implementation, for every scaling type."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nv_layers.rotary import get_rope, rope_config_from_hf

transformers = pytest.importorskip("transformers")
from transformers import Qwen3Config  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

HEAD_DIM, MAX_POS = 32, 256
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn_mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def hf_config(scaling: dict | None, base: float = 10000.0) -> Qwen3Config:
    return Qwen3Config(hidden_size=128, num_attention_heads=4, head_dim=HEAD_DIM, max_position_embeddings=MAX_POS,
                       rope_theta=base, rope_scaling=dict(scaling) if scaling else None)


def hf_rotate(config: Qwen3Config, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """q/k [T, H, D] rotated by HF at `positions` (all in one call)."""
    rope = Qwen3RotaryEmbedding(config)
    cos, sin = rope(q, positions[None])                      # [1, T, D]
    qh, kh = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return qh[0].transpose(0, 1), kh[0].transpose(0, 1)


@pytest.mark.parametrize("name", [n for n in SCALINGS if n != "dynamic"])
def test_rotation_matches_hf(name: str) -> None:
    scaling = SCALINGS[name]
    config = hf_config(scaling, base=50000.0)
    rope_cfg = rope_config_from_hf(config)
    rope = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, rope_cfg.base, rope_cfg.scaling)
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 1, 5, 63, 64, 65, 200, MAX_POS - 1])
    q = torch.randn(len(positions), 4, HEAD_DIM, generator=gen)
    k = torch.randn(len(positions), 2, HEAD_DIM, generator=gen)
    ours_q, ours_k = rope(positions, q, k)
    ref_q, ref_k = hf_rotate(config, q, k, positions)
    torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_k, ref_k, rtol=1e-5, atol=1e-5)


def test_dynamic_ntk_matches_hf_token_by_token() -> None:
    """Each position uses the frequencies HF uses when that position is the newest token."""
    scaling = SCALINGS["dynamic"]
    rope = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, scaling)
    assert rope.cos_sin_cache.shape[0] == 2 * MAX_POS
    gen = torch.Generator().manual_seed(1)
    for pos in [3, MAX_POS - 1, MAX_POS, MAX_POS + 7, 2 * MAX_POS - 1]:
        positions = torch.tensor([pos])
        q = torch.randn(1, 2, HEAD_DIM, generator=gen)
        ours_q, _ = rope(positions, q, q)
        ref_q, _ = hf_rotate(hf_config(scaling), q, q, positions)
        torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=1e-5)
    plain = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, None)
    torch.testing.assert_close(rope.cos_sin_cache[:MAX_POS], plain.cos_sin_cache)


def test_scalings_differ_from_default() -> None:
    """Guard against a scaling silently falling back to the default table (dynamic equals it below
    max_position by design; its test above covers positions beyond)."""
    plain = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, None).cos_sin_cache
    for name, scaling in SCALINGS.items():
        if scaling is not None and name != "dynamic":
            table = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, scaling).cos_sin_cache[:MAX_POS]
            assert not torch.allclose(table, plain), name


def test_partial_rotary_leaves_tail_untouched() -> None:
    rope = get_rope(HEAD_DIM, HEAD_DIM // 2, MAX_POS, 10000.0, None)
    q = torch.randn(3, 2, HEAD_DIM)
    out, _ = rope(torch.tensor([0, 4, 9]), q, q)
    torch.testing.assert_close(out[..., HEAD_DIM // 2:], q[..., HEAD_DIM // 2:])
    assert not torch.allclose(out[1:, :, : HEAD_DIM // 2], q[1:, :, : HEAD_DIM // 2])


def test_flat_and_headed_inputs_agree() -> None:
    rope = get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, None)
    q, k = torch.randn(4, 3, HEAD_DIM), torch.randn(4, 1, HEAD_DIM)
    pos = torch.tensor([1, 2, 30, 31])
    q1, k1 = rope(pos, q, k)
    q2, k2 = rope(pos, q.reshape(4, -1), k.reshape(4, -1))
    torch.testing.assert_close(q1.reshape(4, -1), q2)
    torch.testing.assert_close(k1.reshape(4, -1), k2)


def test_rope_config_reads_both_config_styles() -> None:
    new_style = hf_config({"rope_type": "linear", "factor": 2.0}, base=1e6)
    cfg = rope_config_from_hf(new_style)
    assert cfg.base == 1e6 and cfg.scaling["factor"] == 2.0
    old_style = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "dynamic", "factor": 3.0})
    cfg = rope_config_from_hf(old_style)
    assert cfg.base == 5e5 and cfg.scaling["type"] == "dynamic"
    assert rope_config_from_hf(SimpleNamespace(rope_theta=1e4, rope_scaling=None)).scaling is None
    assert rope_config_from_hf(hf_config(None)).scaling is None        # rope_type "default"
    assert rope_config_from_hf(SimpleNamespace()).base == 10000.0


def test_unsupported_rope_type_raises() -> None:
    with pytest.raises(ValueError, match="longrope"):
        get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000.0, {"rope_type": "longrope", "factor": 2.0})
