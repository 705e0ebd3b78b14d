"""SpeculativeConfig: accepted spellings and clear errors."""
from __future__ import annotations

import pytest

from nv_engine.config.speculative_config import SpeculativeConfig


def test_from_dict_json_and_object():
    config = SpeculativeConfig.from_value({"method": "ngram", "num_speculative_tokens": 5,
                                           "prompt_lookup_min": 2, "prompt_lookup_max": 3})
    assert config == SpeculativeConfig(num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=3)
    assert SpeculativeConfig.from_value('{"method": "ngram"}') == SpeculativeConfig()
    assert SpeculativeConfig.from_value(config) is config
    assert SpeculativeConfig.from_value(None) is None


@pytest.mark.parametrize(("value", "message"), [
    ({"method": "draft_model"}, "not supported yet"),
    ({"method": "eagle"}, "not supported yet"),
    ({"method": "lookahead"}, "must be one of"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens must be an integer >= 1"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min .4. must be <="),
    ({"max_batch_size": -1}, "max_batch_size must be an integer >= 1"),
    ({"model": "x"}, r"unknown key\(s\) \['model'\]"),
    ("{not json", "not valid JSON"),
    ([1], "must be a dict"),
])
def test_errors(value, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_value(value)
