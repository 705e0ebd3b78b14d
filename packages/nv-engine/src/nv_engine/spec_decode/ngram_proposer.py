"""NgramProposer: draft tokens by prompt lookup (the idea of Saxena's prompt-lookup decoding, as vLLM's
"ngram" method): the sequence's last n tokens are searched earlier in its own tokens, and the tokens that
followed the most recent earlier occurrence are the draft. An occurrence that overlaps the end leaves fewer than
k tokens to follow (a run of one repeated token: one), so the most recent occurrence with k tokens after it is
preferred where one exists."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RECENT = 64    # starts searched in Python before the numpy pass over the whole sequence


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if num_speculative_tokens < 1 or prompt_lookup_min < 1 or prompt_lookup_min > prompt_lookup_max:
            raise ValueError(f"NgramProposer needs k >= 1 and 1 <= min <= max, got k={num_speculative_tokens}, "
                             f"min={prompt_lookup_min}, max={prompt_lookup_max}")
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Up to k' = min(k, max_tokens) draft tokens following an earlier occurrence of the longest suffix (n from
        max down to min) that occurs earlier: its most recent occurrence with k' tokens after it, else its most
        recent one (the draft then stops at the end of token_ids); [] when no suffix occurs earlier.

        Host cost per sequence and step (the engine calls it in every drafting step): first the longest suffix
        among the last RECENT starts (repetitive text: found at once); then a C-speed scan for the last token
        (random text mostly ends there); then numpy over the whole sequence: match masks grown one token at a
        time, m_n[e] = whether the n tokens ending at e equal the last n (e <= total - 2, so a token follows),
        stopping at the first n without a match (no longer suffix can match then)."""
        k = self.num_speculative_tokens if max_tokens is None else min(self.num_speculative_tokens, max_tokens)
        total = len(token_ids)
        if k <= 0 or total < self.prompt_lookup_min + 1:
            return []
        longest = min(self.prompt_lookup_max, total - 1)
        if longest >= self.prompt_lookup_min:          # the longest suffix wins: its most recent start, if recent
            suffix = list(token_ids[total - longest:])
            first = suffix[0]
            # only occurrences with k tokens after them (the rest, if any, are weighed by the pass below)
            for start in range(total - longest - k, max(total - longest - k - RECENT, -1), -1):
                if token_ids[start] == first and list(token_ids[start:start + longest]) == suffix:
                    follow = start + longest
                    return list(token_ids[follow:follow + k])
        try:
            token_ids.index(token_ids[-1], 0, total - 1)
        except ValueError:
            return []                                  # the last token occurs nowhere earlier: no suffix does
        tokens = np.asarray(token_ids, dtype=np.int64)                                  # [total]
        ends = tokens[:total - 1] == tokens[-1]                                         # [total-1]: m_1
        best = -1                                      # end of the chosen occurrence
        for n in range(1, min(self.prompt_lookup_max, total - 1) + 1):
            if n > 1:                                  # m_n[e] = m_{n-1}[e] & tokens[e-n+1] == tokens[total-n]
                ends[:n - 1] = False
                ends[n - 1:] &= tokens[:total - n] == tokens[total - n]
            hits = np.flatnonzero(ends)
            if len(hits) == 0:
                break
            if n >= self.prompt_lookup_min:   # the most recent end with k tokens after it, else the most recent
                full = hits[hits <= total - 1 - k]
                best = int(full[-1] if len(full) else hits[-1])
        if best < 0:
            return []
        follow = best + 1
        return [int(t) for t in token_ids[follow:min(follow + k, total)]]
