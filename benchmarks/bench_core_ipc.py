"""The per-step cost of the engine-core IPC on the CPU: encode + send + receive + decode of one
step's EngineCoreOutputs (256 running sequences, one new token each) over a ZMQ ipc:// PUSH/PULL
pair, for pickle protocol 5 and the engine's CoreMessageCodec (typed msgspec msgpack, what the core sends).
Prints CPU microseconds per step (both ends run in this process).

    python benchmarks/bench_core_ipc.py [--sequences 256] [--steps 2000]
"""
from __future__ import annotations

import argparse
import pickle
import shutil
import tempfile
import time

import zmq

from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.sequence_update import SequenceUpdate
from nv_kvcache import SchedulerStats


def step_outputs(num_sequences: int, step: int) -> EngineCoreOutputs:
    updates = [SequenceUpdate(f"cmpl-{i:08x}-0", 0, [(step * 31 + i) % 151936], None, 0.0, None, None, 0)
               for i in range(num_sequences)]
    return EngineCoreOutputs(updates, time.monotonic(), scheduler_stats=SchedulerStats(num_sequences, 0, 0.5, 0, 0, 0),
                             tokens=(0, num_sequences))


def measure(name: str, encode, decode, num_sequences: int, steps: int) -> float:
    folder = tempfile.mkdtemp(prefix="nv-ipc-")
    context = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    pull.bind(f"ipc://{folder}/out")
    push.connect(f"ipc://{folder}/out")
    messages = [step_outputs(num_sequences, s) for s in range(16)]
    size = len(encode(messages[0]))
    for s in range(50):            # warm up
        push.send(encode(messages[s % 16]), copy=False)
        decode(pull.recv(copy=False).buffer)
    start = time.process_time()     # CPU time: stable on a busy machine (both ends run in this process)
    for s in range(steps):
        push.send(encode(messages[s % 16]), copy=False)
        decoded = decode(pull.recv(copy=False).buffer)
    elapsed = time.process_time() - start
    assert len(decoded.updates) == num_sequences
    push.close(0)
    pull.close(0)
    context.term()
    shutil.rmtree(folder, ignore_errors=True)
    per_step = elapsed / steps * 1e6
    print(f"{name:>10}: {per_step:8.1f} us per step ({num_sequences} sequences, {size} bytes)")
    return per_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()

    def pickle_encode(outputs: EngineCoreOutputs) -> bytes:
        return pickle.dumps(outputs, protocol=5)

    sender, receiver = CoreMessageCodec(), CoreMessageCodec()

    def codec_encode(outputs: EngineCoreOutputs) -> bytes | bytearray:
        return sender.encode(CoreMessage.OUTPUTS, outputs)

    def codec_decode(data: memoryview) -> EngineCoreOutputs:
        _, outputs = receiver.decode(data)
        return outputs    # type: ignore[return-value]  # OUTPUTS decode to EngineCoreOutputs

    measure("pickle-5", pickle_encode, pickle.loads, args.sequences, args.steps)
    measure("codec", codec_encode, codec_decode, args.sequences, args.steps)


if __name__ == "__main__":
    main()
