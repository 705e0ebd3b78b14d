"""Per-step sampling inputs: SamplingParams rows -> SamplingBatch (host, numpy, picklable) ->
SamplingTensors (device), and a StepResult's sampled ids / logprobs back to per-sequence results.

It runs every step at batch ~256, so the parts that follow the requests' parameters (temperature,
top-k/p, min-p, penalty factors, flags) are cached while the rows' SamplingParams objects are the
same as last step; only seeds and positions (one [2, S] array, one copy) are rebuilt then.
SamplingParams must not be changed after the request is added (the engine keeps a clone).
"""
from __future__ import annotations

import itertools
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from nv_engine.outputs import Logprob
from nv_engine.sampling_params import SAMPLING_EPS, SamplingParams
from nv_engine.step import SamplingBatch, SamplingFlags, StepResult

_static_ids = itertools.count(1)


class SamplingRow(NamedTuple):
    params: SamplingParams
    seed: int  # the sequence's seed (see sequence_seed)
    position: int  # output tokens so far = index of the token sampled now
    prompt_token_ids: Sequence[int] | None = None  # needed only with repetition_penalty
    output_token_ids: Sequence[int] | None = None  # needed only with any penalty


@dataclass
class _StaticPart:
    """What depends only on the rows' SamplingParams (cached across steps)."""

    static_id: int
    arrays: dict[str, np.ndarray]  # name -> [S] or [S, L] array (temperatures, ..., logit bias)
    flags: SamplingFlags  # SamplingTensors' Python-side fields
    logprob_counts: list[int | None]  # per row: SamplingParams.logprobs
    min_token_rows: list[tuple[int, int, list[int]]]  # (row, min_tokens, ids banned until then)
    bad_word_rows: list[int]  # rows with bad_words (bans follow the output)
    rep_rows: list[int]  # rows with repetition_penalty != 1 (need prompt ids)
    pen_rows: list[int]  # rows with any penalty (need output ids)


def sequence_seed(params_seed: int | None, index: int, rng: random.Random) -> int:
    """Seed of completion `index` of a request: seed + index when the request has one (as vLLM
    seeds n > 1 children), else a fresh draw from the engine's RNG."""
    if params_seed is None:
        return rng.getrandbits(63)
    return (params_seed + index + 2**63) % 2**64 - 2**63  # wrapped into int64


def _padded(lists: Sequence[Sequence[int] | None], width_rows: list[int], num_rows: int,
            pad: int) -> np.ndarray:
    """[S, L] int64 with lists[i] in the rows of width_rows, padding elsewhere."""
    width = max([len(lists[i] or ()) for i in width_rows] + [1])
    out = np.full((num_rows, width), pad, dtype=np.int64)
    for i in width_rows:
        ids = lists[i]
        if ids:
            out[i, :len(ids)] = ids
    return out


class SamplingBatchBuilder:
    """Builds each step's SamplingBatch; one per engine."""

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = [int(t) for t in eos_token_ids if 0 <= int(t) < vocab_size]
        self._last_params: list[SamplingParams] = []
        self._static: _StaticPart | None = None

    def build(self, rows: Sequence[SamplingRow | tuple]) -> SamplingBatch:
        if not rows:
            raise ValueError("a sampling batch needs at least one row")
        columns = list(zip(*rows, strict=True))
        params, seeds, positions = columns[0], columns[1], columns[2]
        static = self._static
        if (static is None or len(params) != len(self._last_params)
                or not all(map(operator.is_, params, self._last_params))):
            static = self._static = self._build_static(params)
            self._last_params = list(params)
        batch = SamplingBatch(static.static_id, static.arrays, static.flags,
                              np.array((seeds, positions), dtype=np.int64), static.logprob_counts)
        num_rows, pad = len(params), self.vocab_size
        if (static.pen_rows or static.bad_word_rows) and len(columns) < 5:
            raise ValueError("penalties and bad_words need each row's prompt and output token ids")
        if static.pen_rows:
            batch.output_token_ids = _padded(columns[4], static.pen_rows, num_rows, pad)
            if static.rep_rows:
                batch.prompt_token_ids = _padded(columns[3], static.rep_rows, num_rows, pad)
        banned: dict[int, list[int]] = {}
        for row, min_tokens, ids in static.min_token_rows:
            if positions[row] < min_tokens:
                banned[row] = list(ids)
        for row in static.bad_word_rows:
            ids = params[row].banned_by_bad_words(columns[4][row] or ())
            if ids:
                banned.setdefault(row, []).extend(ids)
        if banned:
            lists = [banned.get(row) for row in range(num_rows)]
            batch.banned_token_ids = _padded(lists, sorted(banned), num_rows, pad)
        return batch

    def _build_static(self, params: Sequence[SamplingParams]) -> _StaticPart:
        vocab = self.vocab_size
        greedy = [p.temperature < SAMPLING_EPS for p in params]
        temps = np.array([0.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], np.float32)
        top_k = np.array([0 if g or p.top_k >= vocab else max(p.top_k, 0)
                          for p, g in zip(params, greedy, strict=True)], np.int64)
        top_p = np.array([1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)], np.float32)
        min_p = np.array([0.0 if g else p.min_p for p, g in zip(params, greedy, strict=True)], np.float32)
        arrays = dict(temperatures=temps, top_k=top_k, top_p=top_p, min_p=min_p)
        for name, attr, off in (("presence_penalties", "presence_penalty", 0.0),
                                ("frequency_penalties", "frequency_penalty", 0.0),
                                ("repetition_penalties", "repetition_penalty", 1.0)):
            values = np.array([getattr(p, attr) for p in params], np.float32)
            if (values != off).any():
                arrays[name] = values
        allowed = [p.allowed_token_ids for p in params]
        allowed_rows = [i for i, ids in enumerate(allowed) if ids]
        if allowed_rows:
            arrays["allowed_token_ids"] = _padded(allowed, allowed_rows, len(params), vocab)
        bias_rows = [i for i, p in enumerate(params) if p.logit_bias]
        if bias_rows:
            bias_ids = [list(p.logit_bias) if p.logit_bias else None for p in params]
            arrays["logit_bias_ids"] = _padded(bias_ids, bias_rows, len(params), vocab)
            values = np.zeros(arrays["logit_bias_ids"].shape, np.float32)
            for i in bias_rows:
                bias = params[i].logit_bias or {}
                values[i, :len(bias)] = list(bias.values())
            arrays["logit_bias_values"] = values
        counts = [p.logprobs for p in params]
        all_greedy = all(greedy)
        flags = SamplingFlags(
            num_logprobs=max((c or 0 for c in counts), default=0),
            need_logprobs=any(c is not None for c in counts),
            all_greedy=all_greedy, any_greedy=any(greedy),
            any_top_k=bool((top_k > 0).any()), any_top_p=bool((top_p < 1.0).any()),
            any_min_p=bool((min_p > 0.0).any()),
            max_top_k=int(top_k.max()) if (top_k > 0).any() else None)
        min_rows = []
        for row, p in enumerate(params):
            if p.min_tokens > 0:
                ids = set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(self.eos_token_ids))
                ids = sorted(i for i in ids if i < vocab)
                if ids:
                    min_rows.append((row, p.min_tokens, ids))
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        pen_rows = [i for i, p in enumerate(params) if p.has_penalties]
        bad_word_rows = [i for i, p in enumerate(params) if p.bad_words_token_ids]
        return _StaticPart(next(_static_ids), arrays, flags, counts, min_rows, bad_word_rows, rep_rows,
                           pen_rows)


class SampleResult(NamedTuple):
    token_id: int
    logprob: float | None  # chosen token's logprob (None unless the request asked for logprobs)
    logprobs: dict[int, Logprob] | None  # chosen token + top `logprobs` tokens


def unpack_results(result: StepResult, logprob_counts: Sequence[int | None]) -> list[SampleResult]:
    """A step's host results -> one SampleResult per row, with logprob dicts for the rows whose
    request asked for them (`logprob_counts[i]` = that request's SamplingParams.logprobs)."""
    token_ids = result.token_ids
    if len(token_ids) != len(logprob_counts):
        raise ValueError(f"{len(token_ids)} sampled ids for {len(logprob_counts)} rows")
    out = []
    for i, (token_id, count) in enumerate(zip(token_ids, logprob_counts, strict=True)):
        if count is None or result.logprobs is None or result.ranks is None:
            out.append(SampleResult(token_id, None, None))
            continue
        chosen = float(result.logprobs[i])
        entries = {token_id: Logprob(chosen, int(result.ranks[i]))}
        if count > 0 and result.topk_ids is not None and result.topk_logprobs is not None:
            for rank, (tok, lp) in enumerate(zip(result.topk_ids[i][:count],
                                                 result.topk_logprobs[i][:count], strict=True), start=1):
                entries.setdefault(tok, Logprob(float(lp), rank))
        out.append(SampleResult(token_id, chosen, entries))
    return out
