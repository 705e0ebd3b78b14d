"""Test helpers (also used by the demo): a deterministic fake model and an invariant checker."""
from __future__ import annotations

from array import array
from collections import Counter

import xxhash

from nv_kvcache.scheduler import Scheduler
from nv_kvcache.scheduler_output import SchedulerOutput
from nv_kvcache.sequence import FinishReason, Sequence, SequenceStatus, StopRules


def _require(condition: bool, detail: object) -> None:
    """An explicit check (not `assert`: these checks must also run under python -O)."""
    if not condition:
        raise AssertionError(detail)


class FakeModel:
    """next token = f(all previous tokens): the same history always gives the same token, so a
    preempted and recomputed sequence must end with exactly the tokens of an undisturbed run."""

    def __init__(self, vocab_size: int = 1000, seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.seed = seed

    def next_token(self, token_ids: list[int]) -> int:
        return xxhash.xxh64_intdigest(array("q", token_ids).tobytes(), seed=self.seed) % self.vocab_size

    def step(self, out: SchedulerOutput) -> list[int]:
        """Sampled ids aligned with out.sampling."""
        return [self.next_token(entry.seq.token_ids) for entry in out.scheduled if entry.samples]


def check_scheduled(scheduler: Scheduler, out: SchedulerOutput) -> None:
    """Raise AssertionError when a step's entries do not fit their sequences, blocks or budget."""
    bs = scheduler.block_size
    seen = set()
    for entry in out.scheduled:
        seq = entry.seq
        _require(seq.seq_id not in seen, f"sequence {seq.seq_id} scheduled twice")
        seen.add(seq.seq_id)
        _require(seq.status is SequenceStatus.RUNNING, seq)
        _require(entry.num_new_tokens >= 1, entry)
        end = seq.num_computed_tokens + entry.num_new_tokens
        _require(end <= seq.num_tokens, f"entry past the sequence: {entry}")
        _require(end <= len(seq.block_table) * bs, f"entry past its blocks: {entry}")
        _require(entry.samples == (end == seq.num_tokens), entry)
    _require(out.num_batched_tokens == sum(e.num_new_tokens for e in out.scheduled),
             f"num_batched_tokens {out.num_batched_tokens} is not the sum of the entries")
    _require(out.num_batched_tokens <= scheduler.max_num_batched_tokens,
             f"{out.num_batched_tokens} tokens over the budget {scheduler.max_num_batched_tokens}")
    for seq in out.preempted:
        _require(seq.seq_id not in seen and seq.status is SequenceStatus.WAITING, seq)


def run_to_completion(scheduler: Scheduler, model: FakeModel, max_steps: int = 100_000,
                      check: bool = False) -> list[Sequence]:
    """Step until nothing is unfinished; returns finished sequences in finishing order."""
    finished: list[Sequence] = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return finished
        out = scheduler.schedule()
        if check:
            check_scheduled(scheduler, out)
        finished += scheduler.postprocess(out, model.step(out))
        if check:
            check_invariants(scheduler)
    raise AssertionError(f"not finished after {max_steps} steps")


def reference_output(prompt: list[int], model: FakeModel, rules: StopRules,
                     max_model_len: int = 1 << 62) -> tuple[list[int], FinishReason]:
    """What an undisturbed run produces for one prompt: (output ids, finish reason)."""
    tokens = list(prompt)
    out: list[int] = []
    while True:
        token_id = model.next_token(tokens)
        tokens.append(token_id)
        out.append(token_id)
        if token_id in rules.stopping_ids and len(out) >= rules.min_tokens:
            return out, FinishReason.STOP
        if len(out) >= rules.max_tokens or len(tokens) >= max_model_len:
            return out, FinishReason.LENGTH


def check_invariants(scheduler: Scheduler) -> None:
    """Raise AssertionError when the scheduler / block manager state is inconsistent."""
    bm = scheduler.block_manager
    running, waiting = scheduler.running, list(scheduler.waiting)
    free = bm.free_block_ids()
    _require(len(free) == len(set(free)), "a block is twice in the free queue")
    holders: Counter[int] = Counter()
    bs = bm.block_size
    for seq in running:
        _require(seq.status is SequenceStatus.RUNNING, seq)
        for i, block_id in enumerate(seq.block_table):   # only full, computed blocks carry a hash
            if bm.block_hash(block_id) is not None:
                _require((i + 1) * bs <= seq.num_computed_tokens, f"block {i} hashed too early: {seq}")
                _require(bm._tokens[block_id] == seq.token_ids[i * bs:(i + 1) * bs], seq)
        _require(len(set(seq.block_table)) == len(seq.block_table), f"block twice in one table: {seq}")
        _require(len(seq.block_table) * bm.block_size >= seq.num_computed_tokens, seq)
        _require(seq.num_computed_tokens < seq.num_tokens or seq.num_tokens == 0, seq)
        holders.update(seq.block_table)
    for seq in waiting:
        _require(seq.status is SequenceStatus.WAITING, seq)
        _require(not seq.block_table and seq.num_computed_tokens == 0, seq)
    for seq in running + waiting:
        _require(seq.token_ids == seq.prompt_token_ids + seq.output_token_ids, seq)
    ids = [s.seq_id for s in running + waiting]
    _require(len(ids) == len(set(ids)), "a sequence is queued twice")
    _require(set(ids) == set(scheduler._seqs), "queues and the id table disagree")
    _require(len(running) <= scheduler.max_num_seqs, f"{len(running)} running > max_num_seqs")
    for block_id in range(bm.num_blocks):
        _require(bm.ref_count(block_id) == holders[block_id],
                 f"block {block_id}: ref count {bm.ref_count(block_id)}, held by {holders[block_id]}")
    free_set = set(free)
    _require(free_set == {b for b in range(bm.num_blocks) if bm.ref_count(b) == 0},
             "the free queue is not exactly the blocks with ref count 0")
    _require(bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks, "free + used != num_blocks")
    _require(bm.num_used_blocks == len(holders), "used blocks != blocks held by sequences")
    for block_hash, block_id in bm._hash_to_block.items():
        _require(bm.block_hash(block_id) == block_hash, f"hash table points at the wrong block {block_id}")
