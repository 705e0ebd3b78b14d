"""logit_bias, allowed_token_ids and bad_words through the whole engine (LLM.generate on CPU)."""
from __future__ import annotations

import pytest

from nv_engine import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Hello, world! How are", "1 2 3 4"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir), device="cpu", dtype="float32", max_model_len=128)


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, **kw})


def tokens(llm, params, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def baseline(llm) -> list[list[int]]:
    return tokens(llm, greedy())


def test_logit_bias_of_100_makes_greedy_repeat_that_token(llm, baseline):
    target = next(t for t in range(5, 100) if all(t not in out for out in baseline))
    for params in (greedy(logit_bias={target: 100}),
                   greedy(logit_bias={target: 100}, temperature=0.8, seed=1)):
        assert tokens(llm, params) == [[target] * MAX_TOKENS] * len(PROMPTS)
    # a -100 bias removes the greedy choice: the first token changes
    banned = tokens(llm, greedy(logit_bias={out[0]: -100 for out in baseline}))
    assert all(b[0] != out[0] for b, out in zip(banned, baseline, strict=True))


def test_allowed_token_ids_limit_what_is_sampled(llm, baseline):
    allowed = [3, 7, 11, 13]
    assert any(t not in allowed for out in baseline for t in out)
    for params in (greedy(allowed_token_ids=allowed), SamplingParams(
            max_tokens=MAX_TOKENS, ignore_eos=True, seed=0, allowed_token_ids=allowed)):
        outs = tokens(llm, params)
        assert all(t in allowed for out in outs for t in out), outs


def test_bad_words_never_complete(llm, baseline):
    tok = llm.get_tokenizer()
    # a token x whose pair "xx" tokenizes back to [x, x]; a +100 bias makes the model write x x x ...
    x = next(t for t in range(5, 300) if tok.encode(tok.decode([t, t]), add_special_tokens=False) == [t, t])
    word = tok.decode([x, x])
    forced = greedy(logit_bias={x: 100})
    assert tokens(llm, forced, PROMPTS[:1]) == [[x] * MAX_TOKENS]
    out = tokens(llm, greedy(logit_bias={x: 100}, bad_words=[word]), PROMPTS[:1])[0]
    assert out[0::2] == [x] * (MAX_TOKENS // 2) and x not in out[1::2], out   # x never twice in a row
    # a one-token word is never sampled
    first = tok.decode(baseline[1][:1])
    assert tok.encode(first, add_special_tokens=False) == baseline[1][:1]
    out = tokens(llm, greedy(bad_words=[first]), PROMPTS[1:2])[0]
    assert baseline[1][0] not in out


def test_batch_mixing_options_leaves_other_requests_alone(llm, baseline):
    prompts = PROMPTS + PROMPTS
    params = [greedy(), greedy(logit_bias={9: 100}), greedy(allowed_token_ids=[3, 4]),
              greedy(bad_words=["zz"]), greedy(), greedy(logit_bias={baseline[2][0]: -5.0})]
    outs = tokens(llm, params, prompts)
    assert outs[0] == baseline[0] and outs[4] == baseline[1]
    assert outs[1] == [9] * MAX_TOKENS
    assert set(outs[2]) <= {3, 4}


def test_bad_ids_are_a_value_error_and_the_engine_goes_on(llm, baseline):
    vocab = llm.llm_engine.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(PROMPTS[0], greedy(logit_bias={vocab: 1}), use_tqdm=False)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        llm.generate(PROMPTS[0], greedy(allowed_token_ids=[vocab + 5]), use_tqdm=False)
    assert tokens(llm, greedy(), PROMPTS[:1]) == baseline[:1]


def test_chat_template_kwargs_reach_the_template(llm):
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = llm.chat([{"role": "user", "content": "hello"}], greedy(max_tokens=1), use_tqdm=False,
                   chat_template=template, chat_template_kwargs={"greeting": "Hi, "})
    assert out[0].prompt == "Hi, hello"
