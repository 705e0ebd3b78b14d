"""Run an app on a free loopback port in a background thread (tests, the load script)."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import uvicorn


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", startup_timeout: float = 60.0) -> Iterator[str]:
    """Serve `app` until the block exits; yields its base URL (http://127.0.0.1:PORT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="nv-test-server")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the server thread exited during startup")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError("the server did not start in time")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


# ------------------------------------------------------------------ random-weight checkpoints (load tests)
# Shapes of known models; weights are random (serving speed does not depend on their values).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=True),
    "tiny": dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=4096, tie_word_embeddings=True),
}
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
           "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _full_vocab_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer with exactly `vocab_size` ids (bytes, then byte pairs, then
    triples, then the ChatML specials last), so every id a random model emits decodes to text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    regular = vocab_size - len(_SPECIALS)
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    pairs = [a + b for a in alphabet for b in alphabet]
    for tok in pairs:
        if len(vocab) >= regular:
            break
        vocab[tok] = len(vocab)
        merges.append((tok[0], tok[1]))
    for left in pairs:
        for c in alphabet:
            if len(vocab) >= regular:
                break
            vocab[left + c] = len(vocab)
            merges.append((left, c))
        if len(vocab) >= regular:
            break
    for s in _SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=_SPECIALS[0], pad_token=_SPECIALS[0],
                                   additional_special_tokens=list(_SPECIALS[1:]))
    fast.chat_template = _CHATML
    return fast


def write_random_checkpoint(out_dir: str | Path, shape: str = "qwen3-0.6b", seed: int = 0) -> Path:
    """A Qwen3 HF checkpoint dir (bf16 safetensors, config, tokenizer) of a known shape with random
    weights. Reuses the dir when it already holds one. Tensors are made directly (no model init)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
    out = Path(out_dir)
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _full_vocab_tokenizer(SHAPES[shape]["vocab_size"])
    eos = tokenizer.convert_tokens_to_ids(_SPECIALS[0])
    config = Qwen3Config(**SHAPES[shape], eos_token_id=eos, pad_token_id=eos, bos_token_id=None,
                         architectures=["Qwen3ForCausalLM"])
    with torch.device("meta"):
        names = {k: v.shape for k, v in Qwen3ForCausalLM(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shp in names.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if "norm" in name:
            tensors[name] = torch.ones(shp, dtype=torch.bfloat16)
        else:
            tensors[name] = (0.02 * torch.randn(shp, generator=gen)).to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
