"""SpeculativeConfig: accepted spellings and clear errors."""
from __future__ import annotations

import pytest

from nv_engine.config.speculative_config import SpeculativeConfig


def test_from_dict_json_and_object():
    config = SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 5,
                                           "prompt_lookup_min": 2, "prompt_lookup_max": 3})
    assert config == SpeculativeConfig(num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=3)
    assert SpeculativeConfig.from_value('{"method": "ngram"}') == SpeculativeConfig()
    assert SpeculativeConfig().adaptive_draft_length                  # on unless switched off
    assert not SpeculativeConfig.from_value('{"adaptive_draft_length": false}').adaptive_draft_length
    assert SpeculativeConfig.from_value(config) is config
    assert SpeculativeConfig.from_value(None) is None


@pytest.mark.parametrize(("value", "message"), [
    ({"method": "draft_model"}, "needs \"model\""),
    ({"method": "ngram", "model": "/draft"}, "is for method 'draft_model'"),
    ({"method": "eagle"}, "not supported yet"),
    ({"model": "/draft", "draft_sampling": "top"}, "draft_sampling must be one of"),
    ({"method": "ngram", "draft_sampling": "sampled"}, "draft_sampling is for method 'draft_model'"),
    ({"method": "lookahead"}, "must be one of"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer >= 1"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min .4. must be <="),
    ({"max_batch_size": -1}, "max_batch_size must be an integer >= 1"),
    ({"adaptive_draft_length": "yes"}, "adaptive_draft_length must be true or false"),
    ({"adaptive_draft_length": 1}, "adaptive_draft_length must be true or false"),
    ({"draft_model": "x"}, r"unknown key\(s\) \['draft_model'\]"),
    ("{not json", "not valid JSON"),
    ([1], "must be a dict"),
])
def test_errors(value, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_value(value)


def test_draft_model_spellings():
    """vLLM's: method "draft_model" with a model, or a model alone (the method is inferred)."""
    explicit = SpeculativeConfig.from_value({"method": "draft_model", "model": "/draft", "num_speculative_tokens": 4})
    assert SpeculativeConfig.from_value('{"model": "/draft", "num_speculative_tokens": 4}') == explicit
    assert explicit is not None and explicit.uses_draft_model and explicit.method == "draft_model"
    assert SpeculativeConfig().method == "ngram" and not SpeculativeConfig().uses_draft_model
