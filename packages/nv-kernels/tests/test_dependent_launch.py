"""The switch for programmatic dependent launch: which launches get it, and NV_PDL read at the first launch."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from nv_kernels import dependent_launch

CUDA = torch.device("cuda", 0)


@pytest.fixture()
def unset(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A device that supports PDL, and the module's setting forgotten (the next launch reads NV_PDL); the setting
    is put back after the test."""
    monkeypatch.setattr(dependent_launch, "_device_supports", lambda device: True)
    previous = dependent_launch.set_dependent_launch(None)
    yield
    dependent_launch.set_dependent_launch(previous)


def test_off_the_gpu_launches_stay_serial() -> None:
    assert dependent_launch.launch_options(torch.device("cpu"), 1) == {"USE_PDL": False}


def test_one_row_only_by_default() -> None:
    assert dependent_launch.MAX_TOKENS == 1    # 16 rows measured slower with PDL


def test_only_launches_up_to_max_tokens_on_a_supporting_device(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dependent_launch, "MAX_TOKENS", 4)
    dependent_launch.set_dependent_launch(True)
    assert dependent_launch.launch_options(CUDA, 1) == {"USE_PDL": True, "launch_pdl": True}
    assert dependent_launch.launch_options(CUDA, 4)["USE_PDL"]
    assert dependent_launch.launch_options(CUDA, 5) == {"USE_PDL": False}
    assert dependent_launch.set_dependent_launch(False) is True
    assert dependent_launch.launch_options(CUDA, 1) == {"USE_PDL": False}


@pytest.mark.parametrize("value,expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_environment_switch_read_at_the_first_launch(unset: None, monkeypatch: pytest.MonkeyPatch, value: str,
                                                     expected: bool) -> None:
    monkeypatch.setenv("NV_PDL", value)
    assert dependent_launch.dependent_launch_enabled(CUDA, 1) is expected
    monkeypatch.setenv("NV_PDL", "0" if expected else "1")       # read once, then kept
    assert dependent_launch.dependent_launch_enabled(CUDA, 1) is expected
    assert dependent_launch.set_dependent_launch(None) is expected  # forgotten: the next launch reads it again
    assert dependent_launch.dependent_launch_enabled(CUDA, 1) is not expected


def test_a_setting_wins_over_the_environment(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_PDL", "maybe")
    assert dependent_launch.set_dependent_launch(False) is None   # nothing read yet, and nothing read now
    assert dependent_launch.dependent_launch_enabled(CUDA, 1) is False


def test_environment_switch_rejects_other_values(unset: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_PDL", "maybe")
    with pytest.raises(ValueError, match="NV_PDL"):
        dependent_launch.launch_options(CUDA, 1)
