"""Hermes-style tool calls (Qwen2.5, Qwen3, NousResearch Hermes templates): each call is a JSON
object `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`; the text
outside the blocks is the content."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput, PartialToolCall
from nv_engine.entrypoints.server.tool_parsers.partial_json import InvalidJson, PartialJson
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def held_back_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (it may become the tag)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class HermesToolParser(ToolParser):
    def parse(self, text: str, final: bool) -> ParsedOutput:
        before_first: str | None = None   # content before the first call
        outside: list[str] = []           # content between and after calls
        calls: list[PartialToolCall] = []
        pos = 0
        while True:
            start = text.find(OPEN, pos)
            if start < 0:
                tail = text[pos:]
                if not final:
                    tail = tail[:len(tail) - held_back_suffix(tail, OPEN)]
                outside.append(tail)
                break
            outside.append(text[pos:start])
            if before_first is None and not calls:
                before_first = "".join(outside)
                outside = []
            body_start = start + len(OPEN)
            close = text.find(CLOSE, body_start)
            body = text[body_start:close if close >= 0 else len(text)]
            call = self._call(body)
            if call is None or (close >= 0 and call.name is None):
                if close >= 0:      # not a call after all: the block is content
                    outside.append(text[start:close + len(CLOSE)])
                    pos = close + len(CLOSE)
                    continue
                if final:
                    outside.append(text[start:])
                break
            if call.name is None and final:   # the model stopped before naming the function
                outside.append(text[start:])
                break
            calls.append(call)
            if close < 0:
                break
            pos = close + len(CLOSE)
        if before_first is None:     # no call block at all: everything is content
            return ParsedOutput("".join(outside), calls)
        rest = "".join(outside)
        return ParsedOutput(before_first + (rest if rest.strip() else ""), calls)

    def _call(self, body: str) -> PartialToolCall | None:
        """The call in a block's text so far; None when it cannot be one."""
        json_text = PartialJson(body)
        start = json_text.skip_whitespace(0)
        if start == len(body):
            return PartialToolCall(None, "")
        try:
            return self.call_in_object(json_text, start, ("arguments", "parameters"))
        except InvalidJson:
            return None
