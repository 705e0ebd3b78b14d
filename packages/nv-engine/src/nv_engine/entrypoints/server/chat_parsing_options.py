"""How `nv serve` reads tool calls and reasoning out of chat outputs: its flags
--enable-auto-tool-choice, --tool-call-parser and --reasoning-parser (vLLM's names)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from nv_engine.entrypoints.server.reasoning.registry import REASONING_PARSERS
from nv_engine.entrypoints.server.tool_parsers.registry import TOOL_PARSERS


@dataclass(frozen=True)
class ChatParsingOptions:
    enable_auto_tool_choice: bool = False   # tool_choice "auto" (the default when tools are sent)
    tool_call_parser: str | None = None     # a TOOL_PARSERS name: reads calls the model writes itself
    reasoning_parser: str | None = None     # a REASONING_PARSERS name

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, "
                             f"got {self.tool_call_parser!r}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")

    @staticmethod
    def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("tool calls and reasoning")
        group.add_argument("--enable-auto-tool-choice", action="store_true",
                           help='accept tool_choice "auto" (the model decides whether to call a tool; '
                                "needs --tool-call-parser)")
        group.add_argument("--tool-call-parser", choices=sorted(TOOL_PARSERS), default=None,
                           help="how to read the tool calls the model writes (its chat template's format)")
        group.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                           help="split the model's reasoning into the message's `reasoning` field")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ChatParsingOptions:
        """The options a parsed command line set; attributes it lacks keep their defaults."""
        return cls(enable_auto_tool_choice=bool(getattr(args, "enable_auto_tool_choice", False)),
                   tool_call_parser=getattr(args, "tool_call_parser", None),
                   reasoning_parser=getattr(args, "reasoning_parser", None))
