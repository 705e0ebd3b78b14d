"""Qwen3's reasoning: `<think>...</think>` before the answer. The model may write `<think>` itself,
or the chat template may have put it at the end of the prompt (then the output starts inside the
block: text up to `</think>` is reasoning); with enable_thinking=False the template writes an empty
block into the prompt and the whole output is content."""
from __future__ import annotations

import enum

from nv_engine.entrypoints.server.reasoning.reasoning_parser import ReasoningParser, ReasoningSplit

OPEN, CLOSE = "<think>", "</think>"


class PromptEnds(enum.Enum):
    INSIDE_REASONING = "inside"   # the prompt opened the block
    AFTER_REASONING = "after"     # the prompt opened and closed it: no reasoning in the output
    OUTSIDE = "outside"           # no block at the end of the prompt: the output may open one


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class Qwen3ReasoningParser(ReasoningParser):
    def __init__(self, prompt_tail: str) -> None:
        """`prompt_tail`: the last part of the rendered prompt (the current assistant turn's start)."""
        super().__init__(prompt_tail)
        opened, closed = prompt_tail.rfind(OPEN), prompt_tail.rfind(CLOSE)
        if opened > closed:
            self.prompt_ends = PromptEnds.INSIDE_REASONING
        elif closed >= 0:
            self.prompt_ends = PromptEnds.AFTER_REASONING
        else:
            self.prompt_ends = PromptEnds.OUTSIDE

    def parse(self, text: str, final: bool) -> ReasoningSplit:
        if self.prompt_ends is PromptEnds.AFTER_REASONING:
            return ReasoningSplit(None, text)
        stripped = text.lstrip()
        if stripped.startswith(OPEN):
            body = stripped[len(OPEN):]
        elif not final and OPEN.startswith(stripped):   # nothing yet, or maybe the start of <think>
            return ReasoningSplit(None if self.prompt_ends is PromptEnds.OUTSIDE else "", "")
        elif self.prompt_ends is PromptEnds.OUTSIDE:
            return ReasoningSplit(None, text)
        else:
            body = text
        end = body.find(CLOSE)
        if end >= 0:
            return ReasoningSplit(body[:end], body[end + len(CLOSE):].lstrip())
        if not final:
            body = body[:len(body) - _partial_tag(body, CLOSE)]
        return ReasoningSplit(body, "")
