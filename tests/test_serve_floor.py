"""benchmarks/serve_floor.py: the bandwidth floor of a closed-loop serving run, counted step by step."""
from __future__ import annotations

import math

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def serve_floor():
    return load_script("benchmarks/serve_floor.py")


def test_one_slot_runs_requests_one_after_another(serve_floor) -> None:
    # (prompt 10, 3 tokens) then (prompt 5, 1 token) through one slot: the first prefills and gives token 1,
    # decodes over contexts 11 and 12, then the second prefills and is done: 4 steps, 4 tokens
    kv_bytes = serve_floor.KV_ELEMENTS_PER_TOKEN * serve_floor.KV_ELEMENT_BYTES["auto"]
    seconds, tokens, steps = serve_floor.floor_seconds([(10, 3), (5, 1)], 1, bandwidth=1e12, flops=1e15,
                                                       kv_bytes_per_token=kv_bytes)
    assert (tokens, steps) == (4, 4)
    expected = (4 * serve_floor.WEIGHT_BYTES + (11 + 12) * kv_bytes) / 1e12
    expected += (10 + 5) * serve_floor.FLOPS_PER_PROMPT_TOKEN / 1e15
    assert math.isclose(seconds, expected, rel_tol=1e-12)


def test_more_slots_share_the_weight_reads(serve_floor) -> None:
    requests = [(100, 50)] * 8
    kv_bytes = serve_floor.KV_ELEMENTS_PER_TOKEN * serve_floor.KV_ELEMENT_BYTES["auto"]
    one, tokens_one, _ = serve_floor.floor_seconds(requests, 1, bandwidth=1e12, flops=1e15,
                                                   kv_bytes_per_token=kv_bytes)
    eight, tokens_eight, steps = serve_floor.floor_seconds(requests, 8, bandwidth=1e12, flops=1e15,
                                                           kv_bytes_per_token=kv_bytes)
    assert tokens_one == tokens_eight == 8 * 50 and steps == 50
    assert eight < one / 4


def test_an_fp8_cache_halves_the_kv_reads(serve_floor) -> None:
    requests = [(1000, 200)] * 4
    floors = {}
    for dtype in ("auto", "fp8"):
        kv_bytes = serve_floor.KV_ELEMENTS_PER_TOKEN * serve_floor.KV_ELEMENT_BYTES[dtype]
        floors[dtype], _, steps = serve_floor.floor_seconds(requests, 4, bandwidth=1e12, flops=1e30,
                                                            kv_bytes_per_token=kv_bytes)
    weights = steps * serve_floor.WEIGHT_BYTES / 1e12          # the same in both
    assert math.isclose(floors["fp8"] - weights, (floors["auto"] - weights) / 2, rel_tol=1e-9)
