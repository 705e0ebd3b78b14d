"""The interface of a tool-call parser: the model's text so far -> content and tool calls."""
from __future__ import annotations

from abc import ABC, abstractmethod

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput, PartialToolCall
from nv_engine.entrypoints.server.tool_parsers.partial_json import InvalidJson, PartialJson


class ToolParser(ABC):
    """`parse(text, final)` must be a pure function of the text: called again on a longer text,
    its content and each call's arguments extend the earlier ones (a stream sends the difference).
    `final=False` holds back text that may still turn out to be part of a tool call."""

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedOutput: ...

    @staticmethod
    def call_in_object(json_text: PartialJson, start: int, argument_keys: tuple[str, ...]) -> PartialToolCall:
        """The call an object `{"name": ..., <argument key>: {...}}` opening at `start` holds so far.
        Raises InvalidJson when the text cannot be such an object."""
        scan = json_text.scan_object(start)
        name, arguments = None, ""
        for member in scan.members:
            if member.key == "name" and member.value_end is not None:
                if json_text.text[member.value_start] != '"':
                    raise InvalidJson("the tool name is not a string")
                name = json_text.decode_string(member.value_start, member.value_end)
            elif member.key in argument_keys:
                end = member.value_end if member.value_end is not None else len(json_text.text)
                arguments = json_text.text[member.value_start:end]
        if scan.end is not None and not any(m.key in argument_keys for m in scan.members):
            arguments = "{}"   # a finished call without arguments: it takes none
        return PartialToolCall(name, arguments)
