"""The interface of a reasoning parser: the model's text so far -> (reasoning, content)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str | None   # None: the output has no reasoning part
    content: str


class ReasoningParser(ABC):
    """Made once per choice with the end of the rendered prompt (a template may open, or open and
    close, the reasoning block itself). `parse(text, final)` is a pure function of the text whose
    parts only grow as the text grows; `final=False` holds back text that may be a tag."""

    def __init__(self, prompt_tail: str) -> None:
        self.prompt_tail = prompt_tail

    @abstractmethod
    def parse(self, text: str, final: bool) -> ReasoningSplit: ...
