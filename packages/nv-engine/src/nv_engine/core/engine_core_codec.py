"""CoreMessageCodec: how a (CoreMessage, payload) pair becomes one ZMQ frame and back.

A frame is one byte (the CoreMessage) followed by the payload. OUTPUTS, sent every step, are
msgpack through msgspec with the typed EngineCoreOutputs (its SequenceUpdate NamedTuples travel as
arrays; decoding rebuilds the dataclasses, NamedTuples and FinishReason enums): about 4x cheaper
to encode and decode than pickle for a 256-sequence step (benchmarks/bench_core_ipc.py). Every other
message (requests with their SamplingParams, control and utility calls: a few per request, not per
step) is pickle protocol 5, which takes any picklable payload.
"""
from __future__ import annotations

import pickle

import msgspec

from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs


class CoreMessageCodec:
    """One per socket end (msgspec's encoder and decoder keep reusable state; not thread-safe:
    the frontend encodes under its send lock, each side decodes in one thread)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._outputs_decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)

    def encode(self, kind: CoreMessage, payload: object) -> bytes | bytearray:
        if kind is CoreMessage.OUTPUTS:
            frame = bytearray((kind,))
            self._encoder.encode_into(payload, frame, 1)      # after the kind byte, no extra copy
            return frame
        return bytes((kind,)) + pickle.dumps(payload, protocol=5)

    def decode(self, frame: bytes | bytearray | memoryview) -> tuple[CoreMessage, object]:
        """(kind, payload); ValueError for a frame of no known kind."""
        view = memoryview(frame)
        if not view.nbytes:
            raise ValueError("an empty engine-core message")
        try:
            kind = CoreMessage(view[0])
        except ValueError:
            raise ValueError(f"an engine-core message of unknown kind {view[0]}") from None
        body = view[1:]
        if kind is CoreMessage.OUTPUTS:
            return kind, self._outputs_decoder.decode(body)
        return kind, pickle.loads(body)
