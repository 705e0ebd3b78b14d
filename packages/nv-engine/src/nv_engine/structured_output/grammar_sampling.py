"""GrammarSampling: the engine core's structured-output work inside a step, around a
StructuredOutputManager: which bitmask a step samples with, when it is filled, and the sequences a
grammar ends.

A synchronous step gets its bitmask before it is launched (`bitmask_now`). With async scheduling a
step with grammar rows is launched with defer_sampling (the forward only) and waits here; after
the previous step's ids were accepted (`finish_by_grammar`), `start_fill` fills its bitmask (in the
engine's thread, or in the matcher process with StructuredOutputManager.use_matcher_process) while the
device runs the forward and the core does the host work that needs no bitmask (it reports the previous
step and builds the next one's inputs); `sample` then hands the bitmask to the executor
(ModelRunner.sample on every rank). At most one launched step waits: the core samples step N before
it launches step N+1, whose input ids are step N's sampled ids.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nv_engine.structured_output.manager import PendingBitmask, StructuredOutputManager
from nv_kvcache import Scheduler

if TYPE_CHECKING:
    from nv_engine.core.engine_sequence import EngineSequence
    from nv_engine.executor import Executor

logger = logging.getLogger(__name__)


class GrammarSampling:
    def __init__(self, manager: StructuredOutputManager) -> None:
        self.manager = manager
        self._waiting: list[EngineSequence] | None = None   # sampling rows of the step launched unsampled
        self._bitmask: PendingBitmask | None = None   # its bitmask (filled, or filling in the matcher process)

    @property
    def active(self) -> bool:
        """Some request's grammar is compiled: steps need bitmasks."""
        return self.manager.active

    @property
    def waiting(self) -> bool:
        """A step was launched with defer_sampling and is not sampled yet."""
        return self._waiting is not None

    def bitmask_now(self, seqs: Sequence[EngineSequence]) -> np.ndarray | None:
        """The bitmask of a step about to run synchronously (every earlier token accepted)."""
        return self.manager.fill_bitmask(seqs)

    def launched_unsampled(self, seqs: Sequence[EngineSequence]) -> None:
        """A step with these sampling rows is launched with defer_sampling (called just before)."""
        if self._waiting is not None:
            raise RuntimeError("a step launched with defer_sampling was not sampled before the next launch")
        self._waiting, self._bitmask = list(seqs), None

    def start_fill(self) -> None:
        """Fill the waiting step's bitmask (now, or in the matcher process): call once every token of the
        steps before it was accepted (the matchers must not move until `sample`)."""
        if self._waiting is not None and self._bitmask is None:
            self._bitmask = self.manager.fill_bitmask_async(self._waiting)

    def sample(self, executor: Executor) -> None:
        """Sample the waiting step, if any, with its bitmask (the matcher process's, or filled now). Raises
        what the fill raised; the step then still waits (see `drop`)."""
        seqs = self._waiting
        if seqs is None:
            return
        bitmask = self._bitmask.result() if self._bitmask is not None else self.manager.fill_bitmask(seqs)
        self._waiting = self._bitmask = None
        executor.sample(bitmask)

    def drop(self, executor: Executor | None) -> None:
        """After a failed step: let a running fill end and sample the waiting step without a mask,
        so the runner's launched steps can all be collected (and dropped). Never raises (a broken
        runner reports itself at its next call)."""
        pending, self._bitmask, waiting, self._waiting = self._bitmask, None, self._waiting, None
        if pending is not None:
            try:
                pending.result()
            except Exception:
                logger.debug("a failed step's bitmask fill", exc_info=True)
        if waiting is not None and executor is not None:
            try:
                executor.sample(None)
            except Exception:
                logger.exception("dropping a step launched with defer_sampling")

    def admit(self, scheduler: Scheduler, wait: bool
              ) -> tuple[list[EngineSequence], list[tuple[EngineSequence, str]]]:
        """Add the held requests whose grammar compiled to the scheduler: (the first sequences
        added, (first sequence, error) of those to finish: compile failed or the scheduler refused).
        wait: block briefly for a compile (the scheduler has nothing to run)."""
        released = self.manager.release(wait=wait)
        added, failed = [], list(released.failed)
        for seq in released.ready:
            try:
                scheduler.add(seq)
            except ValueError as exc:
                failed.append((seq, str(exc)))
                continue
            added.append(seq)
        for seq, message in failed:
            logger.warning("request %s finishes (abort): %s", seq.request_id, message)
        return added, failed

    def finish_by_grammar(self, scheduler: Scheduler, seqs: Sequence[EngineSequence],
                          token_ids: Sequence[int]) -> list[EngineSequence]:
        """Advance the step's rows' matchers by their sampled ids and finish, in the scheduler, the
        sequences whose grammar ended (STOP) or rejected the token (ABORT); those it finished now
        (blocks freed)."""
        if not self.manager.active:
            return []
        return [seq for seq, reason in self.manager.accept(seqs, token_ids)
                if scheduler.finish(seq.seq_id, reason) is not None]
