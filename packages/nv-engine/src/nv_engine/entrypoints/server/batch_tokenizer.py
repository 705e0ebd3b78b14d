"""BatchTokenizer: the server's prompt texts tokenized in one worker thread, many at a time.

Why: a wave of requests (256 streams ending together and 256 new ones arriving) used to tokenize each
prompt in its own `asyncio.to_thread` call. Up to 20 pool threads then ran the tokenizer wrapper's Python
at once, each holding the interpreter lock for a switch interval (5 ms) in turn, and the event loop
waited behind all of them: 100-300 ms without a wake-up, which every running stream saw as a stalled
token. Here one thread takes every text queued since its last batch and encodes them in one call of the
Rust tokenizer (`tokenizers.Tokenizer.encode_batch`, which releases the interpreter lock and runs on
all cores), so the loop competes with one thread that mostly runs outside the lock. The idea is vLLM's
AsyncMicrobatchTokenizer.

The fast path is used only where it gives the wrapper's own ids: at construction a few probe texts are
encoded both ways, with and without special tokens; a tokenizer without a Rust backend, or one whose
wrapper adds anything the backend does not, is called one text at a time (still in the one thread).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("nv_engine.entrypoints.server")

# texts the fast path must encode exactly as the tokenizer's own encode (spaces, digits, punctuation,
# non-ASCII, a newline)
_PROBES = ("Hello, world! 12345", "  two leading spaces\nand a line", "Grüße aus Köln: 東京 ü")


@dataclass(eq=False)
class _Job:
    text: str
    add_special_tokens: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class BatchTokenizer:
    """`await batch_tokenizer.encode(text, add_special_tokens=...)` -> token ids, as
    `tokenizer.encode` gives them. The tokenizer's exception for a text is raised for that text
    only. The worker thread starts with the first text and is a daemon; `close` stops it."""

    def __init__(self, tokenizer: Any, max_batch_size: int = 512) -> None:
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.backend = self._checked_backend(tokenizer)   # tokenizers.Tokenizer, or None: encode one by one
        self.num_batches = 0                  # worker calls so far (each encodes up to max_batch_size texts)
        self._jobs: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        job = _Job(text, add_special_tokens, loop.create_future(), loop)
        with self._ready:
            if self._closed:
                raise RuntimeError("the tokenizer is closed")
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nv-tokenizer", daemon=True)
                self._thread.start()
            self._ready.notify()
        return await job.future

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ---- the worker thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if self._closed and not self._jobs:
                    return
                batch = [self._jobs.popleft() for _ in range(min(len(self._jobs), self.max_batch_size))]
            self.num_batches += 1
            results: list[tuple[_Job, list[int] | BaseException]] = []
            for add_special_tokens in (True, False):
                group = [job for job in batch if job.add_special_tokens is add_special_tokens]
                if group:
                    results.extend(zip(group, self._encode_group(group, add_special_tokens), strict=True))
            self._deliver(results)

    def _encode_group(self, jobs: list[_Job], add_special_tokens: bool) -> list[list[int] | BaseException]:
        if self.backend is not None:
            try:
                encodings = self.backend.encode_batch([job.text for job in jobs],
                                                      add_special_tokens=add_special_tokens)
                return [list(encoding.ids) for encoding in encodings]
            except Exception:      # one bad text fails the whole call: find it, one by one
                pass
        out: list[list[int] | BaseException] = []
        for job in jobs:
            try:
                out.append(self._encode_one(job.text, add_special_tokens))
            except Exception as exc:
                out.append(exc)
        return out

    def _encode_one(self, text: str, add_special_tokens: bool) -> list[int]:
        if self.backend is not None:
            return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    @staticmethod
    def _deliver(results: list[tuple[_Job, list[int] | BaseException]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, list[int] | BaseException]]] = {}
        for job, result in results:
            by_loop.setdefault(job.loop, []).append((job, result))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_all, items)
            except RuntimeError:       # the loop closed: nobody waits
                pass

    @staticmethod
    def _checked_backend(tokenizer: Any) -> Any | None:
        """The Rust tokenizer behind an HF fast tokenizer, if it encodes the probes as the wrapper does."""
        backend = getattr(tokenizer, "_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch"):
            return None
        try:
            for add_special_tokens in (True, False):
                fast = backend.encode_batch(list(_PROBES), add_special_tokens=add_special_tokens)
                for probe, encoding in zip(_PROBES, fast, strict=True):
                    if list(encoding.ids) != list(tokenizer.encode(probe, add_special_tokens=add_special_tokens)):
                        logger.info("the tokenizer's own encode differs from its Rust backend's: "
                                    "prompts are tokenized one at a time")
                        return None
        except Exception:
            return None
        return backend


def _resolve_all(items: list[tuple[_Job, list[int] | BaseException]]) -> None:
    for job, result in items:
        if job.future.done():          # the waiting handler was cancelled
            continue
        if isinstance(result, BaseException):
            job.future.set_exception(result)
        else:
            job.future.set_result(result)
