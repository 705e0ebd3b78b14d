"""MatcherProcess: an engine's grammar matchers in a process of their own, so that accepting a step's
tokens and filling the next step's token bitmask run beside the engine's thread instead of on it.

Why a process: the engine's step loop is bound by its host work at small models, and a grammar step
adds the matchers' accepts and the bitmask fill to it (~0.6-0.9 ms per step of 64 JSON-schema rows on
the H200 host). A worker thread cannot take that off the engine's thread: xgrammar fills without
the GIL, but every hand-over of the GIL between the threads costs up to the interpreter's switch
interval and a thread wake-up (measured: the worker's fill ended later than the inline one). A process
shares no GIL: the engine's thread pickles the step's job into a pipe (~30 us for 64 rows) and goes
on with its own work (the report, the next step's schedule and inputs); by the time it samples, the
reply is usually there.

The child (MatcherProcessChild) is spawned at the first structured-outputs request and is `ready` once
it has imported xgrammar and mapped the shared buffer (the manager keeps the matchers of requests
released before that in its own process; `then` fills their rows into the reply's bitmask).
Per step the parent sends one job (`fill`): the grammars and matchers to create (each grammar's
serialized form once), the sampled tokens queued by `accept` since the last job, the sequences
queued by `remove`, and one sequence id per bitmask row; the reply (`MatcherReply.result()`) is the
filled [rows, W] int32 bitmask, a view into one of two halves of a shared file mapping (the file is
unlinked once both sides mapped it) that alternate by job (a half is rewritten two jobs later, after
the step that read it was collected, as with the in-process buffers). With pin_memory the mapping is
registered with CUDA as page-locked, so the runner copies it to the device as it is.

The matchers' verdicts come one job late: a token the grammar rejects (possible only where a ban
such as min_tokens left a row nothing its grammar allows) is reported with the next job's reply
(`take_rejected`), while a stop token is known at once by its id (the manager finishes such a row
itself). A child that dies fails the step that waits for it (RuntimeError); the manager then starts
a new one for the next grammar request.
"""
from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import tempfile
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from nv_engine.structured_output.matcher_process_child import Job, MatcherProcessChild

logger = logging.getLogger(__name__)

# How long `MatcherReply.result` waits for the child between checks that it is alive (seconds).
REPLY_POLL_SECONDS = 0.5
# Grammars the child keeps; beyond this, the least recently used one that no matcher uses is dropped.
MAX_CHILD_GRAMMARS = 64


def _unlink_quietly(path: str) -> None:
    """Remove a file that may be gone already (the child unlinks the shared buffer once it mapped it)."""
    try:
        os.unlink(path)
    except OSError:
        pass


class MatcherReply:
    """The bitmask of one job, once the child replied (`result`)."""

    def __init__(self, owner: MatcherProcess, job_id: int, bitmask: np.ndarray,
                 then: Callable[[np.ndarray], None] | None = None) -> None:
        self._owner = owner
        self.job_id = job_id
        self._bitmask = bitmask
        self._then = then          # fills the rows the child left to the parent, once it replied

    def result(self) -> np.ndarray:
        """The filled bitmask; waits for the child's reply. RuntimeError when the job failed there
        or the child died."""
        self._owner.wait_for(self.job_id)
        then, self._then = self._then, None
        if then is not None:
            then(self._bitmask)
        return self._bitmask


class MatcherProcess:
    """max_rows: the most bitmask rows of one step (the engine's max_num_seqs); width: ceil(V / 32)."""

    def __init__(self, max_rows: int, width: int, pin_memory: bool = False) -> None:
        self.max_rows = max_rows
        self.width = width
        self.pin_memory = pin_memory
        self._process: Any = None              # multiprocessing's SpawnProcess
        self._conn: Any = None                 # our end of the pipe (multiprocessing Connection)
        self._ready = False
        self._mapping: mmap.mmap | None = None
        self.buffer_path: str | None = None        # the shared file (unlinked once both sides mapped it)
        self._buffer_linked = False
        self._bitmasks: np.ndarray | None = None   # [2, max_rows, width] int32 over the mapping
        self._registered = False                   # the mapping is page-locked through CUDA
        self._job_id = 0
        self._answered = 0                         # the newest job whose reply was read
        self._error: str | None = None             # a failed job's message, raised by wait_for
        self._tokenizer_json: str | None = None    # sent with the first job that sends a grammar
        self._tokenizer_sent = False
        self._key_ids: dict[Hashable, int] = {}    # grammar key -> id in the child
        self._next_key_id = 0
        self._key_users: dict[Hashable, int] = {}  # grammar key -> matchers in the child using it
        self._unused_keys: OrderedDict[Hashable, None] = OrderedDict()   # keys no matcher uses, oldest first
        self._pending_grammars: list[tuple[int, str]] = []
        self._dropped_keys: list[int] = []
        self._announced: dict[int, Hashable] = {}  # seq id -> the grammar key of its matcher in the child
        self._accept_ids: list[int] = []
        self._accept_tokens: list[int] = []
        self._removed: list[int] = []
        self._rejected: list[int] = []

    # ---- lifetime ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The child has started and mapped the buffer (never blocks)."""
        if not self._ready and self._conn is not None:
            try:
                if self._conn.poll():
                    self._ready = self._conn.recv() == "ready"
            except (EOFError, OSError):   # died starting: `alive` tells
                pass
        return self._ready

    def start(self) -> None:
        """Spawn the child (returns at once; `ready` tells when it serves)."""
        if self._process is not None:
            return
        size = 2 * self.max_rows * self.width * 4
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self.buffer_path = tempfile.mkstemp(prefix="nv-grammar-bitmask-", dir=folder)
        self._buffer_linked = True
        # the child unlinks the file once it mapped it; before that, this side does when it shuts the
        # child down or is dropped without doing so
        weakref.finalize(self, _unlink_quietly, self.buffer_path)
        try:
            os.ftruncate(fd, size)
            self._mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._bitmasks = np.frombuffer(self._mapping, dtype=np.int32).reshape(2, self.max_rows, self.width)
        if self.pin_memory:
            self._register()
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=MatcherProcessChild.main, name="nv-grammar-matchers", daemon=True,
                                    args=(child_conn, self.buffer_path, self.max_rows, self.width))
        self._process.start()
        child_conn.close()

    def wait_ready(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for the child to be ready (tests, tools)."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if not self._process.is_alive() or time.monotonic() > deadline:
                return False
            self._conn.poll(0.05)
        return True

    def shutdown(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
            self._conn.close()
        if self._registered and self._bitmasks is not None:
            import torch

            cudart = torch.cuda.cudart()
            if cudart is not None:
                cudart.cudaHostUnregister(self._bitmasks.ctypes.data)
            self._registered = False
        self._bitmasks = None
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:       # a bitmask view is still held: the mapping goes with it
                pass
            self._mapping = None
        self._unlink_buffer()

    def _unlink_buffer(self) -> None:
        if self._buffer_linked and self.buffer_path is not None:
            self._buffer_linked = False
            _unlink_quietly(self.buffer_path)

    def _register(self) -> None:
        """Page-lock the mapping through CUDA (the runner then copies from it directly); left
        unpinned where that fails (the runner stages it)."""
        try:
            import torch

            if self._bitmasks is None:
                return
            cudart = torch.cuda.cudart()
            if cudart is None:
                return
            code = cudart.cudaHostRegister(self._bitmasks.ctypes.data, self._bitmasks.nbytes, 0)
            self._registered = int(code) == 0
        except Exception as exc:   # an old torch, no CUDA: the bitmask is staged instead
            logger.info("grammar bitmask buffer not page-locked: %s", exc)

    # ---- what the manager queues -------------------------------------------------------------
    def set_tokenizer_info(self, tokenizer_json: str) -> None:
        if self._tokenizer_json is None:
            self._tokenizer_json = tokenizer_json

    def has_grammar(self, key: Hashable) -> bool:
        return key in self._key_ids

    def add_grammar(self, key: Hashable, grammar_json: str) -> None:
        """A compiled grammar (serialized), sent with the next job. Beyond MAX_CHILD_GRAMMARS, the least
        recently used grammar that no matcher uses is dropped from the child (sent again if needed)."""
        if key in self._key_ids:
            return
        key_id = self._key_ids[key] = self._next_key_id
        self._next_key_id += 1
        self._key_users[key] = 0
        self._unused_keys[key] = None
        self._pending_grammars.append((key_id, grammar_json))
        while len(self._key_ids) > MAX_CHILD_GRAMMARS and len(self._unused_keys) > 1:
            oldest = next(iter(self._unused_keys))
            if oldest == key:
                break
            del self._unused_keys[oldest]
            del self._key_users[oldest]
            self._dropped_keys.append(self._key_ids.pop(oldest))

    def accept(self, seq_id: int, token_id: int) -> None:
        """Advance this sequence's matcher by `token_id` (in the next job)."""
        if seq_id in self._announced:
            self._accept_ids.append(seq_id)
            self._accept_tokens.append(token_id)

    def remove(self, seq_ids: Sequence[int]) -> None:
        for seq_id in seq_ids:
            key = self._announced.pop(seq_id, None)
            if key is None:
                continue
            self._removed.append(seq_id)
            users = self._key_users[key] = self._key_users[key] - 1
            if users == 0:
                self._unused_keys[key] = None

    def take_rejected(self) -> list[int]:
        """Sequences whose sampled token the grammar rejected, from the replies read since the last call."""
        rejected, self._rejected = self._rejected, []
        return rejected

    # ---- one step ----------------------------------------------------------------------------
    def fill(self, rows: Sequence[tuple[int, Hashable] | None],
             then: Callable[[np.ndarray], None] | None = None) -> MatcherReply:
        """Send the step's job: per bitmask row (seq id, grammar key), or None for a row that allows
        every token (or that `then`, called with the bitmask once the child replied, fills). The grammar
        of a key must have been added. The reply holds the bitmask."""
        if not self.ready or self._bitmasks is None:
            raise RuntimeError("the grammar matcher process is not ready")
        if len(rows) > self.max_rows:
            raise RuntimeError(f"a step of {len(rows)} grammar rows; the matcher process holds {self.max_rows}")
        self.wait_for(self._job_id)        # one job at a time: the previous reply is read first
        new_matchers, row_ids = [], []
        announced = self._announced
        for row in rows:
            if row is None:
                row_ids.append(-1)
                continue
            seq_id, key = row
            if seq_id not in announced:
                announced[seq_id] = key
                new_matchers.append((seq_id, self._key_ids[key]))
                self._key_users[key] += 1
                self._unused_keys.pop(key, None)
            row_ids.append(seq_id)
        tokenizer_json = None
        if self._pending_grammars and not self._tokenizer_sent:
            if self._tokenizer_json is None:
                raise RuntimeError("the tokenizer's info must be set before a grammar is sent")
            tokenizer_json, self._tokenizer_sent = self._tokenizer_json, True
        self._job_id += 1
        buffer = self._job_id % 2
        job: Job = (self._job_id, buffer, tokenizer_json, self._pending_grammars, self._dropped_keys, new_matchers,
                    self._accept_ids, self._accept_tokens, self._removed, row_ids)
        self._pending_grammars, self._dropped_keys = [], []
        self._accept_ids, self._accept_tokens, self._removed = [], [], []
        try:
            self._conn.send(job)
        except (OSError, ValueError) as exc:
            self._answered = self._job_id
            raise RuntimeError(f"the grammar matcher process is gone: {exc}") from None
        return MatcherReply(self, self._job_id, self._bitmasks[buffer, :len(rows)], then)

    def wait_for(self, job_id: int) -> None:
        """Read replies up to job `job_id`. RuntimeError when that job failed or the child died."""
        while self._answered < job_id:
            try:
                if not self._conn.poll(REPLY_POLL_SECONDS):
                    if self._process.is_alive():
                        continue
                    raise EOFError
                answered, rejected, error = self._conn.recv()
            except (EOFError, OSError):   # the pipe closed: the child is gone
                self._answered = self._job_id
                self._process.join(timeout=1)
                raise RuntimeError(f"the grammar matcher process died (exit code {self._process.exitcode})") from None
            self._answered = answered
            self._rejected.extend(rejected)
            if error is not None:
                self._error = error
        if self._error is not None and self._answered >= job_id:
            error, self._error = self._error, None
            raise RuntimeError(f"the grammar matcher process failed a step: {error}")

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return None if self._process is None else self._process.exitcode
