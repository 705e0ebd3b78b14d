"""The per-step cost of the engine-core IPC on the CPU: encode + send + receive + decode of one
step's EngineCoreOutputs (256 running sequences, one new token each) over a ZMQ ipc:// PUSH/PULL
pair, for pickle protocol 5 and msgspec (msgpack). Prints CPU microseconds per step (both ends run in this process).

    python scripts/bench_core_ipc.py [--sequences 256] [--steps 2000]
"""
from __future__ import annotations

import argparse
import pickle
import shutil
import tempfile
import time

import msgspec
import zmq

from nv_engine.engine_core_output import SequenceUpdate
from nv_engine.engine_core_outputs import EngineCoreOutputs


def step_outputs(num_sequences: int, step: int) -> EngineCoreOutputs:
    updates = [SequenceUpdate(f"cmpl-{i:08x}-0", 0, [(step * 31 + i) % 151936], None, 0.0, None, None, 0)
               for i in range(num_sequences)]
    return EngineCoreOutputs(updates, time.monotonic())


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

    encoder = msgspec.msgpack.Encoder()
    decoder = msgspec.msgpack.Decoder()

    def msgspec_encode(outputs: EngineCoreOutputs) -> bytes:
        # msgspec has no NamedTuple-with-enum fast path for these dataclasses: plain tuples
        return encoder.encode((outputs.timestamp, [tuple(u) for u in outputs.updates]))

    def msgspec_decode(data: memoryview) -> EngineCoreOutputs:
        timestamp, rows = decoder.decode(data)
        return EngineCoreOutputs([SequenceUpdate(*row) for row in rows], timestamp)

    measure("pickle-5", pickle_encode, pickle.loads, args.sequences, args.steps)
    measure("msgspec", msgspec_encode, msgspec_decode, args.sequences, args.steps)


if __name__ == "__main__":
    main()
