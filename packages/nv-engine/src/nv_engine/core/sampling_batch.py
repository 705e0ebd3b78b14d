"""Per-step sampling inputs: SamplingParams rows -> SamplingBatch (host, numpy, picklable) ->
SamplingTensors (device), and a StepResult's sampled ids / logprobs back to per-sequence results.

It runs every step at batch ~256, so the parts that follow the requests' parameters (temperature,
top-k/p, min-p, penalty factors, flags) are cached while the rows' SamplingParams objects are the
same as last step; only seeds and positions (one [2, S] array, one copy) are rebuilt then. When the
rows change (a request joins or leaves: most steps under load), the arrays are rebuilt from one
numeric row per SamplingParams, computed when the object is first seen and kept while it is a row.
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

from nv_engine.core.step import SamplingBatch, SamplingFlags, StepResult
from nv_engine.engine.outputs import Logprob
from nv_engine.sampling_params import SAMPLING_EPS, SamplingParams

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


class _ParamsRow(NamedTuple):
    """One SamplingParams as the static arrays read it (computed once per object)."""

    params: SamplingParams      # kept: the cache is keyed by id(), which must not be reused meanwhile
    values: tuple[float, ...]   # temperature (0 when greedy), top_k (0: off), top_p, min_p, presence,
                                # frequency and repetition penalties (_VALUE_COLUMNS), logprobs (-1: None)
    rare: bool                  # allowed ids, logit bias, min_tokens or bad words: looked at row by row


_VALUE_COLUMNS = ("temperatures", "top_k", "top_p", "min_p", "presence_penalties", "frequency_penalties",
                  "repetition_penalties")


class SamplingBatchBuilder:
    """Builds each step's SamplingBatch; one per engine."""

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = [int(t) for t in eos_token_ids if 0 <= int(t) < vocab_size]
        self._last_params: list[SamplingParams] = []
        self._static: _StaticPart | None = None
        self._rows_by_id: dict[int, _ParamsRow] = {}   # the last static part's rows, by id(params)

    def _params_row(self, p: SamplingParams) -> _ParamsRow:
        greedy = p.temperature < SAMPLING_EPS
        top_k = 0 if greedy or p.top_k >= self.vocab_size else max(p.top_k, 0)
        values = (0.0 if greedy else p.temperature, top_k, 1.0 if greedy else p.top_p, 0.0 if greedy else p.min_p,
                  p.presence_penalty, p.frequency_penalty, p.repetition_penalty,
                  -1 if p.logprobs is None else p.logprobs)
        rare = bool(p.allowed_token_ids or p.logit_bias or p.min_tokens > 0 or p.bad_words_token_ids)
        return _ParamsRow(p, values, rare)

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
        known = self._rows_by_id
        rows = [row if (row := known.get(id(p))) is not None and row.params is p else self._params_row(p)
                for p in params]
        self._rows_by_id = {id(row.params): row for row in rows}
        table = np.array([row.values for row in rows], np.float64)   # [S, len(_VALUE_COLUMNS)]
        temps, top_k = table[:, 0].astype(np.float32), table[:, 1].astype(np.int64)
        top_p, min_p = table[:, 2].astype(np.float32), table[:, 3].astype(np.float32)
        arrays = dict(temperatures=temps, top_k=top_k, top_p=top_p, min_p=min_p)
        for column, off in ((4, 0.0), (5, 0.0), (6, 1.0)):
            values = table[:, column].astype(np.float32)
            if (values != off).any():
                arrays[_VALUE_COLUMNS[column]] = values
        rare_rows = [i for i, row in enumerate(rows) if row.rare]
        allowed_rows = [i for i in rare_rows if params[i].allowed_token_ids]
        if allowed_rows:
            arrays["allowed_token_ids"] = _padded([p.allowed_token_ids for p in params], allowed_rows,
                                                  len(params), vocab)
        bias_rows = [i for i in rare_rows if params[i].logit_bias]
        if bias_rows:
            bias_ids = [list(p.logit_bias) if p.logit_bias else None for p in params]
            arrays["logit_bias_ids"] = _padded(bias_ids, bias_rows, len(params), vocab)
            values = np.zeros(arrays["logit_bias_ids"].shape, np.float32)
            for i in bias_rows:
                bias = params[i].logit_bias or {}
                values[i, :len(bias)] = list(bias.values())
            arrays["logit_bias_values"] = values
        counts = [p.logprobs for p in params]
        logprobs = table[:, 7]                                                  # -1: none asked
        greedy = temps == 0.0                                                   # (temperature < EPS)
        flags = SamplingFlags(
            num_logprobs=max(int(logprobs.max()), 0), need_logprobs=bool((logprobs >= 0).any()),
            all_greedy=bool(greedy.all()), any_greedy=bool(greedy.any()),
            any_top_k=bool((top_k > 0).any()), any_top_p=bool((top_p < 1.0).any()),
            any_min_p=bool((min_p > 0.0).any()),
            max_top_k=int(top_k.max()) if (top_k > 0).any() else None)
        min_rows = []
        for row in rare_rows:
            p = params[row]
            if p.min_tokens > 0:
                ids = set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(self.eos_token_ids))
                ids = sorted(i for i in ids if i < vocab)
                if ids:
                    min_rows.append((row, p.min_tokens, ids))
        penalties = [arrays[name] for name in _VALUE_COLUMNS[4:6] if name in arrays]   # != 0 somewhere
        repetition = arrays.get("repetition_penalties")                                 # != 1 somewhere
        rep_rows = np.flatnonzero(repetition != 1.0).tolist() if repetition is not None else []
        pen_mask = (repetition != 1.0) if repetition is not None else np.zeros(len(params), bool)
        for values in penalties:
            pen_mask |= values != 0.0
        pen_rows = np.flatnonzero(pen_mask).tolist()
        bad_word_rows = [i for i in rare_rows if params[i].bad_words_token_ids]
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
