"""Tool-call and reasoning parsers of the chat API, driven with known model text: the whole text
(a plain response) and the same text streamed in every split (a streamed response) must give the
same message; plus the request-level rules of tools / tool_choice (ChatOutputPlan)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from nv_engine.entrypoints.server.chat_output_parser import ChatOutputParser
from nv_engine.entrypoints.server.chat_output_plan import ChatOutputPlan
from nv_engine.entrypoints.server.chat_parsing_options import ChatParsingOptions
from nv_engine.entrypoints.server.errors import APIError
from nv_engine.entrypoints.server.protocol import ChatCompletionRequest
from nv_engine.entrypoints.server.reasoning.qwen3_reasoning_parser import Qwen3ReasoningParser
from nv_engine.entrypoints.server.tool_parsers.hermes_tool_parser import HermesToolParser
from nv_engine.entrypoints.server.tool_parsers.llama3_json_tool_parser import Llama3JsonToolParser
from nv_engine.entrypoints.server.tool_parsers.named_function_tool_parser import NamedFunctionToolParser
from nv_engine.entrypoints.server.tool_parsers.required_tool_parser import RequiredToolParser
from nv_engine.entrypoints.server.tool_protocol import ToolCall

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "now"}}]


def streamed(parser: ChatOutputParser, text: str, cuts: list[int]) -> SimpleNamespace:
    """The message a client assembles from the stream of `text` cut at `cuts` (OpenAI's rules:
    strings concatenate, tool calls merge by index)."""
    reasoning, content, calls = None, None, {}
    ends = [*cuts, len(text)]
    for n, end in enumerate(ends):
        for delta in parser.deltas(text[:end], final=n == len(ends) - 1):
            assert delta.reasoning == delta.reasoning_content
            if delta.reasoning is not None:
                reasoning = (reasoning or "") + delta.reasoning
            if delta.content is not None:
                content = (content or "") + delta.content
            for call in delta.tool_calls or ():
                if call.index not in calls:   # the first delta of a call: id, type, name, ""
                    assert call.id and call.id.startswith("call_") and call.type == "function"
                    assert call.function.name and call.function.arguments == ""
                    assert call.index == len(calls)
                    calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:
                    assert call.id is None and call.function.name is None
                    calls[call.index]["arguments"] += call.function.arguments
    return SimpleNamespace(reasoning=reasoning, content=content, calls=[calls[i] for i in sorted(calls)])


def check_plain_and_streamed(make_parser, text: str) -> SimpleNamespace:
    """The plain message; every split of the stream (one cut, and cuts at every character) agrees."""
    message = make_parser().message(text)
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or ()]
    splits = [list(range(1, len(text)))] + [[cut] for cut in range(len(text) + 1)]
    for cuts in splits:
        got = streamed(make_parser(), text, cuts)
        assert (got.reasoning or None) == (message.reasoning or None), cuts
        assert (got.content or "").strip() == (message.content or "").strip(), cuts
        if message.content is not None and message.content.strip():
            assert got.content == message.content, cuts
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in got.calls] == calls, cuts
    return SimpleNamespace(reasoning=message.reasoning, content=message.content, calls=calls)


def hermes() -> ChatOutputParser:
    return ChatOutputParser(tool_parser=HermesToolParser())


def test_hermes_content_and_calls():
    text = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, \\"FR\\"", '
            '"days": 3}}\n</tool_call>\n<tool_call>\n{"arguments": {}, "name": "get_time"}\n</tool_call>')
    got = check_plain_and_streamed(hermes, text)
    assert got.content == "Let me check. "
    assert got.calls == [{"name": "get_weather", "arguments": '{"city": "Paris, \\"FR\\"", "days": 3}'},
                         {"name": "get_time", "arguments": "{}"}]
    assert json.loads(got.calls[0]["arguments"]) == {"city": 'Paris, "FR"', "days": 3}
    message = hermes().message(text)
    assert hermes().finish_reason("stop", message) == "tool_calls"
    assert hermes().finish_reason("length", message) == "length"


def test_hermes_text_that_is_not_a_call_stays_content():
    for text in ["No tools needed: 1 < 2 and <tool is not a tag.", "ends with a partial tag <tool_ca",
                 "bad block <tool_call>not json</tool_call> after", "<tool_call>{\"x\": 1}</tool_call>"]:
        got = check_plain_and_streamed(hermes, text)
        assert got.content == text and got.calls == []
    only_call = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    got = check_plain_and_streamed(hermes, only_call)
    assert got.content is None and got.calls == [{"name": "get_time", "arguments": "{}"}]


def test_hermes_unfinished_call():
    got = check_plain_and_streamed(hermes, 'x <tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert got.calls == [{"name": "get_weather", "arguments": '{"city": "Pa'}]
    got = check_plain_and_streamed(hermes, 'x <tool_call>{"na')   # no name yet: the text is content
    assert got.content == 'x <tool_call>{"na' and got.calls == []


def llama3() -> ChatOutputParser:
    return ChatOutputParser(tool_parser=Llama3JsonToolParser())


def test_llama3_json_calls():
    text = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
            '{"name": "get_time", "arguments": {"tz": "UTC"}}')
    got = check_plain_and_streamed(llama3, text)
    assert got.content is None
    assert got.calls == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                         {"name": "get_time", "arguments": '{"tz": "UTC"}'}]
    got = check_plain_and_streamed(llama3, ' {"name": "get_time"}')
    assert got.calls == [{"name": "get_time", "arguments": "{}"}]


def test_llama3_json_plain_text_and_broken_calls_are_content():
    for text in ["The weather is fine.", "<|python", '{"parameters": {}}', '{"name": 3}', "{not json"]:
        got = check_plain_and_streamed(llama3, text)
        assert got.content == text and got.calls == []
    # calls, then text that is not a call: the calls, and the rest as content
    got = check_plain_and_streamed(llama3, '{"name": "get_time", "parameters": {}} and more')
    assert got.calls == [{"name": "get_time", "arguments": "{}"}] and got.content == " and more"
    got = check_plain_and_streamed(llama3, '{"name": "get_time", "parameters": {}}; {"parame')
    assert got.calls == [{"name": "get_time", "arguments": "{}"}] and got.content == '{"parame'
    # cut off inside the arguments (finish_reason "length"): the call as far as it got
    got = check_plain_and_streamed(llama3, '{"name": "get_time", "parameters": {"tz": ')
    assert got.calls == [{"name": "get_time", "arguments": '{"tz": '}]


def test_forced_calls_parsers_and_schema():
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]'
    got = check_plain_and_streamed(lambda: ChatOutputParser(tool_parser=RequiredToolParser()), text)
    assert got.calls == [{"name": "get_weather", "arguments": '{"city": "Rome"}'},
                         {"name": "get_time", "arguments": "{}"}]
    got = check_plain_and_streamed(lambda: ChatOutputParser(tool_parser=NamedFunctionToolParser("get_time")),
                                   ' {"tz": "UTC"} ')
    assert got.content is None and got.calls == [{"name": "get_time", "arguments": '{"tz": "UTC"}'}]

    plan = ChatOutputPlan(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                                                tool_choice="required"), ChatParsingOptions())
    schema = plan.json_schema
    assert schema is not None
    jsonschema.validate(json.loads(text), schema)
    for bad in ([], [{"name": "get_weather", "parameters": {"days": 1}}],
                [{"name": "other", "parameters": {}}], {"name": "get_time", "parameters": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    named = ChatOutputPlan(ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}), ChatParsingOptions())
    assert named.json_schema == WEATHER and named.forced


def test_parallel_tool_calls_false_keeps_one_call():
    """parallel_tool_calls=false: "required" forces exactly one call (the schema); "auto" keeps the first
    call the model wrote, plain and at every cut of the stream; "auto" without the flag keeps them all."""
    two = [{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]
    ask = [{"role": "user", "content": "hi"}]
    options = ChatParsingOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
    required = ChatOutputPlan(ChatCompletionRequest(messages=ask, tools=TOOLS, tool_choice="required",
                                                    parallel_tool_calls=False), options).json_schema
    assert required is not None
    jsonschema.validate(two[:1], required)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(two, required)
    text = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    for parallel, expected in ((False, 1), (None, 2), (True, 2)):
        plan = ChatOutputPlan(ChatCompletionRequest(messages=ask, tools=TOOLS, parallel_tool_calls=parallel),
                              options)
        got = check_plain_and_streamed(lambda plan=plan: plan.output_parser(""), text)
        assert [c["name"] for c in got.calls] == ["get_weather", "get_time"][:expected]


def qwen3(prompt_tail: str, tools: bool = False):
    return lambda: ChatOutputParser(reasoning_parser=Qwen3ReasoningParser(prompt_tail),
                                    tool_parser=HermesToolParser() if tools else None)


def test_qwen3_reasoning_split():
    got = check_plain_and_streamed(qwen3("<|im_start|>assistant\n"), "<think>\nSo 2+2=4.\n</think>\n\nIt is 4.")
    assert got.reasoning == "\nSo 2+2=4.\n" and got.content == "It is 4."
    # the template opened the block: the output starts inside it
    got = check_plain_and_streamed(qwen3("<|im_start|>assistant\n<think>\n"), "So 4.</think>\n\nIt is 4.")
    assert got.reasoning == "So 4." and got.content == "It is 4."
    # cut off while thinking: all reasoning
    got = check_plain_and_streamed(qwen3("assistant\n<think>\n"), "Still thinking </thi")
    assert got.reasoning == "Still thinking </thi" and not got.content
    # enable_thinking=False: the template closed an empty block; the output is all content
    got = check_plain_and_streamed(qwen3("assistant\n<think>\n\n</think>\n\n"), "It is 4. </think> x")
    assert got.reasoning is None and got.content == "It is 4. </think> x"
    # no block anywhere: content
    got = check_plain_and_streamed(qwen3("assistant\n"), "<thinking is fun")
    assert got.reasoning is None and got.content == "<thinking is fun"
    # reasoning, then a tool call read from the content only
    got = check_plain_and_streamed(qwen3("assistant\n", tools=True),
                                   '<think>use <tool_call> here</think>\n<tool_call>{"name": "get_time", '
                                   '"arguments": {}}</tool_call>')
    assert got.reasoning == "use <tool_call> here" and got.content is None
    assert got.calls == [{"name": "get_time", "arguments": "{}"}]


NO_FLAGS = ChatParsingOptions()


def plan(options: ChatParsingOptions = NO_FLAGS, **fields) -> ChatOutputPlan:
    return ChatOutputPlan(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields), options)


def test_tool_choice_rules():
    auto = ChatParsingOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
    for fields, param in [({"tools": TOOLS}, "tool_choice"), ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
                          ({"tool_choice": "required"}, "tool_choice"),
                          ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                           "tool_choice"),
                          ({"tools": [TOOLS[0], TOOLS[0]], "tool_choice": "required"}, "tools")]:
        with pytest.raises(APIError) as err:
            plan(**fields)
        assert err.value.status == 400 and err.value.param == param, fields
    assert isinstance(plan(auto, tools=TOOLS).output_parser("").tool_parser, HermesToolParser)
    none = plan(auto, tools=TOOLS, tool_choice="none")
    assert none.json_schema is None and none.output_parser("").tool_parser is None
    assert plan(tools=[]).tool_choice == "none"
    with pytest.raises(ValueError, match="tool-call-parser"):
        ChatParsingOptions(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="reasoning_parser"):
        ChatParsingOptions(reasoning_parser="nope")


def test_history_tool_calls_reach_the_template_as_objects():
    call = ToolCall.model_validate({"id": "call_1", "type": "function",
                                    "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}})
    assert call.template_dict()["function"]["arguments"] == {"tz": "UTC"}
    bad = ToolCall.model_validate({"function": {"name": "get_time", "arguments": "{tz"}})
    with pytest.raises(ValueError, match="not valid JSON"):
        bad.template_dict()


def test_the_openai_client_assembles_the_streamed_calls():
    """The chunks the server sends for a streamed output, fed to the openai package's own stream
    accumulation: it rebuilds the same message as the plain response."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk as OpenAIChunk

    from nv_engine.entrypoints.server.protocol import ChatCompletionChunk, ChatStreamChoice, DeltaMessage

    text = ('<think>weather first</think>\n\nChecking. <tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    parser = qwen3("assistant\n", tools=True)()
    chunks = [ChatCompletionChunk(id="c", model="m", choices=[
        ChatStreamChoice(index=0, delta=DeltaMessage(role="assistant", content=""))])]
    for end in range(3, len(text) + 3, 3):
        final = end >= len(text)
        for delta in parser.deltas(text[:end], final=final):
            chunks.append(ChatCompletionChunk(id="c", model="m", choices=[ChatStreamChoice(index=0, delta=delta)]))
        if final:
            break
    chunks.append(ChatCompletionChunk(id="c", model="m", choices=[ChatStreamChoice(
        index=0, delta=DeltaMessage(), finish_reason=parser.finish_reason("stop"))]))
    state = ChatCompletionStreamState(input_tools=TOOLS)
    for chunk in chunks:
        state.handle_chunk(OpenAIChunk.model_validate_json(chunk.model_dump_json()))
    got = state.get_final_completion().choices[0]
    plain = qwen3("assistant\n", tools=True)().message(text)
    assert got.finish_reason == "tool_calls" and got.message.content == plain.content == "Checking. "
    assert [(c.function.name, c.function.arguments) for c in got.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in plain.tool_calls or ()] == \
        [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]
    assert all(c.id.startswith("call_") for c in got.message.tool_calls)
