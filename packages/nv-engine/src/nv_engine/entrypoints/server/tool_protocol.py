"""The OpenAI API's tool-calling bodies: the functions a request declares (`tools`, `tool_choice`) and the calls
an assistant made (in responses and in the history a client sends back)."""
from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")   # goes to the chat template as given
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None   # a JSON schema of the arguments object
    strict: bool | None = None


class ChatTool(BaseModel):
    """One entry of `tools`: a function the model may call."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """tool_choice {"type": "function", "function": {"name": ...}}: that function must be called."""

    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str   # a JSON object, as text


class ToolCall(BaseModel):
    """A call the assistant made (in a response, and in the history a client sends back)."""

    id: str = Field(default_factory=lambda: random_tool_call_id())
    type: Literal["function"] = "function"
    function: FunctionCall

    def template_dict(self) -> dict[str, Any]:
        """The call as chat templates read it: arguments as an object (they write it with tojson).
        Raises ValueError when the arguments are not a JSON object."""
        try:
            arguments = json.loads(self.function.arguments)
        except ValueError as exc:
            raise ValueError(f"function.arguments is not valid JSON: {exc}") from exc
        if not isinstance(arguments, dict):
            raise ValueError("function.arguments must be a JSON object")
        return {"id": self.id, "type": self.type, "function": {"name": self.function.name, "arguments": arguments}}


def random_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"
