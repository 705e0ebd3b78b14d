"""Llama 3.x JSON tool calls: the whole output is `{"name": ..., "parameters": {...}}` (or
"arguments"), possibly after `<|python_tag|>`, several calls separated by `;`. An output that does
not start with an object is content; one that starts like a call but does not parse as calls is
content from where it stops being calls."""
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
        calls, rest = self._calls(json_text, i, final)
        if not calls:      # not a call after all (or not yet known to be one)
            return ParsedOutput(text if final or rest is not None else "")
        return ParsedOutput(text[rest:] if rest is not None else "", calls)

    def _calls(self, json_text: PartialJson, i: int, final: bool) -> tuple[list[PartialToolCall], int | None]:
        """The calls from `i` on, and where text that is not a call starts (None: all calls so far).
        A call counts once its name is written; a finished object without a name ends the calls."""
        text, calls = json_text.text, []
        while True:
            try:
                call = self.call_in_object(json_text, i, ("parameters", "arguments"))
                end = json_text.scan_object(i).end
            except InvalidJson:
                return calls, i
            if call.name is None:
                return calls, (i if end is not None or final else None)
            calls.append(call)
            if end is None:
                return calls, None
            j = json_text.skip_whitespace(end)
            if j == len(text):
                return calls, None
            if text[j] != ";":
                return calls, end
            i = json_text.skip_whitespace(j + 1)
            if i == len(text):
                return calls, None
