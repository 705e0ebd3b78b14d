"""StructuredOutputManager: the engine's side of structured outputs, behind five calls.

The engine core calls, per request and per step:
1. `hold(seq)` when a request with `SamplingParams.structured_outputs` is added, instead of adding its
   first sequence to the scheduler: ValueError (nothing kept) when the constraint does not parse;
   otherwise its grammar compiles in a worker thread while the request waits here.
2. `release(wait=...)` at the start of every step: the held sequences whose grammar is ready (to add
   to the scheduler now) and those whose compile failed (to finish with an error). wait=True (the
   scheduler has nothing to run) blocks briefly for the next compile instead of spinning.
3. `fill_bitmask(seqs)` when a step's sampling rows are built: the [S, ceil(V/32)] int32 token
   bitmask for the step (StepInput.sampling.token_bitmask), None when no row has a grammar;
   `fill_bitmask_async(seqs)` starts the same fill and returns what to wait on (`.result()`).
4. `accept(seqs, token_ids)` after the step's tokens are appended: advances each row's matcher and
   names the sequences to finish (the grammar terminated: stop; a token it rejects: abort).
5. `remove_request(request_id)` when a request finishes or is aborted.
A row's bitmask needs the row's previous token: with async scheduling the engine launches the
forward of step N+1 first, then accepts step N's tokens and fills step N+1's bitmask while the
device runs it, and samples step N+1 after (ModelRunner.sample). Preemption keeps a sequence's
output, and so its matcher's state.

Where the matchers live:
- in this process (the default; LocalMatchers): one accept_token per row, one batched xgrammar fill per
  step into reused (with pin_memory page-locked) buffers, both on the engine's thread.
- in a process of their own (`use_matcher_process`, MatcherProcess): `accept` queues the tokens and
  `fill_bitmask_async` sends them with the step's rows; the process accepts and fills while the
  engine's thread does the rest of its host work (the report, the next step's schedule and inputs),
  and the engine reads the bitmask when it samples. A stop token is known by its id at once; a token
  the grammar rejects is known one step later (a reply's `rejected`), and its sequence aborts then.
  The process starts at the first structured-outputs request (importing xgrammar and torch takes it
  seconds); requests released before it serves keep their matchers in this process for their whole
  life, so none waits for it, and a step may hold rows of both kinds.
Rows without a grammar allow every token; finished rows too (their token is dropped).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from nv_engine.structured_output.compiler import GrammarCompiler, HFTokenizer
from nv_engine.structured_output.local_matchers import LocalMatchers, usable_cores
from nv_engine.structured_output.matcher_process import MatcherProcess
from nv_kvcache import FinishReason

if TYPE_CHECKING:
    import xgrammar

    from nv_engine.core.engine_sequence import EngineSequence

logger = logging.getLogger(__name__)

# How long release(wait=True) blocks for a compile before the engine loop looks at its commands again.
RELEASE_WAIT_SECONDS = 0.05
# Cores a host needs before the matchers move to a process of their own by default: that process
# accepts and fills on a core of its own beside the engine's thread (and the runner's, torch's).
MATCHER_PROCESS_MIN_CORES = 4


def matcher_process_wanted(setting: bool | None, on_cuda: bool) -> bool:
    """Whether an engine keeps its grammar matchers in a process of their own (MatcherProcess): `setting`
    (EngineConfig.grammar_matcher_process) when given; else where its runner is on CUDA (the step loop is
    bound by the host) and the host has MATCHER_PROCESS_MIN_CORES."""
    if setting is not None:
        return bool(setting)
    return on_cuda and usable_cores() >= MATCHER_PROCESS_MIN_CORES


class PendingBitmask(Protocol):
    """A step's bitmask being filled: `result()` waits for it (None: no row has a grammar)."""

    def result(self) -> np.ndarray | None: ...


@dataclass
class ReleasedRequests:
    ready: list[EngineSequence] = field(default_factory=list)               # add to the scheduler
    failed: list[tuple[EngineSequence, str]] = field(default_factory=list)  # finish: (first seq, error)


class StructuredOutputManager:
    """Grammars and matchers of one engine. vocab_size: the model's (logits width); eos_token_ids end
    a completed grammar; pin_memory: bitmask buffers in page-locked memory (only where the runner that
    reads them shares this process and runs on CUDA: it then copies them to the device directly);
    max_rows: the most sampling rows of a step (the matcher process's buffer)."""

    def __init__(self, load_tokenizer: Callable[[], HFTokenizer | None], vocab_size: int,
                 eos_token_ids: Sequence[int], pin_memory: bool = False, max_rows: int = 256) -> None:
        self._load_tokenizer = load_tokenizer      # called once, at the first grammar (an engine core has no
        self.tokenizer: HFTokenizer | None = None  # tokenizer of its own until then)
        self.vocab_size = vocab_size
        self.bitmask_width = (vocab_size + 31) // 32
        self.max_rows = max_rows
        self._eos_token_ids = list(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        # request id -> (its compile, its serialized grammar (matcher process only), first sequence)
        self._held: dict[str, tuple[Future[xgrammar.CompiledGrammar], Future[str] | None, EngineSequence]] = {}
        self._grammars: dict[str, xgrammar.CompiledGrammar] = {}   # request id -> its compiled grammar
        # seq ids whose matcher took a stop token: terminated (xgrammar ends a grammar only so), kept
        # here so a step asks xgrammar nothing per row
        self._terminated: set[int] = set()
        self._stop_token_ids = frozenset(self._eos_token_ids)
        self.pin_memory = pin_memory
        # the matchers of the requests not placed in the matcher process
        self.local = LocalMatchers(self.bitmask_width, pin_memory, self._local_grammar,
                                   lambda seq: seq.is_finished or seq.seq_id in self._terminated)
        self._use_matcher_process = False
        self.matcher_process: MatcherProcess | None = None
        self._process_grammars: dict[str, tuple[Hashable, str]] = {}   # request id -> (key, serialized grammar)
        self._process_seqs: dict[int, EngineSequence] = {}   # seq id -> sequence, with a matcher there
        self._orphaned: set[str] = set()   # requests whose matchers died with a matcher process

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
    def use_matcher_process(self) -> bool:
        """True: the matchers live in a process of their own (MatcherProcess), which accepts and fills
        beside the engine's thread. The engine core turns it on where its runner is on CUDA and the
        host has the cores (matcher_process_wanted). It may change only while no request has a
        grammar; turned off, a started process stays (idle) until `shutdown`."""
        return self._use_matcher_process

    @use_matcher_process.setter
    def use_matcher_process(self, on: bool) -> None:
        if on == self._use_matcher_process:
            return
        if self._held or self._grammars:
            raise RuntimeError("the matchers' place changes only while no request has a grammar")
        self._use_matcher_process = on

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
        compiled = self.compiler.submit(params)
        serialized = None
        if self.use_matcher_process:
            serialized = self.compiler.submit_serialized(params)
            self.start_matcher_process()
        self._held[seq.request_id] = (compiled, serialized, seq)

    def start_matcher_process(self) -> MatcherProcess:
        """The matcher process, started now if it is not running (`ready` tells when it serves; the
        first structured-outputs request starts it otherwise). One that died after it served is
        replaced (a step that waited for its reply fails without the manager seeing it)."""
        process = self.matcher_process
        if process is not None and process.ready and not process.alive:
            self._lose_matcher_process()
        if self.matcher_process is None:
            self.matcher_process = MatcherProcess(self.max_rows, self.bitmask_width, self.pin_memory)
            self.matcher_process.start()
        return self.matcher_process

    # ---- 2. start of a step ------------------------------------------------------------------
    def release(self, wait: bool = False) -> ReleasedRequests:
        """The held requests whose compile ended. With the matcher process, those released once it serves
        get their matchers there, earlier ones keep theirs in this process. wait=True: if none has
        ended, wait up to RELEASE_WAIT_SECONDS for one."""
        released = ReleasedRequests()
        if not self._held:
            return released
        process = self.matcher_process
        if process is not None and not process.alive:
            if not process.ready:
                # it died before it served (nothing of it is in use): the matchers stay in this process
                logger.warning("the grammar matcher process ended at its start (exit code %s): "
                               "matching grammars in the engine's process", process.exitcode)
                self._use_matcher_process = False
            # one that died after it served: its requests fail at their next step, and these stay in this
            # process (the next structured-outputs request starts a new one)
            self._lose_matcher_process()
            process = None
        # a request released before the process serves keeps its matcher here (no request waits for it)
        to_process = process is not None and process.ready
        futures: list[Future[Any]] = [future for held in self._held.values() for future in held[:2]
                                      if future is not None]
        if wait and not any(self._compiled(held) for held in self._held.values()):
            wait_futures(futures, timeout=RELEASE_WAIT_SECONDS, return_when=FIRST_COMPLETED)
        for request_id, held in list(self._held.items()):
            if not self._compiled(held):
                continue
            del self._held[request_id]
            compiled, serialized, seq = held
            error = compiled.exception() or (serialized.exception() if serialized is not None else None)
            if error is not None:
                logger.warning("request %s: %s", request_id, error)
                released.failed.append((seq, str(error)))
                continue
            self._grammars[request_id] = compiled.result()
            if to_process and serialized is not None and seq.params.structured_outputs is not None:
                self._process_grammars[request_id] = (seq.params.structured_outputs.cache_key, serialized.result())
            released.ready.append(seq)
        return released

    @staticmethod
    def _compiled(held: tuple[Future[xgrammar.CompiledGrammar], Future[str] | None, EngineSequence]) -> bool:
        return held[0].done() and (held[1] is None or held[1].done())

    # ---- 3. building a step ------------------------------------------------------------------
    def fill_bitmask(self, seqs: Sequence[EngineSequence]) -> np.ndarray | None:
        """[S, ceil(V/32)] int32 for the step's sampling rows (bit j of word w allows token
        32 * w + j; rows without a grammar, or finished, allow every token); None when no row has a
        grammar. The array is one of two reused buffers: valid until the next fill but one."""
        return self.fill_bitmask_async(seqs).result()

    def fill_bitmask_async(self, seqs: Sequence[EngineSequence]) -> PendingBitmask:
        """fill_bitmask, started: the rows whose matchers live in the matcher process are sent to it (the
        matchers must not advance until `.result()` returned), the others are filled here (at once, or
        once the process replied when the step has rows of both)."""
        if self._process_grammars or self._orphaned:
            return self._fill_in_process(seqs)
        return _done(self.local.fill(seqs))

    def _fill_in_process(self, seqs: Sequence[EngineSequence]) -> PendingBitmask:
        rows: list[tuple[int, Hashable] | None] = []
        grammars, terminated, orphaned = self._process_grammars, self._terminated, self._orphaned
        for seq in seqs:
            if seq.request_id in orphaned:
                raise RuntimeError(f"request {seq.request_id}: its grammar matcher was lost with its process")
            grammar = grammars.get(seq.request_id)
            if grammar is None or seq.is_finished or seq.seq_id in terminated:
                rows.append(None)
                continue
            rows.append((seq.seq_id, grammar[0]))
        if all(row is None for row in rows):
            return _done(self.local.fill(seqs))
        process = self.matcher_process
        if process is None:
            raise RuntimeError("structured outputs: no grammar matcher process")
        for seq, row in zip(seqs, rows, strict=True):
            if row is not None and seq.seq_id not in self._process_seqs:
                self._process_seqs[seq.seq_id] = seq
                key, grammar_json = grammars[seq.request_id]
                if not process.has_grammar(key):
                    process.add_grammar(key, grammar_json)
        if self.compiler.tokenizer_info_json is not None:
            process.set_tokenizer_info(self.compiler.tokenizer_info_json)
        local = any(row is None and seq.request_id in self._grammars for seq, row in zip(seqs, rows, strict=True))
        try:
            return process.fill(rows, then=(lambda bitmask: self.local.fill_rows(bitmask, seqs)) if local else None)
        except RuntimeError:
            if not process.alive:
                self._lose_matcher_process()
            raise

    def _lose_matcher_process(self) -> None:
        """The matcher process died: every request with a matcher there fails at its next step (those
        released to it with no matcher there yet move to this process); the next structured-outputs
        request starts a new process."""
        if self.matcher_process is not None:
            self.matcher_process.shutdown()
        self.matcher_process = None
        lost = {seq.request_id for seq in self._process_seqs.values()}
        self._orphaned.update(lost)
        self._process_seqs.clear()
        for request_id in [r for r in self._process_grammars if r not in lost]:
            del self._process_grammars[request_id]

    def _local_grammar(self, seq: EngineSequence) -> xgrammar.CompiledGrammar | None:
        """The grammar of a sequence whose matcher lives in this process (None: no grammar, or placed in
        the matcher process)."""
        return None if seq.request_id in self._process_grammars else self._grammars.get(seq.request_id)

    # ---- 4. after a step ---------------------------------------------------------------------
    def accept(self, seqs: Sequence[EngineSequence], token_ids: Sequence[int]
               ) -> list[tuple[EngineSequence, FinishReason]]:
        """Advance the matchers of the step's sampling rows by their sampled tokens; the sequences to
        finish: STOP where the grammar took its stop token (the scheduler stops on it too, except
        under ignore_eos or min_tokens), ABORT where the token breaks the grammar (a ban such as min_tokens left
        the row nothing the grammar allows). A matcher in the matcher process gets its token with the
        next job: its stop token ends the grammar by its id, and its rejections are those the process's
        last reply named (tokens of an earlier step)."""
        to_finish: list[tuple[EngineSequence, FinishReason]] = []
        process, in_process = self.matcher_process, self._process_seqs
        if process is not None:
            for seq_id in process.take_rejected():
                seq = in_process.get(seq_id)
                if seq is not None:
                    self._warn_rejected(seq, None)
                    if not seq.is_finished:
                        to_finish.append((seq, FinishReason.ABORT))
        accept_here, terminated, stop_token_ids = self.local.accept, self._terminated, self._stop_token_ids
        # One accept_token call per row: cheaper than BatchGrammarMatcher.batch_accept_token, whose lists
        # of handles and per-element reads of the result cost more than the (sequential) accepts.
        for seq, token_id in zip(seqs, token_ids, strict=True):
            seq_id = seq.seq_id
            if seq_id in terminated:
                continue
            if seq_id in in_process:
                if process is not None:
                    process.accept(seq_id, token_id)
            else:
                accepted = accept_here(seq_id, token_id)
                if accepted is None:
                    continue
                if not accepted:
                    self._warn_rejected(seq, token_id)
                    if not seq.is_finished:
                        to_finish.append((seq, FinishReason.ABORT))
                    continue
            if token_id in stop_token_ids:   # accepted (or, in the process, allowed by the mask): the grammar ended
                terminated.add(seq_id)
                if not seq.is_finished:
                    to_finish.append((seq, FinishReason.STOP))
        return to_finish

    @staticmethod
    def _warn_rejected(seq: EngineSequence, token_id: int | None) -> None:
        logger.warning("request %s: sampled token %s is outside its grammar; finishing it", seq.request_id,
                       "" if token_id is None else token_id)

    # ---- 5. end of a request -----------------------------------------------------------------
    def remove_request(self, request_id: str, seq_ids: Sequence[int]) -> None:
        """Forget a finished or aborted request (a held one is dropped; its compile stays cached)."""
        self._held.pop(request_id, None)
        self._grammars.pop(request_id, None)
        self._process_grammars.pop(request_id, None)
        self._orphaned.discard(request_id)
        self.local.remove(seq_ids)
        for seq_id in seq_ids:
            self._terminated.discard(seq_id)
            self._process_seqs.pop(seq_id, None)
        if self.matcher_process is not None:
            self.matcher_process.remove(seq_ids)

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
        if self.matcher_process is not None:
            self.matcher_process.shutdown()
            self.matcher_process = None


def _done(bitmask: np.ndarray | None) -> Future[np.ndarray | None]:
    """A pending bitmask that is already filled."""
    done: Future[np.ndarray | None] = Future()
    done.set_result(bitmask)
    return done
