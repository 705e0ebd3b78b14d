"""NgramProposer: draft tokens by prompt lookup (the idea of Saxena's prompt-lookup decoding, as vLLM's
"ngram" method): the sequence's last n tokens are searched earlier in its own tokens, and the tokens that
followed the most recent earlier occurrence are the draft."""
from __future__ import annotations

from collections.abc import Sequence


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if num_speculative_tokens < 1 or prompt_lookup_min < 1 or prompt_lookup_min > prompt_lookup_max:
            raise ValueError(f"NgramProposer needs k >= 1 and 1 <= min <= max, got k={num_speculative_tokens}, "
                             f"min={prompt_lookup_min}, max={prompt_lookup_max}")
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: Sequence[int], max_tokens: int | None = None) -> list[int]:
        """Up to min(k, max_tokens) draft tokens following the most recent earlier occurrence of the longest
        suffix (n from max down to min) that occurs earlier; [] when none does. The draft stops at the end of
        token_ids (an occurrence near the end proposes fewer tokens)."""
        k = self.num_speculative_tokens if max_tokens is None else min(self.num_speculative_tokens, max_tokens)
        total = len(token_ids)
        if k <= 0 or total < self.prompt_lookup_min + 1:
            return []
        for n in range(min(self.prompt_lookup_max, total - 1), self.prompt_lookup_min - 1, -1):
            suffix = list(token_ids[total - n:])
            first = suffix[0]
            # most recent start first; an occurrence may overlap the suffix as long as a token follows it
            for start in range(total - n - 1, -1, -1):
                if token_ids[start] == first and list(token_ids[start:start + n]) == suffix:
                    follow = start + n
                    return list(token_ids[follow:min(follow + k, total)])
        return []
