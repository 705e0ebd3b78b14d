"""tool_choice "required": the grammar makes the output a JSON array (at least one item) of
`{"name": <one of the tools>, "parameters": {...}}`; each item is a call. Independent of the chat
template, so it works with any model."""
from __future__ import annotations

from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput, PartialToolCall
from nv_engine.entrypoints.server.tool_parsers.partial_json import InvalidJson, PartialJson
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser


class RequiredToolParser(ToolParser):
    @staticmethod
    def json_schema(tools: list[tuple[str, dict]], one_call: bool = False) -> dict:
        """The schema that forces the calls: `tools` as (name, parameters schema) pairs; one_call: exactly
        one (parallel_tool_calls=false)."""
        return {"type": "array", "minItems": 1, **({"maxItems": 1} if one_call else {}),
                "items": {"type": "object", "anyOf": [
                    {"properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                     "required": ["name", "parameters"]} for name, parameters in tools]}}

    def parse(self, text: str, final: bool) -> ParsedOutput:
        json_text = PartialJson(text)
        calls: list[PartialToolCall] = []
        i = json_text.skip_whitespace(0)
        if i == len(text):
            return ParsedOutput(text if final else "")
        if text[i] != "[":
            return ParsedOutput(text)
        try:
            i = json_text.skip_whitespace(i + 1)
            while i < len(text) and text[i] == "{":
                calls.append(self.call_in_object(json_text, i, ("parameters", "arguments")))
                end = json_text.scan_object(i).end
                if end is None:
                    break
                i = json_text.skip_whitespace(end)
                if i < len(text) and text[i] == ",":
                    i = json_text.skip_whitespace(i + 1)
        except InvalidJson:
            return ParsedOutput(text if final else "", [])
        if final and not any(call.name for call in calls):
            return ParsedOutput(text)
        return ParsedOutput("", calls)
