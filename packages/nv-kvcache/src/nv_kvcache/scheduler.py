"""Continuous batching: waiting/running queues, token budget, chunked prefill, recompute preemption.

One step (vLLM v1's policy):
1. running decodes (one token each), oldest first;
2. the next prefill chunks of running, partially prefilled sequences;
3. new waiting sequences (FCFS, prefix-cache hits first) fill what is left of the token budget.
When a running sequence needs a block and none is free, the newest running sequence is preempted
(blocks freed, num_computed_tokens = 0, back to the FRONT of waiting), possibly itself. A step that
preempted admits nobody new. A preempted sequence later recomputes prompt + outputs and goes on.
With long_prefill_token_threshold > 0 (vLLM's knob) no prompt gets more than that many tokens a step: a long prompt
arriving mid-stream is spread over short steps; running decodes are in every step either way (scheduled first).

Speculative decoding (a `propose` callable; vLLM v1's scheme): in a step with at most spec_max_batch_size running
sequences, each decode also computes the draft tokens `propose(token_ids, most)` returns (seq.spec_token_ids),
budgeted and given blocks like any token; `draft_length(seq)`, where given, caps each sequence's drafts in the step
(a per-request draft-length policy; 0: none). postprocess_runs appends each emitted run (accepted drafts plus one
token), advancing num_computed_tokens by 1 + accepted (rejected drafts' slots get overwritten); preemption drops drafts.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

from nv_kvcache.block_manager import BlockManager
from nv_kvcache.draft_proposals import DraftProposals
from nv_kvcache.kv_cache_events import KVCacheEvent
from nv_kvcache.scheduler_output import ScheduledSeq, SchedulerOutput
from nv_kvcache.scheduler_stats import SchedulerStats
from nv_kvcache.sequence import FinishReason, Sequence, SequenceStatus

_RUNNING = SequenceStatus.RUNNING
_WAITING = SequenceStatus.WAITING
_FINISHED = SequenceStatus.FINISHED


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class Scheduler:
    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 enable_prefix_caching: bool = True, enable_kv_cache_events: bool = False,
                 long_prefill_token_threshold: int = 0,
                 propose: Callable[[list[int], int], list[int]] | None = None, spec_max_batch_size: int = 0,
                 draft_length: Callable[[Sequence], int] | None = None) -> None:
        if isinstance(long_prefill_token_threshold, bool) or not isinstance(long_prefill_token_threshold, int) \
                or long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be an integer >= 0 (0: no limit), got "
                             f"{long_prefill_token_threshold!r}")
        # the most tokens one prompt gets in one step; the step's whole budget when 0
        self.prefill_chunk_limit = long_prefill_token_threshold or max_num_batched_tokens
        self.max_num_seqs = _positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive_int("max_num_batched_tokens", max_num_batched_tokens)
        self.max_model_len = _positive_int("max_model_len", max_model_len)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching, enable_kv_cache_events)
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []        # admission order: the last one is the newest
        self._seqs: dict[int, Sequence] = {}     # every unfinished sequence by id
        self._pending: SchedulerOutput | None = None   # scheduled, not yet postprocessed
        self.num_preemptions = 0                 # cumulative, for stats()
        self.num_steps = 0
        self.drafts = DraftProposals(propose, spec_max_batch_size, draft_length)   # speculative decoding

    # ---- queries -----------------------------------------------------------------------------
    @property
    def spec_max_batch_size(self) -> int:
        """Drafts only in steps with at most this many running sequences (0: none)."""
        return self.drafts.max_batch_size

    @spec_max_batch_size.setter
    def spec_max_batch_size(self, value: int) -> None:
        self.drafts.max_batch_size = value

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def get(self, seq_id: int) -> Sequence | None:
        return self._seqs.get(seq_id)

    def stats(self) -> SchedulerStats:
        """Queue lengths, KV usage and the cumulative prefix-cache and preemption counters (O(1))."""
        bm = self.block_manager
        return SchedulerStats(len(self.running), len(self.waiting), bm.usage, bm.num_query_tokens,
                              bm.num_hit_tokens, self.num_preemptions, self.drafts.num_draft_tokens,
                              self.drafts.num_accepted_tokens)

    def take_kv_events(self) -> list[KVCacheEvent]:
        """The block manager's prefix-cache events since the last call (recorded only when the
        scheduler was made with enable_kv_cache_events=True)."""
        return self.block_manager.take_events()

    # ---- requests in and out -----------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; ValueError (nothing changed) when it can never run."""
        if not isinstance(seq, Sequence):
            raise TypeError(f"add() takes a Sequence, got {type(seq).__name__}")
        if seq.seq_id in self._seqs:
            raise ValueError(f"a sequence with seq_id {seq.seq_id} is already scheduled")
        if seq.status is not _WAITING or seq.output_token_ids or seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id} is not fresh (status {seq.status.name}); add a new one")
        num_prompt = len(seq.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError(f"sequence {seq.seq_id}: the prompt is empty")
        if num_prompt > self.max_model_len:
            raise ValueError(f"sequence {seq.seq_id}: the prompt has {num_prompt} tokens, longer than "
                             f"max_model_len={self.max_model_len}")
        bm = self.block_manager
        most_tokens = min(num_prompt + seq.rules.max_tokens, self.max_model_len)
        if bm.cdiv_blocks(most_tokens) > bm.num_blocks:
            raise ValueError(
                f"sequence {seq.seq_id}: {most_tokens} tokens (prompt {num_prompt} + max_tokens "
                f"{seq.rules.max_tokens}, capped at max_model_len) need {bm.cdiv_blocks(most_tokens)} "
                f"blocks of {bm.block_size}, more than the whole cache ({bm.num_blocks} blocks)")
        seq._length_limit = min(num_prompt + seq.rules.max_tokens, self.max_model_len)
        self._seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def finish(self, seq_id: int, reason: FinishReason = FinishReason.STOP) -> Sequence | None:
        """Finish a sequence now (waiting, running, mid-prefill); frees its blocks. None if unknown."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return None
        if seq.status is _RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        else:
            self.waiting.remove(seq)
        seq.status = _FINISHED
        seq.finish_reason = FinishReason(reason)
        return seq

    def abort(self, seq_id: int) -> Sequence | None:
        return self.finish(seq_id, FinishReason.ABORT)

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Pick this step's sequences and token counts; allocates their blocks."""
        if self._pending is not None:
            raise RuntimeError("schedule() called twice: postprocess() the previous step first")
        budget = self.max_num_batched_tokens
        bs = self.block_size
        bm = self.block_manager
        running = self.running
        decodes: list[ScheduledSeq] = []
        chunks: list[ScheduledSeq] = []
        preempted: list[Sequence] = []
        partial: list[Sequence] = []     # running sequences still prefilling

        # 1. decodes, oldest first (with draft tokens when speculating this step)
        drafting = self.drafts.drafting(len(running))
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            i += 1
            computed = seq.num_computed_tokens
            if len(seq.token_ids) - computed != 1:
                partial.append(seq)
                continue
            num_new = 1 + self.drafts.draft(seq, budget) if drafting else 1
            if computed + num_new > len(seq.block_table) * bs:
                reclaimed = self._grow(seq, computed + num_new, decodes, chunks, preempted)
                if reclaimed < 0:
                    break      # seq preempted itself: it was the newest, nothing is left after it
                budget += reclaimed
            if num_new > 1:
                entry = ScheduledSeq(seq, num_new, True)
            else:
                entry = seq._decode_entry
                if entry is None:
                    # sequence.py cannot name ScheduledSeq (scheduler_output imports it): its slot is typed None
                    entry = seq._decode_entry = ScheduledSeq(seq, 1, True)  # pyright: ignore[reportAttributeAccessIssue]
            decodes.append(entry)
            budget -= num_new

        # 2. prefill chunks of running, partially prefilled sequences
        for seq in partial:
            if budget <= 0:
                break
            if seq.status is not _RUNNING:      # preempted above
                continue
            computed = seq.num_computed_tokens
            n = min(len(seq.token_ids) - computed, budget, self.prefill_chunk_limit)
            if computed + n > len(seq.block_table) * bs:
                reclaimed = self._grow(seq, computed + n, decodes, chunks, preempted)
                if reclaimed < 0:
                    continue
                budget += reclaimed
            chunks.append(ScheduledSeq(seq, n, computed + n == len(seq.token_ids)))
            budget -= n

        # 3. new sequences, unless this step had to preempt
        if not preempted:
            waiting = self.waiting
            while waiting and budget > 0 and len(running) < self.max_num_seqs:
                seq = waiting[0]
                hits = [] if seq.skip_prefix_cache else bm.match_prefix(seq)
                cached = len(hits) * bs
                n = min(len(seq.token_ids) - cached, budget, self.prefill_chunk_limit)
                if not bm.allocate(seq, cached + n, hits):
                    break                      # FCFS: nobody overtakes the head of the queue
                waiting.popleft()
                seq.status = _RUNNING
                seq.num_computed_tokens = cached
                seq.num_cached_tokens = cached
                running.append(seq)
                chunks.append(ScheduledSeq(seq, n, cached + n == len(seq.token_ids)))
                budget -= n

        decodes.extend(chunks)
        drafted = sum([len(entry.seq.spec_token_ids) for entry in decodes]) if drafting else 0
        out = SchedulerOutput(decodes, preempted, self.max_num_batched_tokens - budget, drafted)
        if decodes:
            self._pending = out
            self.num_steps += 1
        return out

    def _grow(self, seq: Sequence, num_tokens: int, decodes: list[ScheduledSeq],
              chunks: list[ScheduledSeq], preempted: list[Sequence]) -> int:
        """Give seq blocks for num_tokens tokens, preempting the newest running sequences until
        they fit. Returns the budget the victims gave back, or -1 when seq itself was preempted."""
        bm = self.block_manager
        reclaimed = 0
        while not bm.allocate(seq, num_tokens):
            victim = self.running.pop()
            reclaimed += self._preempt(victim, decodes, chunks)
            preempted.append(victim)
            if victim is seq:
                return -1
        return reclaimed

    def _preempt(self, seq: Sequence, decodes: list[ScheduledSeq], chunks: list[ScheduledSeq]) -> int:
        """Send a running seq back to the front of waiting; returns the tokens it had been given in
        this step (a victim newer than the sequence that needs blocks may be scheduled already)."""
        reclaimed = 0
        for entries in (decodes, chunks):
            for j in range(len(entries) - 1, -1, -1):
                if entries[j].seq is seq:
                    reclaimed = entries[j].num_new_tokens
                    del entries[j]
                    break
        self.block_manager.free(seq)
        seq.spec_token_ids = []
        seq.status = _WAITING
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        return reclaimed

    def postprocess(self, out: SchedulerOutput, sampled_token_ids: list[int]) -> list[Sequence]:
        """Advance the step's sequences, append sampled tokens (aligned with out.sampling), apply
        stop rules and max_model_len, free finished sequences. Returns those that finished."""
        if not out.scheduled:
            if sampled_token_ids:
                raise ValueError("an empty step samples no tokens")
            return []
        if out is not self._pending:
            raise ValueError("postprocess() takes the SchedulerOutput of the latest schedule() call")
        if len(sampled_token_ids) != len(out.sampling):
            raise ValueError(f"got {len(sampled_token_ids)} sampled token ids for "
                             f"{len(out.sampling)} sampling sequences")
        self._pending = None
        bm = self.block_manager
        caching = bm.enable_prefix_caching
        bs = self.block_size
        finished: list[Sequence] = []
        # entries paired with their sampled id (None: the chunk samples nothing); a pure decode
        # step samples in every entry
        if len(sampled_token_ids) == len(out.scheduled):
            pairs = zip(out.scheduled, sampled_token_ids, strict=True)
        else:
            ids = iter(sampled_token_ids)
            pairs = ((entry, next(ids) if entry.samples else None) for entry in out.scheduled)
        for entry, token_id in pairs:
            seq = entry.seq
            if seq.status is not _RUNNING:     # finished / aborted between schedule and now
                continue
            computed = seq.num_computed_tokens = seq.num_computed_tokens + entry.num_new_tokens
            if caching and computed >= (seq._num_hashed_blocks + 1) * bs:
                bm.cache_full_blocks(seq)
            if token_id is None:
                continue
            tokens = seq.token_ids
            tokens.append(token_id)
            output = seq.output_token_ids
            output.append(token_id)
            if token_id in seq._stop_ids and seq.stopped_by_token():
                reason = FinishReason.STOP
            elif len(tokens) >= seq._length_limit:     # max_tokens outputs or max_model_len tokens
                reason = FinishReason.LENGTH
            else:
                continue
            seq.status = _FINISHED
            seq.finish_reason = reason
            bm.free(seq)
            del self._seqs[seq.seq_id]
            finished.append(seq)
        if finished:
            self.running = [s for s in self.running if s.status is _RUNNING]
        return finished

    def postprocess_runs(self, out: SchedulerOutput, runs: Seq[Seq[int]]) -> list[Sequence]:
        """postprocess for a step that may verify drafts (synchronous only: no placeholders). runs, aligned with
        out.sampling: each sequence's emitted tokens (accepted drafts, then one recovered / bonus token), cut at
        the first that stops the sequence or reaches its length limit. Returns the sequences that finished."""
        if len(runs) != len(out.sampling):
            raise ValueError(f"got {len(runs)} token runs for {len(out.sampling)} sampling sequences")
        if not out.scheduled:
            return []
        if out is not self._pending:
            raise ValueError("postprocess_runs() takes the SchedulerOutput of the latest schedule() call")
        self._pending = None
        bm = self.block_manager
        caching = bm.enable_prefix_caching
        bs = self.block_size
        finished: list[Sequence] = []
        run_of = iter(runs)
        for entry in out.scheduled:
            seq = entry.seq
            run = next(run_of) if entry.samples else None
            num_drafts = len(seq.spec_token_ids)
            seq.spec_token_ids = []
            if seq.status is not _RUNNING:     # finished / aborted between schedule and now
                continue
            if run is None:
                run = ()
            elif not 1 <= len(run) <= num_drafts + 1:
                raise ValueError(f"sequence {seq.seq_id}: a run of {len(run)} tokens after {num_drafts} drafts")
            accepted = max(len(run) - 1, 0)
            self.drafts.verified(num_drafts, accepted)
            # the tokens whose KV this step wrote validly: the chunk minus the rejected drafts
            seq.num_computed_tokens += entry.num_new_tokens - num_drafts + accepted
            reason = None
            for token_id in run:
                seq.append_token(token_id)
                reason = seq.finish_reason_after(token_id)
                if reason is not None:
                    break
            if reason is None:
                if caching and seq.num_computed_tokens >= (seq._num_hashed_blocks + 1) * bs:
                    bm.cache_full_blocks(seq)
                continue
            seq.status = _FINISHED
            seq.finish_reason = reason
            bm.free(seq)
            del self._seqs[seq.seq_id]
            finished.append(seq)
        if finished:
            self.running = [s for s in self.running if s.status is _RUNNING]
        return finished

    def resolve_placeholders(self, out: SchedulerOutput, sampled_token_ids: list[int],
                             placeholder: int) -> list[Sequence]:
        """The step was postprocessed with `placeholder` ids (so the next step could be scheduled
        before its ids came back): put the real ids in and apply the stop-id rule postprocess could
        not (max_tokens / max_model_len were applied on time). A sequence that finished or was
        aborted since keeps no placeholder and is skipped. Returns the sequences this finishes
        (blocks freed); one already finished by length now finishes with STOP instead."""
        if len(sampled_token_ids) != len(out.sampling):
            raise ValueError(f"got {len(sampled_token_ids)} sampled token ids for "
                             f"{len(out.sampling)} sampling sequences")
        finished: list[Sequence] = []
        for entry, token_id in zip(out.sampling, sampled_token_ids, strict=True):
            seq = entry.seq
            output = seq.output_token_ids
            if not output or output[-1] != placeholder:
                continue
            seq.token_ids[-1] = token_id
            output[-1] = token_id
            if token_id not in seq._stop_ids or not seq.stopped_by_token():
                continue
            if seq.status is _FINISHED:
                seq.finish_reason = FinishReason.STOP
            elif self.finish(seq.seq_id, FinishReason.STOP) is not None:
                finished.append(seq)   # it stops one step late: its next token is dropped
        return finished

    def discard_pending(self) -> None:
        """Forget the scheduled step that will never be postprocessed (its run failed). Its
        sequences keep their blocks and recompute its tokens when scheduled again; those holding
        a token that never came back must be finished by the caller."""
        self._pending = None
