"""The environment variables of nv-layers: the only module of the package that reads the environment, one
function per variable, read when called (never at import). nv-layers has no NV_* variable of its own; it reads:

    LOCAL_WORLD_SIZE   set by torchrun: the ranks on this host (the symmetric-memory all-reduce needs every rank
                       of its group on one host)
"""
from __future__ import annotations

import os


def local_world_size() -> int | None:
    """LOCAL_WORLD_SIZE (torchrun's): the number of ranks on this host; None when unset or not an integer."""
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)
