"""CoreMessageCodec: every message kind survives the trip between the frontend and the core, OUTPUTS
as typed msgspec (the dataclasses, NamedTuples and enums come back as such, not as lists)."""
from __future__ import annotations

import pytest

from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.engine.outputs import Logprob
from nv_engine.sampling_params import SamplingParams
from nv_kvcache import FinishReason, SchedulerStats


def _outputs() -> EngineCoreOutputs:
    running = SequenceUpdate("cmpl-a-0", 0, [17], None, 0.0, None, None, 32)
    finished = SequenceUpdate("cmpl-b-0", 1, [3, 4], [{3: Logprob(-0.25, 1, None)}, {4: Logprob(-1.5, 2)}],
                              -1.75, FinishReason.STOP, 4, 16, [{9: Logprob(-2.0, 3, "x")}])
    return EngineCoreOutputs([running, finished], 123.5, {"cmpl-a-0": 120.25},
                             SchedulerStats(2, 1, 0.5, 64, 48, 1), [("cmpl-c-0", "refused")], (40, 2))


def test_outputs_round_trip_typed():
    codec = CoreMessageCodec()
    sent = _outputs()
    kind, received = codec.decode(codec.encode(CoreMessage.OUTPUTS, sent))
    assert kind is CoreMessage.OUTPUTS
    assert received == sent
    assert isinstance(received, EngineCoreOutputs)
    assert isinstance(received.updates[1], SequenceUpdate)
    assert received.updates[1].finish_reason is FinishReason.STOP
    assert isinstance(received.updates[1].logprobs[0][3], Logprob)
    assert isinstance(received.scheduler_stats, SchedulerStats)
    empty = EngineCoreOutputs([], 1.0)
    assert codec.decode(codec.encode(CoreMessage.OUTPUTS, empty)) == (CoreMessage.OUTPUTS, empty)


def test_other_messages_round_trip_any_payload():
    codec = CoreMessageCodec()
    request = EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=4, stop=["x"]), True, 5.0)
    kind, payload = codec.decode(codec.encode(CoreMessage.ADD, [request]))
    assert kind is CoreMessage.ADD and payload == [request]
    for kind, payload in [(CoreMessage.ABORT, ["a", "b"]), (CoreMessage.FINISH, [("a", 1)]),
                          (CoreMessage.UTILITY, (7, "get_num_free_blocks", ())), (CoreMessage.SHUTDOWN, None),
                          (CoreMessage.READY, {"num_blocks": 8, "pid": 1}), (CoreMessage.ERROR, "boom")]:
        assert codec.decode(memoryview(codec.encode(kind, payload))) == (kind, payload)


def test_a_frame_of_no_known_kind_is_a_value_error():
    codec = CoreMessageCodec()
    with pytest.raises(ValueError, match="unknown kind 99"):
        codec.decode(bytes([99]) + b"data")
    with pytest.raises(ValueError, match="empty"):
        codec.decode(b"")
