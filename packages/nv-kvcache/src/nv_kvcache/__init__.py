"""Pure-Python paged KV-cache core: sequences, block manager with prefix caching, scheduler."""
from nv_kvcache.__about__ import __version__

__all__ = ["__version__"]
