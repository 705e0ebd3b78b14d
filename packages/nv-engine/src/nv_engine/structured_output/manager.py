"""StructuredOutputManager: the engine's side of structured outputs, behind five calls.

The engine core calls, per request and per step:
1. `hold(seq)` when a request with `SamplingParams.structured_outputs` is added, instead of adding its
   first sequence to the scheduler: ValueError (nothing kept) when the constraint does not parse;
   otherwise its grammar compiles in a worker thread while the request waits here.
2. `release(wait=...)` at the start of every step: the held sequences whose grammar is ready (to add
   to the scheduler now) and those whose compile failed (to finish with an error). wait=True (the
   scheduler has nothing to run) blocks briefly for the next compile instead of spinning.
3. `fill_bitmask(seqs)` when a step's sampling rows are built: the [S, ceil(V/32)] int32 token
   bitmask for the step (StepInput.sampling.token_bitmask), None when no row has a grammar.
4. `accept(seqs, token_ids)` after the step's tokens are appended: advances each row's matcher and
   names the sequences to finish (the grammar terminated: stop; a token it rejects: abort).
5. `remove_request(request_id)` when a request finishes or is aborted.
A row's bitmask needs the row's previous token, so steps with grammar requests run synchronously:
SamplingParams.needs_output_token_ids is true for them, which turns async scheduling off while they
run (as penalties do). Preemption keeps a sequence's output, and so its matcher's state.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from nv_engine.structured_output.compiler import GrammarCompiler, HFTokenizer, import_xgrammar
from nv_kvcache import FinishReason

if TYPE_CHECKING:
    import xgrammar

    from nv_engine.engine_sequence import EngineSequence

logger = logging.getLogger(__name__)

# How long release(wait=True) blocks for a compile before the engine loop looks at its commands again.
RELEASE_WAIT_SECONDS = 0.05


@dataclass
class ReleasedRequests:
    ready: list[EngineSequence] = field(default_factory=list)               # add to the scheduler
    failed: list[tuple[EngineSequence, str]] = field(default_factory=list)  # finish: (first seq, error)


class StructuredOutputManager:
    """Grammars and matchers of one engine. vocab_size: the model's (logits width); eos_token_ids end
    a completed grammar."""

    def __init__(self, load_tokenizer: Callable[[], HFTokenizer | None], vocab_size: int,
                 eos_token_ids: Sequence[int]) -> None:
        self._load_tokenizer = load_tokenizer      # called once, at the first grammar (an engine core has no
        self.tokenizer: HFTokenizer | None = None  # tokenizer of its own until then)
        self.vocab_size = vocab_size
        self.bitmask_width = (vocab_size + 31) // 32
        self._eos_token_ids = list(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._held: dict[str, tuple[Future[xgrammar.CompiledGrammar], EngineSequence]] = {}
        self._grammars: dict[str, xgrammar.CompiledGrammar] = {}   # request id -> its compiled grammar
        self._matchers: dict[int, xgrammar.GrammarMatcher] = {}    # seq id -> its matcher

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None and self.tokenizer is None:
            self.tokenizer = self._load_tokenizer()
        if self.tokenizer is None:
            raise ValueError("structured_outputs need a tokenizer; this model has none")
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size, self._eos_token_ids)
        return self._compiler

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def active(self) -> bool:
        """Some request's grammar is compiled (the per-step calls have work)."""
        return bool(self._grammars)

    # ---- 1. add ------------------------------------------------------------------------------
    def hold(self, seq: EngineSequence) -> None:
        """Keep a request's first sequence until its grammar compiled. ValueError when the request
        has no constraint or the constraint does not parse (then nothing is kept)."""
        params = seq.params.structured_outputs
        if params is None:
            raise ValueError(f"request {seq.request_id!r} has no structured_outputs")
        if seq.request_id in self._held or seq.request_id in self._grammars:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        self._held[seq.request_id] = (self.compiler.submit(params), seq)

    # ---- 2. start of a step ------------------------------------------------------------------
    def release(self, wait: bool = False) -> ReleasedRequests:
        """The held requests whose compile ended. wait=True: if none has, wait up to
        RELEASE_WAIT_SECONDS for one."""
        released = ReleasedRequests()
        if not self._held:
            return released
        if wait and not any(future.done() for future, _ in self._held.values()):
            wait_futures([future for future, _ in self._held.values()], timeout=RELEASE_WAIT_SECONDS,
                         return_when=FIRST_COMPLETED)
        for request_id, (future, seq) in list(self._held.items()):
            if not future.done():
                continue
            del self._held[request_id]
            error = future.exception()
            if error is not None:
                logger.warning("request %s: %s", request_id, error)
                released.failed.append((seq, str(error)))
            else:
                self._grammars[request_id] = future.result()
                released.ready.append(seq)
        return released

    # ---- 3. building a step ------------------------------------------------------------------
    def fill_bitmask(self, seqs: Sequence[EngineSequence]) -> np.ndarray | None:
        """[S, ceil(V/32)] int32 for the step's sampling rows (bit j of word w allows token
        32 * w + j; rows without a grammar allow every token); None when no row has a grammar."""
        if not self._grammars:
            return None
        bitmask = None
        for row, seq in enumerate(seqs):
            matcher = self._matcher(seq)
            if matcher is None:
                continue
            if bitmask is None:
                bitmask = np.full((len(seqs), self.bitmask_width), -1, dtype=np.int32)
            matcher.fill_next_token_bitmask(bitmask, row)
        return bitmask

    def _matcher(self, seq: EngineSequence) -> xgrammar.GrammarMatcher | None:
        matcher = self._matchers.get(seq.seq_id)
        if matcher is None:
            grammar = self._grammars.get(seq.request_id)
            if grammar is None:
                return None
            matcher = self._matchers[seq.seq_id] = import_xgrammar().GrammarMatcher(grammar)
        return matcher

    # ---- 4. after a step ---------------------------------------------------------------------
    def accept(self, seqs: Sequence[EngineSequence], token_ids: Sequence[int]
               ) -> list[tuple[EngineSequence, FinishReason]]:
        """Advance the matchers of the step's sampling rows by their sampled tokens; the sequences to
        finish: STOP where the grammar took its stop token (the scheduler stops on it too, except
        under ignore_eos or min_tokens), ABORT where the token breaks the grammar (a ban such as min_tokens left
        the row nothing the grammar allows)."""
        to_finish: list[tuple[EngineSequence, FinishReason]] = []
        if not self._matchers:
            return to_finish
        for seq, token_id in zip(seqs, token_ids, strict=True):
            matcher = self._matchers.get(seq.seq_id)
            if matcher is None or matcher.is_terminated():
                continue
            if not matcher.accept_token(int(token_id)):
                logger.warning("request %s: sampled token %d is outside its grammar; finishing it",
                               seq.request_id, token_id)
                if not seq.is_finished:
                    to_finish.append((seq, FinishReason.ABORT))
                continue
            if not seq.is_finished and matcher.is_terminated():
                to_finish.append((seq, FinishReason.STOP))
        return to_finish

    # ---- 5. end of a request -----------------------------------------------------------------
    def remove_request(self, request_id: str, seq_ids: Sequence[int]) -> None:
        """Forget a finished or aborted request (a held one is dropped; its compile stays cached)."""
        self._held.pop(request_id, None)
        self._grammars.pop(request_id, None)
        for seq_id in seq_ids:
            self._matchers.pop(seq_id, None)

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()

