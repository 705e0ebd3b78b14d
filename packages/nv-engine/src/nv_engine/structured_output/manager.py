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
   `fill_bitmask_async(seqs)` the same in a worker thread (xgrammar fills without the GIL), while
   the engine does other work.
4. `accept(seqs, token_ids)` after the step's tokens are appended: advances each row's matcher and
   names the sequences to finish (the grammar terminated: stop; a token it rejects: abort).
5. `remove_request(request_id)` when a request finishes or is aborted.
A row's bitmask needs the row's previous token: with async scheduling the engine launches the
forward of step N+1 first, then accepts step N's tokens and fills step N+1's bitmask while the
device runs it, and samples step N+1 after (ModelRunner.sample). With fill_in_worker the fill runs
in a worker thread, beside the engine thread's own host work up to that sampling (the report of step
N, the schedule and inputs of step N+2), with a short GIL switch interval while it runs
(FILL_SWITCH_INTERVAL_S); off by default (see __init__). Preemption keeps a sequence's output,
and so its matcher's state.

Fills go through xgrammar.BatchGrammarMatcher: one call per step (rows in parallel threads, see
fill_threads_for), into one of two preallocated buffers (alternating, so the engine may fill step
N+1's while step N's is being sent); with pin_memory (the runner shares this process and runs on
CUDA) the buffers are page-locked, so the runner copies them to the device as they are. Accepts are
one accept_token per row. Rows without a grammar allow every token; finished rows too (their token is
dropped).
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
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
# Threads of one batched bitmask fill: one per ROWS_PER_FILL_THREAD rows, at most half the cores this
# process may run on and MAX_FILL_THREADS (fill_threads_for; on 2 cores every fill stays on one thread).
# A fill on more than one thread starts its threads at each call, while a JSON-schema row over a
# 49k-token vocabulary fills in 2-12 us: inside an engine step 4 threads filled ~54 rows in 0.50-0.58 ms
# against 0.31-0.35 ms on one (16 cores), so threads pay only for large batches.
ROWS_PER_FILL_THREAD = 128
MAX_FILL_THREADS = 8
# The GIL switch interval (seconds) while a worker fills, at most. A thread waiting for the GIL gets it
# when the holder blocks, or else only after the switch interval (5 ms by default): a worker starting
# its fill, or returning from xgrammar's fill (which runs without the GIL), beside an engine thread
# that runs Python waited up to 5 ms each time. Measured on a 2-core CPU, 64 JSON-schema rows: a 1.5 ms
# fill took 7.3 ms beside a thread running Python at the default, 1.1 ms at 0.1 ms (that thread kept
# 92% of its speed).
FILL_SWITCH_INTERVAL_S = 1e-4


def fill_threads_for(num_rows: int, num_cores: int) -> int:
    """Threads of a batched fill of num_rows rows on a process that may run on num_cores cores."""
    limit = max(1, min(MAX_FILL_THREADS, num_cores // 2))
    return max(1, min(limit, -(-num_rows // ROWS_PER_FILL_THREAD)))


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class ReleasedRequests:
    ready: list[EngineSequence] = field(default_factory=list)               # add to the scheduler
    failed: list[tuple[EngineSequence, str]] = field(default_factory=list)  # finish: (first seq, error)


class StructuredOutputManager:
    """Grammars and matchers of one engine. vocab_size: the model's (logits width); eos_token_ids end
    a completed grammar; pin_memory: bitmask buffers in page-locked memory (only where the runner that
    reads them shares this process and runs on CUDA: it then copies them to the device directly)."""

    def __init__(self, load_tokenizer: Callable[[], HFTokenizer | None], vocab_size: int,
                 eos_token_ids: Sequence[int], pin_memory: bool = False) -> None:
        self._load_tokenizer = load_tokenizer      # called once, at the first grammar (an engine core has no
        self.tokenizer: HFTokenizer | None = None  # tokenizer of its own until then)
        self.vocab_size = vocab_size
        self.bitmask_width = (vocab_size + 31) // 32
        self._eos_token_ids = list(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._held: dict[str, tuple[Future[xgrammar.CompiledGrammar], EngineSequence]] = {}
        self._grammars: dict[str, xgrammar.CompiledGrammar] = {}   # request id -> its compiled grammar
        self._matchers: dict[int, xgrammar.GrammarMatcher] = {}    # seq id -> its matcher
        # seq ids whose matcher took a stop token: terminated (xgrammar ends a grammar only so), kept
        # here so a step asks xgrammar nothing per row
        self._terminated: set[int] = set()
        self._stop_token_ids = frozenset(self._eos_token_ids)
        self._batch_matchers: dict[int, xgrammar.BatchGrammarMatcher] = {}   # by threads
        self.fill_threads: int | None = None     # threads of every batched fill (None: by the rows, _batch_matcher)
        self._num_cores = usable_cores()
        self.pin_memory = pin_memory
        self._bitmasks: list[np.ndarray] = []      # two [rows, W] int32 buffers, used in turn
        self._next_bitmask = 0
        self._fill_pool: ThreadPoolExecutor | None = None   # fill_bitmask_async's one worker
        # True: fill_bitmask_async fills in a worker thread (xgrammar fills without the GIL), so the
        # engine's host work up to the step's sampling (the report, the frontend, the next step's
        # schedule and inputs) overlaps the fill. False (the default): in the caller's thread, after the
        # forward was launched, so only the device's forward overlaps it. On the H200 host (16 cores,
        # SmolLM2, 64 JSON-schema streams, 5 rounds alternating with plain runs) the worker's median
        # grammar / plain was 0.722 against 0.758 inline: the worker's fill ended ~0.36 ms after the
        # engine thread's ~1.1 ms of other work, about twice its inline time.
        self.fill_in_worker = False

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
        32 * w + j; rows without a grammar, or finished, allow every token); None when no row has a
        grammar. The array is one of two reused buffers: valid until the next fill but one."""
        job = self._fill_job(seqs)
        return None if job is None else self._fill(*job)

    def fill_bitmask_async(self, seqs: Sequence[EngineSequence]) -> Future[np.ndarray | None]:
        """fill_bitmask in a worker thread when fill_in_worker (the matchers must not advance until
        it is done), else now. Until the worker's fill returns, the GIL switch interval is at most
        FILL_SWITCH_INTERVAL_S, so the worker takes the GIL from this thread within that time (at its
        start and at the fill's end) while this thread goes on with Python work."""
        job = self._fill_job(seqs)
        if job is None or not self.fill_in_worker:
            done: Future[np.ndarray | None] = Future()
            done.set_result(None if job is None else self._fill(*job))
            return done
        if self._fill_pool is None:
            self._fill_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nv-grammar-fill")
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, FILL_SWITCH_INTERVAL_S))
        try:
            return self._fill_pool.submit(self._fill_then_restore, interval, *job)
        except BaseException:
            sys.setswitchinterval(interval)
            raise

    def _fill_job(self, seqs: Sequence[EngineSequence]) -> tuple[
            xgrammar.BatchGrammarMatcher, np.ndarray, list[xgrammar.GrammarMatcher], list[int] | None] | None:
        """(the batch filler, the step's bitmask buffer, the matchers to fill, their rows: None for the
        first len(matchers) rows); the buffer's other rows allow every token (xgrammar writes a filled row
        whole). None when no row has a grammar."""
        if not self._grammars:
            return None
        matchers, rows = [], []
        get_matcher, terminated = self._matchers.get, self._terminated
        for row, seq in enumerate(seqs):
            matcher = get_matcher(seq.seq_id)
            if matcher is None:
                matcher = self._new_matcher(seq)
            if matcher is not None and not seq.is_finished and seq.seq_id not in terminated:
                matchers.append(matcher)
                rows.append(row)
        if not matchers:
            return None
        bitmask = self._bitmask_buffer(len(seqs))
        if len(rows) < len(seqs):
            bitmask[...] = -1
        # rows 0..k-1 (every row has a grammar, the usual case): no index list, which xgrammar converts
        # element by element (about as costly as the fill of 64 rows)
        return self._batch_matcher(len(rows)), bitmask, matchers, None if rows[-1] == len(rows) - 1 else rows

    @staticmethod
    def _fill(filler: xgrammar.BatchGrammarMatcher, bitmask: np.ndarray, matchers: list[xgrammar.GrammarMatcher],
              rows: list[int] | None) -> np.ndarray:
        """Fill the matchers' rows of `bitmask` ([S, W])."""
        filler.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        return bitmask

    def _fill_then_restore(self, interval: float, filler: xgrammar.BatchGrammarMatcher, bitmask: np.ndarray,
                           matchers: list[xgrammar.GrammarMatcher], rows: list[int] | None) -> np.ndarray:
        """The worker's fill; then (holding the GIL again) the switch interval goes back to `interval`."""
        try:
            return self._fill(filler, bitmask, matchers, rows)
        finally:
            sys.setswitchinterval(interval)

    def _bitmask_buffer(self, num_rows: int) -> np.ndarray:
        if not self._bitmasks or self._bitmasks[0].shape[0] < num_rows:
            self._bitmasks = [self._new_bitmask(num_rows) for _ in range(2)]
        self._next_bitmask = 1 - self._next_bitmask
        return self._bitmasks[self._next_bitmask][:num_rows]

    def _new_bitmask(self, num_rows: int) -> np.ndarray:
        """[num_rows, W] int32, page-locked with pin_memory."""
        if not self.pin_memory:
            return np.empty((num_rows, self.bitmask_width), dtype=np.int32)
        # only an engine whose runner shares its process on CUDA pins (torch is loaded there)
        import torch

        return torch.empty((num_rows, self.bitmask_width), dtype=torch.int32, pin_memory=True).numpy()

    def _batch_matcher(self, num_rows: int) -> xgrammar.BatchGrammarMatcher:
        """The batched filler of num_rows rows: fill_threads threads, else fill_threads_for the rows."""
        threads = self.fill_threads or fill_threads_for(num_rows, self._num_cores)
        matcher = self._batch_matchers.get(threads)
        if matcher is None:
            matcher = self._batch_matchers[threads] = import_xgrammar().BatchGrammarMatcher(max_threads=threads)
        return matcher

    def _new_matcher(self, seq: EngineSequence) -> xgrammar.GrammarMatcher | None:
        """A matcher for a sequence of a request with a grammar (None without one)."""
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
        get_matcher, terminated, stop_token_ids = self._matchers.get, self._terminated, self._stop_token_ids
        # One accept_token call per row: cheaper than BatchGrammarMatcher.batch_accept_token, whose lists
        # of handles and per-element reads of the result cost more than the (sequential) accepts.
        for seq, token_id in zip(seqs, token_ids, strict=True):
            seq_id = seq.seq_id
            matcher = get_matcher(seq_id)
            if matcher is None or seq_id in terminated:
                continue
            if not matcher.accept_token(token_id):
                logger.warning("request %s: sampled token %d is outside its grammar; finishing it",
                               seq.request_id, token_id)
                if not seq.is_finished:
                    to_finish.append((seq, FinishReason.ABORT))
            elif token_id in stop_token_ids:   # accepted a stop token: the grammar ended
                terminated.add(seq_id)
                if not seq.is_finished:
                    to_finish.append((seq, FinishReason.STOP))
        return to_finish

    # ---- 5. end of a request -----------------------------------------------------------------
    def remove_request(self, request_id: str, seq_ids: Sequence[int]) -> None:
        """Forget a finished or aborted request (a held one is dropped; its compile stays cached)."""
        self._held.pop(request_id, None)
        self._grammars.pop(request_id, None)
        for seq_id in seq_ids:
            self._matchers.pop(seq_id, None)
            self._terminated.discard(seq_id)

    def shutdown(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
        if self._fill_pool is not None:
            self._fill_pool.shutdown(wait=True, cancel_futures=True)
            self._fill_pool = None

