"""Request and response bodies of the OpenAI API (the subset nv serves), plus vLLM's extras."""
from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from nv_engine.entrypoints.server.tool_protocol import ChatTool, NamedToolChoice, ToolCall


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# ----------------------------------------------------------------------------------------- requests

class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False      # vLLM's: with include_usage, usage so far in every chunk
    include_obfuscation: bool | None = None   # random padding against length side channels: not sent


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: OpenAI's {name, description, schema, strict}."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None   # nv always follows the schema


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's `structured_outputs` request field (exactly one constraint; checked by the engine's
    StructuredOutputsParams)."""

    model_config = ConfigDict(extra="forbid")
    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None


class SamplingRequest(BaseModel):
    """Fields that completions and chat share. Fields not declared here land in `model_extra` and
    are checked against request_fields.REQUEST_FIELDS (accepted at their defaults, else a 400)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """A declared field sent as null takes its default (OpenAI SDKs and proxies send nulls)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data

    model: str | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras
    top_k: int | None = None              # None / 0 / -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None   # token id (as a string, OpenAI's JSON) -> bias
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None    # per prompt token: its logprob and the top k
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_*
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None   # accepted; nv's backend is xgrammar

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Every streamed chunk carries its choice's usage so far (include_usage and continuous_usage_stats)."""
        return bool(self.include_usage and self.stream_options and self.stream_options.continuous_usage_stats)

    def structured_outputs_fields(self) -> list[tuple[str, dict[str, Any]]]:
        """Each request field that constrains the output, with its StructuredOutputsParams keyword
        arguments (an empty dict: response_format json_schema without a schema)."""
        found: list[tuple[str, dict[str, Any]]] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            found.append(("response_format", {"json_object": True}))
        elif fmt is not None and fmt.type == "json_schema":
            schema = fmt.json_schema.json_schema if fmt.json_schema is not None else None
            found.append(("response_format", {} if schema is None else {"json": schema}))
        if self.structured_outputs is not None:
            found.append(("structured_outputs", self.structured_outputs.model_dump(by_alias=True, exclude_none=True)))
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                          ("guided_grammar", "grammar")):
            value = getattr(self, name)
            if value is not None:
                found.append((name, {key: value}))
        return found


class CompletionRequest(SamplingRequest):
    # a string, a batch of strings, token ids, or a batch of token-id lists
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    add_special_tokens: bool = True


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")   # name, reasoning, ... go to the template as given
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None   # an assistant's calls
    tool_call_id: str | None = None            # a tool message: the call it answers


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    add_special_tokens: bool = False   # the template writes them
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None   # False: at most one tool call per answer


class TokenizeRequest(BaseModel):
    """POST /tokenize: a prompt, or chat messages rendered by the chat template (vLLM's shape)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None   # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    tokens: list[int]


# ---------------------------------------------------------------------------------------- responses

class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0   # prompt tokens whose KV came from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One entry of vLLM's prompt_logprobs: {token id as a string: PromptLogprob}."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's shape: null for the first prompt token, then one dict per prompt token
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class ResponseEnvelope(BaseModel):
    """The fields every completion / chat body and chunk carries, in OpenAI's order; subclasses narrow
    `object` and `choices` (pydantic keeps a redeclared field in its base position)."""

    id: str
    object: str
    created: int = Field(default_factory=now)
    model: str
    choices: list[Any]
    usage: UsageInfo | None = None


class CompletionResponse(ResponseEnvelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None


class OmitsNone(BaseModel):
    """A body whose fields named in `omit_if_none` are left out while None (OpenAI leaves them out)."""

    omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in self.omit_if_none}


class ChatResponseMessage(OmitsNone):
    omit_if_none = frozenset({"reasoning", "reasoning_content", "tool_calls"})
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None           # --reasoning-parser: the model's reasoning (vLLM's field)
    reasoning_content: str | None = None   # the same, under the older name
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(ResponseEnvelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prompt_logprobs: PromptLogprobs | None = None


class DeltaFunctionCall(OmitsNone):
    omit_if_none = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None   # the next fragment of the arguments text


class DeltaToolCall(OmitsNone):
    """A streamed tool call: the first delta of a call carries its id, type and name (arguments ""),
    later ones the next fragment of the arguments; `index` says which call."""

    omit_if_none = frozenset({"id", "type"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class DeltaMessage(OmitsNone):
    omit_if_none = frozenset({"reasoning", "reasoning_content", "tool_calls"})
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(ResponseEnvelope):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]


class CompletionChunk(CompletionResponse):
    """A streamed completion chunk: OpenAI gives it the same body as the full response."""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "nv"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def sse(chunk: BaseModel) -> str:
    """One server-sent event carrying `chunk` as JSON."""
    return f"data: {chunk.model_dump_json()}\n\n"


SSE_DONE = "data: [DONE]\n\n"
