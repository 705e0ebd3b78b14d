"""The fused ops mode (nv_kernels.fused_dispatch): NV_FUSED_OPS read at the first use, not at import, and kept;
`set_fused_ops` wins over it and with None forgets the setting; a bad value raises, naming the variable."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from nv_kernels import fused_dispatch, fused_ops, get_fused_ops, set_fused_ops


@pytest.fixture()
def unset() -> Iterator[None]:
    """The mode forgotten (the next use reads NV_FUSED_OPS); the setting is put back after the test."""
    previous = set_fused_ops(None)
    yield
    set_fused_ops(previous)


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("on", "on"), ("OFF", "off"), ("", "auto")])
def test_mode_read_at_the_first_use_and_kept(unset: None, monkeypatch: pytest.MonkeyPatch, value: str,
                                             expected: str) -> None:
    monkeypatch.setenv("NV_FUSED_OPS", value)
    assert get_fused_ops() == expected
    monkeypatch.setenv("NV_FUSED_OPS", "sometimes")        # kept: not read again
    assert get_fused_ops() == expected
    assert set_fused_ops(None) == expected                  # forgotten: the next use reads it again
    with pytest.raises(ValueError, match="NV_FUSED_OPS='sometimes'"):
        get_fused_ops()


def test_the_dispatch_reads_the_mode_lazily(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("NV_FUSED_OPS", "on")
    x = torch.ones(2)
    assert fused_dispatch.fused_ops_enabled(x) is (fused_dispatch._triton is not None)
    set_fused_ops(None)
    monkeypatch.setenv("NV_FUSED_OPS", "bad")
    with pytest.raises(ValueError, match="NV_FUSED_OPS"):
        fused_dispatch.fused_ops_enabled(x)


def test_a_setting_wins_over_the_environment(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_FUSED_OPS", "bad")
    assert set_fused_ops("off") is None                     # nothing read yet, and nothing read now
    assert get_fused_ops() == "off"
    with fused_ops("on"):
        assert get_fused_ops() == "on"
    assert get_fused_ops() == "off"
    with pytest.raises(ValueError, match="fused ops mode"):
        set_fused_ops("sometimes")
