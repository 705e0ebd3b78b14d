"""One chat choice's output as a message: the reasoning split off (--reasoning-parser), then the tool
calls read from the rest (tool_choice). Whole (`message`) or as it streams (`deltas`, which sends what
the parsers' growing view of the text adds)."""
from __future__ import annotations

from dataclasses import dataclass, field

from nv_engine.entrypoints.server.protocol import (
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from nv_engine.entrypoints.server.reasoning.reasoning_parser import ReasoningParser, ReasoningSplit
from nv_engine.entrypoints.server.tool_parsers.parsed_output import ParsedOutput
from nv_engine.entrypoints.server.tool_parsers.tool_parser import ToolParser
from nv_engine.entrypoints.server.tool_protocol import FunctionCall, ToolCall, random_tool_call_id


@dataclass
class _SentCall:
    id: str
    arguments_chars: int = 0


@dataclass
class ChatOutputParser:
    reasoning_parser: ReasoningParser | None = None
    tool_parser: ToolParser | None = None
    # what the stream has sent so far
    _sent_reasoning: int = 0
    _sent_content: int = 0
    _sent_calls: list[_SentCall] = field(default_factory=list)

    def _parse(self, text: str, final: bool) -> tuple[ReasoningSplit, ParsedOutput]:
        split = self.reasoning_parser.parse(text, final) if self.reasoning_parser else ReasoningSplit(None, text)
        parsed = self.tool_parser.parse(split.content, final) if self.tool_parser else ParsedOutput(split.content)
        return split, parsed

    def message(self, text: str) -> ChatResponseMessage:
        """The whole output as the response's message."""
        split, parsed = self._parse(text, final=True)
        calls = [ToolCall(function=FunctionCall(name=call.name, arguments=call.arguments))
                 for call in parsed.calls if call.name is not None]
        content: str | None = parsed.content
        if calls and not parsed.content.strip():
            content = None
        return ChatResponseMessage(content=content, reasoning=split.reasoning,
                                   reasoning_content=split.reasoning, tool_calls=calls or None)

    @property
    def made_tool_calls(self) -> bool:
        return bool(self._sent_calls)

    def finish_reason(self, engine_reason: str | None, message: ChatResponseMessage | None = None) -> str | None:
        """"tool_calls" for an output that stopped after calling tools (OpenAI's), else the engine's."""
        called = bool(message.tool_calls) if message is not None else self.made_tool_calls
        return "tool_calls" if called and engine_reason == "stop" else engine_reason

    def deltas(self, text: str, final: bool) -> list[DeltaMessage]:
        """What the stream sends for the output so far (`final`: the output is complete): reasoning and
        content fragments, then per tool call a first delta (id, type, name, arguments "") and then
        argument fragments, each tool delta in a message of its own."""
        split, parsed = self._parse(text, final)
        first = DeltaMessage()
        reasoning = split.reasoning or ""
        if len(reasoning) > self._sent_reasoning:
            first.reasoning = first.reasoning_content = reasoning[self._sent_reasoning:]
            self._sent_reasoning = len(reasoning)
        if len(parsed.content) > self._sent_content:
            first.content = parsed.content[self._sent_content:]
            self._sent_content = len(parsed.content)
        tool_deltas: list[DeltaToolCall] = []
        for index, call in enumerate(parsed.calls):
            if call.name is None:     # calls go out in order, each once its name is known
                break
            if index == len(self._sent_calls):
                sent = _SentCall(random_tool_call_id())
                self._sent_calls.append(sent)
                tool_deltas.append(DeltaToolCall(index=index, id=sent.id, type="function",
                                                 function=DeltaFunctionCall(name=call.name, arguments="")))
            sent = self._sent_calls[index]
            if len(call.arguments) > sent.arguments_chars:
                tool_deltas.append(DeltaToolCall(index=index, function=DeltaFunctionCall(
                    arguments=call.arguments[sent.arguments_chars:])))
                sent.arguments_chars = len(call.arguments)
        messages = [first] if first.reasoning is not None or first.content is not None else []
        messages += [DeltaMessage(tool_calls=[delta]) for delta in tool_deltas]
        return messages
