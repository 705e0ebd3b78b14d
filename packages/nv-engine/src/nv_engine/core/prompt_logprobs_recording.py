"""record_prompt_logprobs: a step's prompt logprobs (the runner's rows) onto the sequences that asked."""
from __future__ import annotations

from nv_engine.core.engine_sequence import EngineSequence
from nv_engine.core.step import PromptLogprobsBatch, StepResult
from nv_engine.engine.outputs import Logprob, SampleLogprobs
from nv_kvcache import SchedulerOutput


def record_prompt_logprobs(out: SchedulerOutput, batch: PromptLogprobsBatch, result: StepResult) -> None:
    """Append the step's prompt logprobs to their sequences (a recomputed chunk, after a
    preemption, replaces what it had before)."""
    found = result.prompt_logprobs
    if found is None:
        raise RuntimeError("the runner returned no prompt logprobs for a step that asked for them")
    by_id = {entry.seq.seq_id: entry.seq for entry in out.scheduled}
    row = 0
    for seq_id, count, first in zip(batch.seq_ids, batch.counts, batch.first_positions, strict=True):
        seq: EngineSequence = by_id[seq_id]   # type: ignore[assignment]  # the engine adds only these
        width = seq.params.prompt_logprobs
        entries: list[SampleLogprobs] = []
        for p in range(row, row + count):
            entry = {seq.prompt_token_ids[first + p - row]: Logprob(found.logprobs[p], found.ranks[p])}
            top = zip(found.topk_ids[p][:width], found.topk_logprobs[p][:width], strict=True)
            for rank, (token_id, logprob) in enumerate(top, start=1):
                entry.setdefault(token_id, Logprob(logprob, rank))
            entries.append(entry)
        row += count
        if seq.prompt_logprobs is not None:
            del seq.prompt_logprobs[first - 1:]
            seq.prompt_logprobs.extend(entries)
