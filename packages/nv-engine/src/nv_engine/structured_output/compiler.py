"""GrammarCompiler: StructuredOutputsParams -> xgrammar CompiledGrammar, compiled in a thread pool and
cached per (kind, spec).

Two stages, so a bad request fails when it is added and compiling never blocks a step:
`parse` (cheap, no tokenizer: the schema / regex / grammar text becomes an xgrammar Grammar, ValueError
when it does not parse) runs in the caller's thread; `submit` then compiles the Grammar against the
tokenizer's vocabulary (the costly part: every token is checked against the grammar's states) in a
worker thread and returns a Future. The tokenizer's xgrammar TokenizerInfo is built there too, on the
first compile, so an engine that never sees a grammar never pays for it.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, TypeVar

from nv_engine.structured_output.params import StructuredOutputsParams

if TYPE_CHECKING:
    import xgrammar

_Result = TypeVar("_Result")

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the rest is the message.
_XGRAMMAR_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")


class HFTokenizer(Protocol):
    """What xgrammar.TokenizerInfo.from_huggingface reads (a transformers tokenizer fits)."""

    def get_vocab(self) -> dict[str, int]: ...


def import_xgrammar() -> ModuleType:
    """xgrammar, imported on the first structured-outputs request (an engine without one never loads
    it); ValueError when it is not installed."""
    try:
        import xgrammar
    except ImportError as exc:
        raise ValueError(f"structured_outputs need the xgrammar package (pip install xgrammar): {exc}") from None
    return xgrammar


def xgrammar_message(exc: BaseException) -> str:
    """An xgrammar exception's message without the C++ source location."""
    lines = [_XGRAMMAR_PREFIX.sub("", line) for line in str(exc).strip().splitlines()]
    return " ".join(line.strip() for line in lines if line.strip()) or type(exc).__name__


def _ebnf_literal(text: str) -> str:
    """A string as an EBNF literal xgrammar reads: JSON's escapes (\\" \\\\ \\n \\uXXXX)."""
    return re.sub(r"[^\x20-\x7e]", lambda m: f"\\u{ord(m.group()):04x}" if ord(m.group()) < 0x10000
                  else f"\\U{ord(m.group()):08x}", text.replace("\\", "\\\\").replace('"', '\\"'))


class GrammarCompiler:
    """Compiles structured-output constraints for one tokenizer and model vocabulary.

    vocab_size is the model's (the logits' width), which may exceed the tokenizer's length; the ids
    past the tokenizer are never allowed. stop_token_ids end a completed grammar (the engine's EOS
    ids). cache_size compiled grammars are kept (least recently used dropped first).
    """

    def __init__(self, tokenizer: HFTokenizer, vocab_size: int, stop_token_ids: Sequence[int], *,
                 max_workers: int = 1, cache_size: int = 256) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted({int(t) for t in stop_token_ids if 0 <= int(t) < vocab_size})
        self.cache_size = cache_size
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="nv-grammar")
        self._cache: OrderedDict[tuple[str, str], Future[xgrammar.CompiledGrammar]] = OrderedDict()
        self._lock = threading.Lock()            # the cache
        self._compiler_lock = threading.Lock()   # building the xgrammar compiler (workers)
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._serialized: OrderedDict[tuple[str, str], Future[str]] = OrderedDict()
        self.tokenizer_info_json: str | None = None   # set by the first `submit_serialized` job

    def parse(self, params: StructuredOutputsParams) -> xgrammar.Grammar:
        """The constraint as an xgrammar Grammar; ValueError naming the kind when it does not parse."""
        kind = params.kind
        xgrammar = import_xgrammar()
        try:
            if params.json is not None:
                return xgrammar.Grammar.from_json_schema(params.spec, any_whitespace=False, strict_mode=True)
            if params.json_object is not None:
                return xgrammar.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
            if params.regex is not None:
                return xgrammar.Grammar.from_regex(params.regex)
            if params.choice is not None:
                alternatives = " | ".join(f'"{_ebnf_literal(c)}"' for c in params.choice)
                return xgrammar.Grammar.from_ebnf(f"root ::= {alternatives}")
            if params.grammar is not None:
                return xgrammar.Grammar.from_ebnf(params.grammar)
            if params.structural_tag is not None:
                return xgrammar.Grammar.from_structural_tag(params.structural_tag)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"structured_outputs: invalid {kind}: {xgrammar_message(exc)}") from None
        raise ValueError(f"structured_outputs: unknown kind {kind!r}")

    def submit(self, params: StructuredOutputsParams) -> Future[xgrammar.CompiledGrammar]:
        """Parse (ValueError now if the constraint is bad) and compile in the pool; a Future of the
        compiled grammar. The same constraint shares one compile (cached)."""
        return self._cached(self._cache, params.cache_key,
                            lambda: self._pool.submit(self._compile, self.parse(params)))

    def submit_serialized(self, params: StructuredOutputsParams) -> Future[str]:
        """`submit`, then the compiled grammar serialized (CompiledGrammar.serialize_json) in the pool,
        for a matcher process; cached per constraint. Once one is done, tokenizer_info_json holds the
        tokenizer's TokenizerInfo serialized too."""
        compiled = self.submit(params)
        return self._cached(self._serialized, params.cache_key, lambda: self._pool.submit(self._serialize, compiled))

    def _cached(self, cache: OrderedDict[tuple[str, str], Future[_Result]], key: tuple[str, str],
                start: Callable[[], Future[_Result]]) -> Future[_Result]:
        """The cached future of `key` (unless it failed), else `start()`'s, cached (least recently used
        dropped beyond cache_size)."""
        with self._lock:
            cached = cache.get(key)
            if cached is not None and not (cached.done() and cached.exception() is not None):
                cache.move_to_end(key)
                return cached
        future = start()
        with self._lock:
            cache[key] = future
            while len(cache) > self.cache_size:
                cache.popitem(last=False)
        return future

    def _serialize(self, compiled: Future[xgrammar.CompiledGrammar]) -> str:
        grammar = compiled.result()       # queued before this job: done, or running on another worker
        if self.tokenizer_info_json is None:
            self.tokenizer_info_json = grammar.tokenizer_info.serialize_json()
        return grammar.serialize_json()

    def _compile(self, grammar: xgrammar.Grammar) -> xgrammar.CompiledGrammar:
        xgrammar = import_xgrammar()
        with self._compiler_lock:
            compiler = self._compiler
            if compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids or None)  # type: ignore[arg-type]
                compiler = self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        try:
            return compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise ValueError(f"structured_outputs: the grammar does not compile: {xgrammar_message(exc)}") from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
