"""GGUF reading and conversion on tiny files written by the tests (fast; no SmolLM2 needed)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

from gguf_writer import write_llama_gguf  # noqa: E402

from nv_engine.model_loader.gguf import cache_dir_for, convert_gguf, find_gguf_file  # noqa: E402
from nv_engine.model_loader.gguf import convert as convert_module  # noqa: E402
from nv_engine.model_loader.gguf.llama import llama3_rope_scaling, permute_qk, unpermute_qk  # noqa: E402


def tiny_llama(tie: bool = False, **overrides):
    kwargs = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, architectures=["LlamaForCausalLM"])
    kwargs.update(overrides)
    config = transformers.LlamaConfig(**kwargs)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms so a swapped norm would show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return config, model


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(root))
    return root / "nv" / "gguf"


def _rope_interleaved(x: torch.Tensor, pos: float, theta: float) -> torch.Tensor:
    """llama.cpp's rope: rotate adjacent pairs (x[2i], x[2i+1]) by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    freqs = pos * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * freqs.cos() - b * freqs.sin()
    out[..., 1::2] = a * freqs.sin() + b * freqs.cos()
    return out


def _rope_half(x: torch.Tensor, pos: float, theta: float) -> torch.Tensor:
    """HF's rope: rotate (x[i], x[i + D/2]) by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    freqs = pos * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * freqs.cos() - b * freqs.sin(), a * freqs.sin() + b * freqs.cos()], dim=-1)


@pytest.mark.parametrize("heads,head_dim,cols", [(4, 8, 16), (3, 64, 5), (2, 4, None)])
def test_unpermute_inverts_permute(heads, head_dim, cols):
    shape = (heads * head_dim,) if cols is None else (heads * head_dim, cols)
    weight = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert np.array_equal(unpermute_qk(permute_qk(weight, heads), heads), weight)
    assert not np.array_equal(permute_qk(weight, heads), weight)


def test_unpermuted_rows_make_hf_rope_equal_llama_cpp_rope():
    """The reason for the permutation: interleaved rope on GGUF rows == HF rope on un-permuted rows."""
    heads, head_dim, hidden = 2, 8, 6
    gguf_weight = np.random.default_rng(1).standard_normal((heads * head_dim, hidden))
    hf_weight = unpermute_qk(gguf_weight, heads)
    x = torch.randn(hidden, dtype=torch.float64)
    q_gguf = (torch.from_numpy(gguf_weight) @ x).view(heads, head_dim)
    q_hf = (torch.from_numpy(hf_weight) @ x).view(heads, head_dim)
    scores_gguf = _rope_interleaved(q_gguf, 7.0, 10000.0) @ _rope_interleaved(q_gguf, 3.0, 10000.0).T
    scores_hf = _rope_half(q_hf, 7.0, 10000.0) @ _rope_half(q_hf, 3.0, 10000.0).T
    torch.testing.assert_close(scores_hf, scores_gguf)


def test_unpermute_rejects_bad_shape():
    with pytest.raises(ValueError, match="heads"):
        unpermute_qk(np.zeros((10, 4)), 4)


@pytest.mark.parametrize("tie", [False, True])
def test_convert_f32_roundtrip(tmp_path, cache_root, tie):
    config, model = tiny_llama(tie=tie)
    path = write_llama_gguf(tmp_path / "tiny.gguf", config, model.state_dict())
    out = convert_gguf(path)
    assert out.parent == cache_root
    from safetensors.torch import load_file

    loaded = load_file(str(out / "model.safetensors"))
    expected = {k: v for k, v in model.state_dict().items() if not (tie and k == "lm_head.weight")}
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["architectures"] == ["LlamaForCausalLM"]
    assert hf_config["tie_word_embeddings"] is tie
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "max_position_embeddings"):
        assert hf_config[key] == getattr(config, key), key
    # transformers loads the converted directory and computes the same logits
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 9, 33, 2]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("quant_type", ["F16", "BF16", "Q8_0", "Q4_1"])
def test_convert_quantized_matches_gguf_dequantize(tmp_path, cache_root, quant_type):
    import gguf

    config, model = tiny_llama()
    path = write_llama_gguf(tmp_path / f"tiny-{quant_type}.gguf", config, model.state_dict(),
                            quant_type=quant_type)
    from safetensors.torch import load_file

    loaded = load_file(str(convert_gguf(path) / "model.safetensors"))
    reader = gguf.GGUFReader(path)
    q = next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight")
    expected = gguf.quants.dequantize(q.data, q.tensor_type).reshape(64, 64)
    stored = loaded["model.layers.1.self_attn.q_proj.weight"]
    assert stored.dtype == {"F16": torch.float16, "BF16": torch.bfloat16}.get(quant_type, torch.float32)
    got = stored.float().numpy()
    np.testing.assert_array_equal(got, unpermute_qk(expected, config.num_attention_heads))
    original = model.state_dict()["model.layers.1.self_attn.q_proj.weight"].numpy()
    tolerance = {"F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.02, "Q4_1": 0.1}[quant_type]
    assert np.abs(got - original).max() < tolerance * np.abs(original).max() * 10


def test_unsupported_quant_type_names_the_format(tmp_path, cache_root):
    import gguf

    unreadable = None
    for name in ("Q8_1", "Q8_K"):
        qtype = gguf.GGMLQuantizationType[name]
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except NotImplementedError:
            unreadable = (name, block, type_size)
            break
    if unreadable is None:
        pytest.skip("this gguf version dequantizes every candidate type")
    name, block, type_size = unreadable
    config, model = tiny_llama()
    state = dict(model.state_dict())
    q_weight = state.pop("model.layers.0.self_attn.q_proj.weight")
    rows, cols = q_weight.shape
    raw = np.zeros(rows * (cols // block) * type_size, dtype=np.uint8)
    path = write_llama_gguf(tmp_path / "odd.gguf", config, state,
                            raw_tensors={"blk.0.attn_q.weight": (raw, name, (rows, cols))})
    with pytest.raises(ValueError, match=rf"blk\.0\.attn_q\.weight.*{name}"):
        convert_gguf(path)
    assert not any(p.name.endswith("-v1") for p in cache_root.iterdir())  # nothing half-written kept


def test_not_a_gguf_and_unsupported_architecture(tmp_path, cache_root):
    import gguf

    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"NOPE" + bytes(60))
    with pytest.raises(ValueError, match="not a GGUF file"):
        convert_gguf(bogus)
    other = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(other), "mamba")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'mamba'"):
        convert_gguf(other)


def test_conversion_is_cached_by_content(tmp_path, cache_root, monkeypatch):
    config, model = tiny_llama()
    path = write_llama_gguf(tmp_path / "a.gguf", config, model.state_dict())
    first = convert_gguf(path)
    calls = []
    monkeypatch.setattr(convert_module, "_convert_into", lambda *a: calls.append(a))
    assert convert_gguf(path) == first and calls == []  # reused, not converted again
    copy = tmp_path / "sub" / "a.gguf"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert cache_dir_for(copy) == first  # same content, same key
    config_b, model_b = tiny_llama(tie=True)
    other = write_llama_gguf(tmp_path / "b.gguf", config_b, model_b.state_dict())
    assert cache_dir_for(other) != first


def test_find_gguf_file(tmp_path):
    assert find_gguf_file(tmp_path) is None
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert find_gguf_file(tmp_path) == tmp_path / "m.gguf"
    assert find_gguf_file(tmp_path / "m.gguf") == tmp_path / "m.gguf"
    (tmp_path / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="several .gguf files"):
        find_gguf_file(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert find_gguf_file(tmp_path) is None  # a HF checkpoint dir wins


def test_resolve_model_path_converts_gguf(tmp_path, cache_root):
    from nv_engine.model_loader.model_path import resolve_model_path

    config, model = tiny_llama()
    (tmp_path / "dir").mkdir()
    path = write_llama_gguf(tmp_path / "dir" / "tiny.gguf", config, model.state_dict())
    resolved = resolve_model_path(str(path))
    assert resolved == str(convert_gguf(path))
    assert resolve_model_path(str(path.parent)) == resolved
    assert (cache_root / resolved.split("/")[-1] / "config.json").exists()


@pytest.mark.parametrize("factor,high,orig,theta,dim", [(8.0, 4.0, 8192, 500000.0, 128),
                                                        (32.0, 4.0, 8192, 500000.0, 64),
                                                        (16.0, 2.0, 4096, 10000.0, 64)])
def test_llama3_rope_scaling_recovered_from_rope_freqs(factor, high, orig, theta, dim):
    """GGUF stores llama3 scaling as per-frequency divisors; recover the HF parameters from them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": high, "original_max_position_embeddings": orig}
    config = transformers.LlamaConfig(hidden_size=dim * 4, num_attention_heads=4, head_dim=dim,
                                      rope_theta=theta, rope_scaling=scaling, max_position_embeddings=orig * 16)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    divisors = (base / scaled.double()).numpy()
    recovered = llama3_rope_scaling(divisors, theta, dim)
    assert recovered["factor"] == pytest.approx(factor, rel=1e-5)
    assert recovered["high_freq_factor"] == pytest.approx(high, rel=1e-3)
    assert recovered["original_max_position_embeddings"] == orig
    assert llama3_rope_scaling(np.ones(dim // 2), theta, dim) is None
    with pytest.raises(ValueError, match="llama3"):
        llama3_rope_scaling(np.linspace(1, math.pi, dim // 2)[::-1].copy(), theta, dim)
