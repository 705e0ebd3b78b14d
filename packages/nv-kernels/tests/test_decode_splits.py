"""decode_tuning.choose_num_splits: static facts in, a power of two out; an FP8 cache splits up to more programs."""
from __future__ import annotations

from nv_kernels.decode_tuning import MAX_SPLITS, MIN_TOKENS_PER_SPLIT, choose_num_splits

SMS = 132   # H100 SXM / H200


def test_an_fp8_cache_splits_a_batch_that_bf16_reads_in_one_split() -> None:
    # Qwen3-0.6B's 8 KV heads, contexts up to 4,096 (the engine's graphs): 64 sequences are 512 programs, one per
    # resident slot of an FP8 launch, so uneven contexts leave SMs idle; bf16 reads them in one split
    assert choose_num_splits(64, 8, 4096, SMS) == 1
    assert choose_num_splits(64, 8, 4096, SMS, fp8=True) == 4
    for fp8 in (False, True):
        assert choose_num_splits(256, 8, 4096, SMS, fp8=fp8) == 1     # a full batch: no merge
        assert choose_num_splits(1, 8, 4096, SMS, fp8=fp8) == 16      # one sequence: as many as 256-token splits


def test_splits_are_powers_of_two_that_keep_their_tokens() -> None:
    for fp8 in (False, True):
        for batch in range(1, 300, 7):
            for context in (16, 300, 1024, 4096, 40960):
                splits = choose_num_splits(batch, 8, context, SMS, fp8=fp8)
                assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
                assert splits == 1 or context // splits >= MIN_TOKENS_PER_SPLIT
                assert splits >= choose_num_splits(batch, 8, context, SMS)   # FP8 never splits less than bf16
