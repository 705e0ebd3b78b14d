"""What a tool parser reads from a model's text so far: the content and the tool calls. Both only
grow as the text grows (a streamed response sends the growth), except that the final parse may
release text held back because it might have started a tool call."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartialToolCall:
    name: str | None      # None until the name is written in full
    arguments: str        # the raw JSON text of the arguments written so far


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: list[PartialToolCall] = field(default_factory=list)
