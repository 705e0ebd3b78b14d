"""tool_choice naming a function: the grammar makes the whole output the arguments object, so the
output is one call of that function."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput, PartialToolCall
from nv_engine.entrypoints.server.tool_parsers.partial_json import InvalidJson, PartialJson
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser


class NamedFunctionToolParser(ToolParser):
    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str, final: bool) -> ParsedOutput:
        json_text = PartialJson(text)
        start = json_text.skip_whitespace(0)
        try:
            end = json_text.value_end(start)
        except InvalidJson:
            end = None
        if end is None:
            end = len(text)
        return ParsedOutput("", [PartialToolCall(self.name, text[start:end])])
