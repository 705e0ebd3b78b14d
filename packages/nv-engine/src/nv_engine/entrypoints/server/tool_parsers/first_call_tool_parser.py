"""parallel_tool_calls=false with tool_choice "auto": another parser's output with its first tool call only
(vLLM does the same). A model may still write several calls; the later ones are dropped from the answer,
plain and streamed (the parse only ever holds one call, so a stream never sends a second)."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser


class FirstCallToolParser(ToolParser):
    def __init__(self, inner: ToolParser) -> None:
        self.inner = inner

    def parse(self, text: str, final: bool) -> ParsedOutput:
        parsed = self.inner.parse(text, final)
        if len(parsed.calls) <= 1:
            return parsed
        return ParsedOutput(parsed.content, parsed.calls[:1])
