"""Llama 3.x JSON tool calls: the whole output is `{"name": ..., "parameters": {...}}` (or
"arguments"), possibly after `<|python_tag|>`, several calls separated by `;`. An output that does
not start with an object is content; one that starts like a call but does not parse as calls is
returned as content when it ends."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput, PartialToolCall
from nv_engine.entrypoints.server.tool_parsers.partial_json import InvalidJson, PartialJson
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        json_text = PartialJson(text)
        i = json_text.skip_whitespace(0)
        if text.startswith(PYTHON_TAG, i):
            i = json_text.skip_whitespace(i + len(PYTHON_TAG))
        elif PYTHON_TAG.startswith(text[i:]) and i < len(text) and not final:
            return ParsedOutput("")            # may become the tag
        if i == len(text):
            return ParsedOutput(text if final else "")
        if text[i] != "{":
            return ParsedOutput(text)
        try:
            calls = self._calls(json_text, i, final)
        except InvalidJson:
            return ParsedOutput(text if final else "")
        return ParsedOutput("", calls)

    def _calls(self, json_text: PartialJson, i: int, final: bool) -> list[PartialToolCall]:
        text, calls = json_text.text, []
        while True:
            call = self.call_in_object(json_text, i, ("parameters", "arguments"))
            end = json_text.scan_object(i).end
            if final and (end is None or call.name is None):
                raise InvalidJson("an unfinished or unnamed call")
            calls.append(call)
            if end is None:
                return calls
            i = json_text.skip_whitespace(end)
            if i == len(text):
                return calls
            if text[i] != ";":
                raise InvalidJson(f"expected ';' between calls at {i}")
            i = json_text.skip_whitespace(i + 1)
            if i == len(text):
                return calls
