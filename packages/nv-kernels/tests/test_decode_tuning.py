"""decode_tuning's launch choices that need no GPU to check: the query tile's rows."""
from __future__ import annotations

from nv_kernels.decode_tuning import query_tile_rows


def test_query_tiles_pad_the_group_to_a_power_of_two_with_a_floor_per_cache() -> None:
    # Qwen3-0.6B (2 query heads per KV head): 16 rows with a 16-bit cache, 8 with an FP8 one
    assert query_tile_rows(2) == 16 and query_tile_rows(2, fp8=True) == 8
    for group in range(1, 65):
        for fp8 in (False, True):
            rows = query_tile_rows(group, fp8)
            assert rows >= group and rows & (rows - 1) == 0 and rows >= (8 if fp8 else 16)
            assert rows == max(8 if fp8 else 16, group) or rows < 2 * group
