"""CoreMessage: the kinds of message between a frontend and an engine-core process.

Every message is one frame: the CoreMessage byte, then the payload (engine_core_codec.py: msgspec for
OUTPUTS, pickle protocol 5 for the rest). Frontend -> core:
  ADD       list[EngineCoreRequest]
  ABORT     list[str]                         request ids
  FINISH    list[tuple[str, int]]             (request id, completion index) a stop string ended
  UTILITY   tuple[int, str, tuple[int, ...]]  (call id, EngineCore method, int arguments)
  SHUTDOWN  None
Core -> frontend:
  READY           dict[str, int]              num_blocks, max_model_len, block_size, pid
  OUTPUTS         EngineCoreOutputs
  UTILITY_RESULT  tuple[int, bool, int | str] (call id, ok, result or error message)
  ERROR           str                         the core failed (at start or later) and exits
"""
from __future__ import annotations

import enum


class CoreMessage(enum.IntEnum):
    ADD = 0
    ABORT = 1
    FINISH = 2
    UTILITY = 3
    SHUTDOWN = 4
    READY = 10
    OUTPUTS = 11
    UTILITY_RESULT = 12
    ERROR = 13
