"""`nv serve` request fields on CPU (tiny random Qwen3, one server for the module): every field of the
openai package's completion / chat request types is accepted absent, null or at its default, and a
non-default value takes effect or gets a 400 naming it; logit_bias, allowed_token_ids, bad_words;
/tokenize, /detokenize, /version, /ping; unknown model -> 404; CORS; cached_tokens."""
from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from openai.types import completion_create_params  # noqa: E402
from openai.types.chat import completion_create_params as chat_create_params  # noqa: E402

from nv_engine.entrypoints.server.cli import (  # noqa: E402
    build_app_for_engine,
    create_engine,
    load_chat_template,
)
from nv_engine.entrypoints.server.request_fields import REQUEST_FIELDS, Treatment  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

MODEL = "tiny"
ORIGIN = "https://app.example"
MAX_TOKENS = 4
PROMPT = "The quick brown fox"
CHAT = [{"role": "user", "content": "Hello, world! How are you today?"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}]
ENDPOINTS = {
    "completions": ("/v1/completions", completion_create_params, {"prompt": PROMPT}),
    "chat": ("/v1/chat/completions", chat_create_params, {"messages": CHAT}),
}


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path):
    engine = create_engine(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_model_len=256,
                           max_num_seqs=16, num_gpu_blocks_override=256, block_size=16)
    args = SimpleNamespace(model=str(tiny_qwen3_dir), served_model_name=[MODEL], api_key=None,
                           max_n=4, allowed_origins=[ORIGIN], allowed_methods=["GET", "POST"],
                           allowed_headers=["*"], allow_credentials=False, root_path="",
                           chat_template=None)
    app = build_app_for_engine(engine, args)
    with serve_in_thread(app) as url:
        yield SimpleNamespace(url=url, tokenizer=engine.tokenizer)
    engine.shutdown()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def base_body(endpoint: str) -> dict:
    return {"model": MODEL, **ENDPOINTS[endpoint][2], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}


def text_of(body: dict) -> str:
    choice = body["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def openai_fields(endpoint: str) -> list[str]:
    return list(typing.get_type_hints(ENDPOINTS[endpoint][1].CompletionCreateParamsBase))


# OpenAI's defaults of the fields that have one (others default to null)
DEFAULTS = {"n": 1, "echo": False, "best_of": 1, "frequency_penalty": 0, "presence_penalty": 0, "temperature": 1,
                "top_p": 1, "stream": False, "logit_bias": {}, "stop": [], "user": "someone", "store": False,
                "parallel_tool_calls": True, "tool_choice": "none", "function_call": "none", "tools": [],
                "functions": [], "response_format": {"type": "text"}, "modalities": ["text"],
                "service_tier": "auto", "metadata": {}, "suffix": "", "model": MODEL}
# Non-default values of the fields nv does not implement (each must be a 400 naming the field) ...
REFUSED = {"best_of": 3, "suffix": " the end", "audio": {"voice": "alloy", "format": "wav"},
               "function_call": "auto", "functions": [{"name": "f", "parameters": {}}],
               "modalities": ["text", "audio"], "moderation": {"model": "m"},
               "prediction": {"type": "content", "content": "x"}, "prompt_cache_options": {"ttl": 5},
               "prompt_cache_retention": "24h", "reasoning_effort": "low",
               "service_tier": "flex", "store": True,
               "verbosity": "low", "web_search_options": {}}
# ... and of the ones it ignores (bookkeeping for the caller)
IGNORED = {"user": "someone", "metadata": {"k": "v"}, "prompt_cache_key": "key", "safety_identifier": "id"}


def one_call_then_end(body: dict, post: typing.Callable, overrides: dict) -> bool:
    """The answer is one forced call that ends the output, where the same request with parallel calls
    allowed is not."""
    choice = body["choices"][0]
    allowed = post({k: v for k, v in overrides.items() if k != "parallel_tool_calls"}).json()["choices"][0]
    return (choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) == 1
            and (allowed["finish_reason"], len(allowed["message"]["tool_calls"] or [])) != ("tool_calls", 1))


def honoured_cases(endpoint: str, server, post) -> dict[str, tuple[dict, typing.Callable]]:
    """field -> (body overrides, check(response) -> bool) showing that a non-default value acts."""
    baseline = post({}).json()
    base_text = text_of(baseline)
    tok = server.tokenizer
    x = 42

    def sampled(seed: int, **kw) -> str:
        return text_of(post({"temperature": 1.5, "seed": seed, **kw}).json())

    cases = {
        "model": ({"model": MODEL}, lambda r: r.json()["model"] == MODEL),
        "n": ({"n": 2, "temperature": 1.0, "seed": 1}, lambda r: len(r.json()["choices"]) == 2),
        "max_tokens": ({"max_tokens": 2}, lambda r: r.json()["usage"]["completion_tokens"] == 2),
        "temperature": ({"temperature": 1.5, "seed": 3}, lambda r: text_of(r.json()) != base_text),
        "seed": ({"temperature": 1.5, "seed": 3},
                 lambda r: text_of(r.json()) == sampled(3) != sampled(4)),
        "top_p": ({"temperature": 1.5, "seed": 3, "top_p": 1e-6}, lambda r: text_of(r.json()) == base_text),
        "frequency_penalty": ({"frequency_penalty": 2.0}, lambda r: text_of(r.json()) != base_text),
        "presence_penalty": ({"presence_penalty": 2.0}, lambda r: text_of(r.json()) != base_text),
        "logit_bias": ({"logit_bias": {str(x): 100}},
                       lambda r: text_of(r.json()) == tok.decode([x] * MAX_TOKENS)),
        "stop": ({"stop": [base_text[1:3]]}, lambda r: r.json()["choices"][0]["finish_reason"] == "stop"),
        "stream": ({"stream": True}, lambda r: r.text.rstrip().endswith("data: [DONE]")),
        "stream_options": ({"stream": True, "stream_options": {"include_usage": True}},
                           lambda r: f'"completion_tokens":{MAX_TOKENS}' in r.text),
        "response_format": ({"response_format": {"type": "json_object"}},
                            lambda r: text_of(r.json()).startswith("{") and not base_text.startswith("{")),
    }
    if endpoint == "completions":
        cases.update({
            "echo": ({"echo": True}, lambda r: text_of(r.json()) == PROMPT + base_text),
            "logprobs": ({"logprobs": 2}, lambda r: all(
                len(top) == 2 for top in r.json()["choices"][0]["logprobs"]["top_logprobs"])),
        })
    else:
        comma = tok.encode(",", add_special_tokens=False)
        one_call = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 120, "parallel_tool_calls": False,
                    "logit_bias": {str(comma[0]): 30}}
        cases.update({
            "max_completion_tokens": ({"max_completion_tokens": 2},
                                      lambda r: r.json()["usage"]["completion_tokens"] == 2),
            "logprobs": ({"logprobs": True}, lambda r: len(
                r.json()["choices"][0]["logprobs"]["content"]) == MAX_TOKENS),
            "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, lambda r: all(
                len(t["top_logprobs"]) == 2 for t in r.json()["choices"][0]["logprobs"]["content"])),
            # forced calls (structured outputs): a named function, and tool_choice "required"
            "tools": ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}},
                       "max_tokens": 40},
                      lambda r: r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"),
            "tool_choice": ({"tools": TOOLS, "tool_choice": "required", "max_tokens": 40},
                            lambda r: r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"),
            # "required" writes one call and ends, where without the flag a bias towards "," makes more calls
            "parallel_tool_calls": (one_call, lambda r: one_call_then_end(r.json(), post, one_call)),
        })
    return cases


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_every_openai_field_is_honoured_or_refused(endpoint, server, http):
    path = ENDPOINTS[endpoint][0]

    def post(overrides: dict) -> httpx.Response:
        return http.post(path, json={**base_body(endpoint), **overrides})

    cases = honoured_cases(endpoint, server, post)
    required = set(ENDPOINTS[endpoint][2])
    for name in openai_fields(endpoint):
        field = REQUEST_FIELDS.get(endpoint, name)
        assert field is not None, f"{endpoint}: the openai field {name!r} is not in REQUEST_FIELDS"
        if name not in required:     # null and the default are accepted
            for value in (None, DEFAULTS.get(name)):
                r = post({name: value})
                assert r.status_code == 200, (name, value, r.text)
        if field.treatment is Treatment.HONOURED:
            if name in required:
                continue
            overrides, check = cases[name]
            r = post(overrides)
            assert r.status_code == 200 and check(r), (name, overrides, r.text)
        elif field.treatment is Treatment.IGNORED:
            assert post({name: IGNORED[name]}).status_code == 200, name
        else:
            r = post({name: REFUSED[name]})
            assert r.status_code == 400, (name, r.text)
            assert r.json()["error"]["param"] == name, r.text


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_unimplemented_vllm_fields_and_unknown_names_are_refused(endpoint, http):
    path = ENDPOINTS[endpoint][0]
    cases = [("spaces_between_special_tokens", False), ("tool_choicez", "none"), ("frobnicate", 1),
             ("guided_whitespace_pattern", " *")]
    for name, value in cases:
        r = http.post(path, json={**base_body(endpoint), name: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, r.text)
        assert name in r.json()["error"]["message"]
    for name, value in [("guided_json", None), ("spaces_between_special_tokens", True),
                        ("prompt_logprobs", None)]:
        assert http.post(path, json={**base_body(endpoint), name: value}).status_code == 200, name


def test_tool_choice_auto_needs_the_server_flags(http):
    """As vLLM: tool_choice "auto" (the default once tools are sent) needs --enable-auto-tool-choice and
    --tool-call-parser; this server has neither."""
    for extra in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "auto"}):
        r = http.post("/v1/chat/completions", json={**base_body("chat"), **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert "--enable-auto-tool-choice" in r.json()["error"]["message"]


def check_prompt_logprobs(entries: list, prompt_ids: list[int], k: int) -> None:
    """vLLM's shape: null, then per prompt token {token id: {logprob, rank, decoded_token}} holding
    the token itself and the top k."""
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for entry, token in zip(entries[1:], prompt_ids[1:], strict=True):
        assert str(token) in entry
        assert {v["rank"] for t, v in entry.items() if t != str(token)} <= set(range(1, k + 1))
        assert set(range(1, k + 1)) <= {v["rank"] for v in entry.values()}
        assert len(entry) in (k, k + 1)
        best = max(v["logprob"] for v in entry.values())
        assert entry[str(token)]["logprob"] <= best <= 0.0
        assert entry[str(token)]["rank"] >= 1
        assert all(isinstance(v["decoded_token"], str) for v in entry.values())


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_prompt_logprobs_field(endpoint, server, http):
    path = ENDPOINTS[endpoint][0]
    r = http.post(path, json={**base_body(endpoint), "prompt_logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    if endpoint == "completions":
        prompt_ids = server.tokenizer.encode(PROMPT)
        entries = body["choices"][0]["prompt_logprobs"]
    else:
        prompt_ids = http.post("/tokenize", json={"model": MODEL, "messages": CHAT}).json()["tokens"]
        entries = body["prompt_logprobs"]
    check_prompt_logprobs(entries, prompt_ids, 2)
    assert len(body["choices"][0]["text" if endpoint == "completions" else "message"]) > 0
    plain = http.post(path, json=base_body(endpoint)).json()
    assert text_of(plain) == text_of(body)          # same greedy completion either way
    too_many = http.post(path, json={**base_body(endpoint), "prompt_logprobs": 21})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt_logprobs"


def test_prompt_logprobs_stream_on_the_first_completion_chunk(server, http):
    body = {**base_body("completions"), "prompt_logprobs": 0, "stream": True}
    chunks = [json.loads(line[len("data: "):]) for line in http.post("/v1/completions", json=body).text.splitlines()
              if line.startswith("data: {")]
    carried = [c["choices"][0]["prompt_logprobs"] for c in chunks if c["choices"]]
    prompt_ids = server.tokenizer.encode(PROMPT)
    check_prompt_logprobs(carried[0], prompt_ids, 0)
    assert all(entry is None for entry in carried[1:])


def test_logit_bias_allowed_token_ids_and_bad_words_through_the_client(client, server):
    tok = server.tokenizer

    def token_strings(**kw) -> list[str]:   # the sampled tokens, one decoded string each
        extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, logprobs=0,
                                        extra_body=extra, **{"temperature": 0, **kw})
        return out.choices[0].logprobs.tokens

    plain = token_strings()
    target = next(t for t in range(5, 300) if tok.decode([t]) not in plain
                  and tok.encode(tok.decode([t] * 2), add_special_tokens=False) == [t, t])
    x = tok.decode([target])
    biased = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                            logit_bias={str(target): 100}, extra_body={"ignore_eos": True})
    assert biased.choices[0].message.content == x * 8
    assert token_strings(logit_bias={str(target): 100}) == [x] * 8
    # bad_words "xx" with x favoured by +100: x never follows x
    out = token_strings(logit_bias={str(target): 100}, extra_body={"bad_words": [x + x]})
    assert out[0::2] == [x] * 4 and x not in out[1::2], out
    allowed = [3, 7, 11]
    allowed_strings = {tok.decode([t]) for t in allowed}
    assert not set(plain) <= allowed_strings
    out = token_strings(temperature=0.9, seed=0, extra_body={"allowed_token_ids": allowed})
    assert set(out) <= allowed_strings, out
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, logit_bias={"10000000": 5})
    assert err.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, logit_bias={"5": 101})
    assert err.value.body["param"] == "logit_bias"


def test_tokenize_detokenize_version_ping(http, server):
    tok = server.tokenizer
    r = http.post("/tokenize", json={"model": MODEL, "prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(PROMPT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 256
    r = http.post("/tokenize", json={"messages": CHAT})
    expected = tok.encode(tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)
    assert r.status_code == 200 and r.json()["tokens"] == expected, r.text
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    r = http.post("/tokenize", json={"messages": CHAT, "chat_template": template})
    # a request's own template is refused unless the server trusts request templates
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template", r.text
    r = http.post("/detokenize", json={"model": MODEL, "tokens": body["tokens"]})
    assert r.status_code == 200 and r.json() == {"prompt": tok.decode(body["tokens"])}
    assert r.json()["prompt"] == PROMPT
    for path, payload in (("/tokenize", {}), ("/tokenize", {"prompt": "a", "messages": CHAT}),
                          ("/detokenize", {"tokens": [10 ** 7]}), ("/tokenize", {"prompt": "a", "x": 1})):
        assert http.post(path, json=payload).status_code == 400, (path, payload)
    from nv_engine import __version__
    assert http.get("/version").json() == {"version": __version__}
    assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200


def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    for path in ("/v1/chat/completions", "/tokenize"):
        r = http.post(path, json={"model": "nope", "messages": CHAT})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_cors_preflight(http):
    headers = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "content-type"}
    r = http.options("/v1/completions", headers=headers)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    r = http.options("/v1/completions", headers={**headers, "Origin": "https://other.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


def test_cached_tokens_on_a_repeated_prompt(client):
    prompt = "Paged attention stores keys and values in fixed-size blocks. " * 4
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens > 32
    assert again.usage.prompt_tokens_details.cached_tokens >= 32
    chat = [{"role": "user", "content": prompt}]
    client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)
    again = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= 32


def test_chat_template_flag_takes_a_file_or_a_template(tmp_path):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(template)
    assert load_chat_template(str(path)) == template == load_chat_template(template)
    assert load_chat_template(None) is None
    with pytest.raises(SystemExit, match="chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"))


# ---- structured outputs: response_format, structured_outputs, guided_* ------------------------------
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_response_format_json_schema_plain_and_streamed(client):
    jsonschema = pytest.importorskip("jsonschema")
    kwargs = dict(model=MODEL, messages=CHAT, max_tokens=96, temperature=0, response_format=JSON_SCHEMA_FORMAT)
    reply = client.chat.completions.create(**kwargs)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    # xgrammar's JSON strings may hold raw control characters: parse leniently, validate strictly
    jsonschema.validate(json.loads(choice.message.content, strict=False), PERSON)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_structured_outputs_and_guided_fields(client):
    choices = ["red", "green", "blue"]
    chat = dict(model=MODEL, messages=CHAT, max_tokens=16, temperature=1.0)
    for seed in range(3):
        reply = client.chat.completions.create(seed=seed, extra_body={"guided_choice": choices}, **chat)
        assert reply.choices[0].message.content in choices and reply.choices[0].finish_reason == "stop"
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}})
    assert re.fullmatch("[a-z]{3}-[0-9]{2}", reply.choices[0].text)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                      extra_body={"guided_grammar": 'root ::= "ab" | "cd"',
                                                  "guided_decoding_backend": "xgrammar"})
    assert reply.choices[0].text in ("ab", "cd")


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
                                                                                            "properties": 3}}}},
     "structured_outputs"),
    ({"guided_regex": "a(b"}, "structured_outputs"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
])
def test_bad_structured_outputs_get_400(http, body, param):
    for endpoint in ("completions", "chat"):
        r = http.post(ENDPOINTS[endpoint][0], json={**base_body(endpoint), **body})
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"].startswith(param) and error["message"], (body, r.text)
    assert http.post("/v1/completions", json=base_body("completions")).status_code == 200
