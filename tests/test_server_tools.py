"""Tool calls and reasoning through `nv serve` on CPU (tiny random Qwen3, the official openai client,
one server for the module started with a Qwen3-style template, --enable-auto-tool-choice
--tool-call-parser hermes --reasoning-parser qwen3): forced calls (tool_choice "required" and a named
function) whose arguments fit the declared parameters, plain and streamed; the tools and a two-turn
exchange rendered by the fixture templates (server template, HF and the request-template sandbox);
the reasoning split on real generations. The parsers themselves are tested on known text in
packages/nv-engine/tests/test_tool_parsers.py."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
import jsonschema  # noqa: E402

from nv_engine.entrypoints.server.chat_template_sandbox import ChatTemplateSandbox  # noqa: E402
from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.limits import ServerLimits  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_cpu_thread")
MODEL = "tiny"
TEMPLATES = Path(__file__).parent / "fixtures" / "chat_templates"
# bounded arguments (enums, booleans, no extra keys): a random model under the grammar finishes them
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "metric"],
           "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}}}
CLOCK = {"type": "object", "additionalProperties": False, "required": ["utc"],
         "properties": {"utc": {"type": "boolean"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather now", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}}]
PARAMETERS = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
EXCHANGE = [*ASK,
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris", "metric": true}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")   # no tools section


@pytest.fixture(scope="module")
def server(make_tiny_checkpoint):
    model_dir = make_tiny_checkpoint("qwen3", max_position_embeddings=2048)   # the tools section is long
    engine = create_engine(str(model_dir), device="cpu", dtype="float32", max_model_len=2048,
                           max_num_seqs=16, num_gpu_blocks_override=384, block_size=16)
    args = SimpleNamespace(model=str(model_dir), served_model_name=[MODEL], api_key=None, max_n=4,
                           chat_template=str(TEMPLATES / "qwen3_tools.jinja"), trust_request_chat_template=True,
                           enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url:
        yield SimpleNamespace(url=url, tokenizer=engine.tokenizer)
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def rendered(http, **body) -> str:
    r = http.post("/tokenize", json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return http.post("/detokenize", json={"model": MODEL, "tokens": r.json()["tokens"]}).json()["prompt"]


def check_calls(calls, names: set[str]) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])


def test_two_turn_exchange_renders_and_answers(http, client, server):
    text = rendered(http, messages=EXCHANGE, tools=TOOLS)
    assert json.dumps(TOOLS[0]) in text                                   # the tools section
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "metric": true}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    out = client.chat.completions.create(model=MODEL, messages=EXCHANGE, tools=TOOLS, tool_choice="none",
                                         max_tokens=6, temperature=0)
    assert out.choices[0].message.tool_calls is None and isinstance(out.choices[0].message.content, str)
    assert out.usage.prompt_tokens == len(server.tokenizer.encode(text, add_special_tokens=False))
    bad = [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                       "function": {"name": "get_weather", "arguments": "{oops"}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=bad, max_tokens=2)
    assert err.value.body["param"] == "messages.1.tool_calls.0.function.arguments"


def test_fixture_templates_render_alike_in_hf_and_the_sandbox(http, server):
    hf_messages = [m if m["role"] != "assistant" else {**m, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in m["tool_calls"]]} for m in EXCHANGE]
    expected = {"qwen25_hermes_tools.jinja": '<tool_call>\n{"name": "get_weather", "arguments": ',
                "llama3_json_tools.jinja": '{"name": "get_weather", "parameters": {"city": "Paris", "metric": true}}'}
    for name, call_text in expected.items():
        template = (TEMPLATES / name).read_text()
        hf = server.tokenizer.apply_chat_template(hf_messages, tools=TOOLS, chat_template=template, tokenize=False,
                                                  add_generation_prompt=True)
        assert call_text in hf and "sunny, 21 C" in hf and '"name": "get_time"' in hf, name
        assert rendered(http, messages=EXCHANGE, tools=TOOLS, chat_template=template) == hf, name
    assert "<tool_response>" in rendered(http, messages=EXCHANGE, tools=TOOLS,
                                         chat_template=(TEMPLATES / "qwen25_hermes_tools.jinja").read_text())
    import asyncio

    sandboxed = asyncio.run(ChatTemplateSandbox(ServerLimits()).render(
        (TEMPLATES / "qwen3_tools.jinja").read_text(), hf_messages, special_tokens={}, add_generation_prompt=True,
        continue_final_message=False, kwargs={"tools": TOOLS, "enable_thinking": False}, param="chat_template"))
    assert sandboxed == server.tokenizer.apply_chat_template(
        hf_messages, tools=TOOLS, chat_template=(TEMPLATES / "qwen3_tools.jinja").read_text(), tokenize=False,
        add_generation_prompt=True, enable_thinking=False)


def test_reasoning_split_on_real_generations(client, http):
    def greedy_text(messages, **body) -> str:   # the same prompt through /v1/completions: the raw output
        ids = http.post("/tokenize", json={"model": MODEL, "messages": messages, **body}).json()["tokens"]
        return client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0).choices[0].text

    def both(messages, **body):
        plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                               extra_body=body).choices[0].message
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                    extra_body=body, stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                assert getattr(delta, "reasoning", None) == getattr(delta, "reasoning_content", None)
                reasoning += getattr(delta, "reasoning", None) or ""
                content += delta.content or ""
        assert getattr(plain, "reasoning", None) == getattr(plain, "reasoning_content", None)
        return plain, reasoning, content

    # enable_thinking=false: the template closes an empty think block; the whole output is content
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    plain, reasoning, content = both(ASK, **off)
    assert getattr(plain, "reasoning", None) is None and reasoning == ""
    assert plain.content == content == greedy_text(ASK, **off)
    # the prompt opens the block (a continued assistant turn): the output up to </think> is reasoning
    thinking = [*ASK, {"role": "assistant", "content": "<think>\nFirst,"}]
    cont = {"continue_final_message": True, "add_generation_prompt": False}
    raw = greedy_text(thinking, **cont)
    plain, reasoning, content = both(thinking, **cont)
    if "</think>" not in raw:
        assert plain.reasoning == reasoning == raw and not plain.content and content == ""
    else:
        assert plain.reasoning == reasoning == raw[:raw.index("</think>")]


def test_tool_choice_required_gives_valid_calls_plain_and_streamed(client):
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    choice = plain.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    check_calls(choice.message.tool_calls, {"get_weather", "get_time"})
    with client.chat.completions.stream(**kwargs) as stream:   # the openai client assembles the deltas
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls
    check_calls(streamed, {"get_weather", "get_time"})
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert final.choices[0].finish_reason == "tool_calls"


def test_named_function_works_on_a_template_without_tools(client):
    named = {"type": "function", "function": {"name": "get_time"}}
    kwargs = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0,
                  extra_body={"chat_template": CHATML})
    plain = client.chat.completions.create(**kwargs)
    assert plain.choices[0].finish_reason == "tool_calls"
    check_calls(plain.choices[0].message.tool_calls, {"get_time"})
    assert len(plain.choices[0].message.tool_calls) == 1
    chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
    first = next(c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls)
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == "get_time"
    assert first.function.arguments == ""
    arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                        for c in chunks if c.choices[0].delta.tool_calls)
    assert arguments == plain.choices[0].message.tool_calls[0].function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
