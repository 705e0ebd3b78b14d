"""NgramProposer: prompt lookup of the longest recent suffix."""
from __future__ import annotations

import pytest

from nv_engine.spec_decode.ngram_proposer import NgramProposer


def test_proposes_what_followed_the_most_recent_occurrence():
    proposer = NgramProposer(3, 1, 3)
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3]
    assert proposer.propose(tokens) == [7, 8, 2]      # "2 3" last seen at 6..7, then 7 8 2


def test_longer_ngram_wins_over_a_more_recent_shorter_one():
    proposer = NgramProposer(2, 1, 3)
    tokens = [5, 6, 7, 10, 11, 0, 7, 20, 21, 5, 6, 7]
    # n=3 "5 6 7" occurs at 0 (-> 10 11); the more recent "7" alone at 6 (-> 20 21) loses
    assert proposer.propose(tokens) == [10, 11]


def test_no_occurrence_and_min_length():
    assert NgramProposer(3, 1, 4).propose([1, 2, 3, 4]) == []
    assert NgramProposer(3, 2, 4).propose([1, 2, 9, 2]) == []        # only a 1-gram matches
    assert NgramProposer(3, 1, 4).propose([7]) == []


def test_draft_is_capped_by_k_max_tokens_and_the_end():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert NgramProposer(5, 1, 2).propose(tokens) == [3, 4, 5, 6, 1]
    assert NgramProposer(5, 1, 2).propose(tokens, max_tokens=2) == [3, 4]
    assert NgramProposer(5, 1, 2).propose(tokens, max_tokens=0) == []
    # a repeated token: the occurrence overlapping the suffix proposes the repetition; with room, k of it
    assert NgramProposer(4, 1, 3).propose([8, 8, 8, 8]) == [8]
    assert NgramProposer(3, 1, 2).propose([5] + [8] * 8) == [8, 8, 8]


def test_bad_arguments():
    with pytest.raises(ValueError, match="min <= max"):
        NgramProposer(3, 4, 2)


def _lookup(tokens: list[int], k: int, lo: int, hi: int) -> list[int]:
    """The rule spelled out: for n from hi down to lo, the earlier starts of the last n tokens with a token after
    them; the most recent with k tokens after it, else the most recent; the (up to) k tokens that follow."""
    total = len(tokens)
    for n in range(min(hi, total - 1), lo - 1, -1):
        starts = [s for s in range(total - n) if tokens[s:s + n] == tokens[total - n:]]
        if starts:
            full = [s for s in starts if s + n + k <= total]
            start = full[-1] if full else starts[-1]
            return tokens[start + n:min(start + n + k, total)]
    return []


def test_matches_the_rule_on_random_sequences():
    import random

    rng = random.Random(0)
    for trial in range(400):
        vocab = rng.choice([2, 3, 5, 50])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        k, lo = rng.randrange(1, 6), rng.randrange(1, 4)
        hi = lo + rng.randrange(0, 4)
        assert NgramProposer(k, lo, hi).propose(tokens) == _lookup(tokens, k, lo, hi), (trial, tokens, k, lo, hi)
