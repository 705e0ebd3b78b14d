"""The reasoning parsers `nv serve --reasoning-parser NAME` can use."""
from __future__ import annotations

from nv_engine.entrypoints.server.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
from nv_engine.entrypoints.server.reasoning.reasoning_parser import ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {"qwen3": Qwen3ReasoningParser}
