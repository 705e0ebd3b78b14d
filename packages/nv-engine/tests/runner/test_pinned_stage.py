"""PinnedStage: a pageable array is staged through its own pinned buffers; an array already in
page-locked memory (the structured-output manager's bitmask buffers with pin_memory) is copied to the
device from where it is, with no staging copy."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nv_engine.runner.pinned_stage import PinnedStage

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cpu_upload_is_the_array_itself():
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    tensor = PinnedStage(torch.device("cpu")).upload(array)
    assert tensor.data_ptr() == array.ctypes.data


@pytest.mark.gpu
@cuda
def test_pageable_arrays_are_staged_in_turn():
    stage = PinnedStage(torch.device("cuda"))
    arrays = [np.random.default_rng(i).integers(-2**31, 2**31, (5, 7), dtype=np.int32) for i in range(3)]
    tensors = [stage.upload(array) for array in arrays]
    assert all(buffer is not None for buffer in stage._host)
    for array, tensor in zip(arrays, tensors, strict=True):
        np.testing.assert_array_equal(tensor.cpu().numpy(), array)


@pytest.mark.gpu
@cuda
def test_a_pinned_array_is_copied_without_staging():
    stage = PinnedStage(torch.device("cuda"))
    pinned = torch.empty((5, 7), dtype=torch.int32, pin_memory=True).numpy()
    pinned[...] = np.arange(35, dtype=np.int32).reshape(5, 7)
    tensor = stage.upload(pinned)
    assert tensor.device.type == "cuda"
    np.testing.assert_array_equal(tensor.cpu().numpy(), pinned)
    assert stage._host == [None, None] and stage._copied == [None, None]   # no staging buffer, no event
