"""The switch for programmatic dependent launch: which launches get it."""
from __future__ import annotations

import pytest
import torch

from nv_kernels import dependent_launch


def test_off_the_gpu_launches_stay_serial() -> None:
    assert dependent_launch.launch_options(torch.device("cpu"), 1) == {"USE_PDL": False}


def test_only_launches_up_to_max_tokens_on_a_supporting_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dependent_launch, "_device_supports", lambda device: True)
    monkeypatch.setattr(dependent_launch, "MAX_TOKENS", 4)
    cuda = torch.device("cuda", 0)
    assert dependent_launch.launch_options(cuda, 1) == {"USE_PDL": True, "launch_pdl": True}
    assert dependent_launch.launch_options(cuda, 4)["USE_PDL"]
    assert dependent_launch.launch_options(cuda, 5) == {"USE_PDL": False}
    previous = dependent_launch.set_dependent_launch(False)
    try:
        assert dependent_launch.launch_options(cuda, 1) == {"USE_PDL": False}
    finally:
        dependent_launch.set_dependent_launch(previous)


@pytest.mark.parametrize("value,expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_environment_switch(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("NV_PDL", value)
    assert dependent_launch._switch_from_env() is expected


def test_environment_switch_rejects_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_PDL", "maybe")
    with pytest.raises(ValueError, match="NV_PDL"):
        dependent_launch._switch_from_env()
