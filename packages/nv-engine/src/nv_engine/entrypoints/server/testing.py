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
    """Serve `app` until the block exits; yields its base URL (http://127.0.0.1:PORT). An nv app
    (one with `app.state.nv`) runs under DrainingServer, kept as `app.state.server`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    state = getattr(getattr(app, "state", None), "nv", None)
    if state is not None:
        from nv_engine.entrypoints.server.draining_server import DrainingServer

        server: uvicorn.Server = DrainingServer(config, state)
        app.state.server = server
    else:
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
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
           "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def full_vocab_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer with exactly `vocab_size` ids (bytes, then byte pairs, then
    triples, then the ChatML specials last), so every id a random model emits decodes to text and
    the server's detokenization costs what it would with a real vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    regular = vocab_size - len(_SPECIALS)
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    pairs = [a + b for a in alphabet for b in alphabet]
    candidates = ((p[0], p[1]) for p in pairs)
    triples = ((p, c) for p in pairs for c in alphabet)
    for left, right in (*candidates, *triples):
        if len(vocab) >= regular:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    for s in _SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=_SPECIALS[0], pad_token=_SPECIALS[0],
                                   additional_special_tokens=list(_SPECIALS[1:]))
    fast.chat_template = _CHATML
    return fast


def write_load_test_checkpoint(out_dir: str | Path, shape: str = "qwen3-0.6b", seed: int = 0) -> Path:
    """nv_engine.checkpoints.random_model's random-weight Qwen3 checkpoint (bf16) plus a full-vocabulary
    tokenizer. Reuses the dir when it already holds one."""
    from transformers import AutoConfig

    from nv_engine.checkpoints.random_model import write_random_checkpoint

    out = Path(out_dir)
    if not ((out / "model.safetensors").exists() and (out / "tokenizer.json").exists()):
        write_random_checkpoint(out, shape, dtype="bfloat16", seed=seed, with_tokenizer=False)
        full_vocab_tokenizer(AutoConfig.from_pretrained(out, trust_remote_code=False).vocab_size).save_pretrained(out)
    return out
