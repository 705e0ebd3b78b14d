"""The tool-call parsers `nv serve --tool-call-parser NAME` can use for tool_choice "auto"."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.hermes_tool_parser import HermesToolParser
from nv_engine.entrypoints.server.tool_parsers.llama3_json_tool_parser import Llama3JsonToolParser
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
}
