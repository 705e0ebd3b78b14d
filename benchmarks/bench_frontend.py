"""The frontend's cost per engine-core step, on the CPU: AsyncLLM serving N concurrent requests, each
read by its own asyncio task as a server handler would, with either the real engine core (a tiny random
Qwen3 in its own process) or, with --fake-core, an in-process stand-in that "steps" as fast as the
frontend takes its outputs (one token per request per step, each step's EngineCoreOutputs encoded and
decoded by the real CoreMessageCodec), so the frontend alone sets the pace.

It reports the receiver thread's milliseconds per core OUTPUTS message (EngineCoreClient.timer):
`decode` (frame -> EngineCoreOutputs), `handle` (output processing: detokenizing, stop strings,
RequestOutputs, and `deliver`: the hand-over to the asyncio queues), plus the run's output tokens
per second and the consumers' wake-ups. With --non-streamed the requests are added with
stream=False (their text is decoded once, at the end). With NV_LOGGING_LEVEL=DEBUG the core
process logs its own loop's split (step / device wait / outputs / inputs / idle).

    python benchmarks/bench_frontend.py [--requests 256] [--max-tokens 128] [--non-streamed] [--fake-core]

With --serve PORT it runs `nv serve` (the real HTTP server and AsyncLLM) over the stand-in core instead, stepping
every --step-ms milliseconds, for a client such as `nv bench serve --port PORT`: the server's own CPU per
streamed token (read it from /proc/PID/stat around a run).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

import nv_engine.engine.async_llm
from nv_engine.config.engine_args import EngineArgs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core_codec import CoreMessageCodec
from nv_engine.core.engine_core_message import CoreMessage
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.core.sequence_update import SequenceUpdate
from nv_engine.core.stage_timer import StageTimer
from nv_engine.engine.async_llm import AsyncLLM
from nv_engine.model_loader.model_path import load_hf_config
from nv_engine.model_loader.random_model import cached_random_model
from nv_engine.sampling_params import SamplingParams
from nv_kvcache import FinishReason


class FakeCoreClient:
    """EngineCoreClient's face without a core: a thread steps every added request by one token per
    step (token ids cycle through the vocabulary), reports as the real core does (every step for a
    request that reports every token, else once when it finishes), and hands each step's outputs
    through the codec to `on_outputs`, timed as the real receiver times them."""

    def __init__(self, config: EngineConfig | EngineArgs, eos_token_ids: Iterable[int] | None, *,
                 on_outputs: Callable[[EngineCoreOutputs], None], on_dead: Callable[[str], None]) -> None:
        """`config`: a resolved EngineConfig, or the EngineArgs that AsyncLLM starts its first core from."""
        del eos_token_ids, on_dead
        hf_config = config.hf_config if isinstance(config, EngineConfig) else load_hf_config(config.model)
        self.vocab = int(hf_config.vocab_size) - 16
        self.on_outputs = on_outputs
        self.ready = {"num_blocks": 1 << 20, "pid": 0}
        self.timer = StageTimer("fake core outputs", "message", ("decode", "handle", "deliver"),
                                logging.getLogger(__name__), notes={"handle": "deliver"})
        self.is_alive = True
        self.encoder, self.decoder = CoreMessageCodec(), CoreMessageCodec()
        self.lock = threading.Lock()
        self.requests: dict[str, list] = {}     # id -> [request, tokens so far, tokens reported]
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def wait_ready(self, config: EngineConfig | None = None, eos_token_ids: Iterable[int] | None = None) -> None:
        """Ready from the start (nothing to load)."""
        del config, eos_token_ids

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        with self.lock:
            for request in requests:
                self.requests[request.request_id] = [request, [], 0]
        self.wake.set()

    def abort_requests(self, request_ids: list[str]) -> None:
        with self.lock:
            for request_id in request_ids:
                self.requests.pop(request_id, None)

    def finish_requests(self, completions: list[tuple[str, int]]) -> None:
        self.abort_requests([request_id for request_id, _ in completions])

    def note_delivery(self, engine_index: int, seconds: float) -> None:
        del engine_index
        self.timer.add("deliver", seconds)

    step_s = 0.0    # --serve: the stand-in's step time

    def loop(self) -> None:
        clock = time.perf_counter
        while self.is_alive:
            self.wake.wait(0.1)
            if self.step_s:
                time.sleep(self.step_s)
            with self.lock:
                updates = []
                for request_id, entry in list(self.requests.items()):
                    request, tokens, reported = entry
                    tokens.append((len(tokens) * 31 + len(request_id)) % self.vocab + 1)
                    finished = len(tokens) >= (request.params.max_tokens or 16)
                    if finished or request.reports_every_token:
                        updates.append(SequenceUpdate(request_id, 0, tokens[reported:], None, 0.0,
                                                      FinishReason.LENGTH if finished else None, None, 0))
                        entry[2] = len(tokens)
                    if finished:
                        del self.requests[request_id]
                if not self.requests:
                    self.wake.clear()
            if not updates:
                continue
            frame = self.encoder.encode(CoreMessage.OUTPUTS, EngineCoreOutputs(updates, time.monotonic()))
            started = clock()
            _, outputs = self.decoder.decode(frame)
            decoded = clock()
            self.timer.add("decode", decoded - started)
            self.on_outputs(outputs)     # type: ignore[arg-type]  # OUTPUTS decode to EngineCoreOutputs
            handled = clock()
            self.timer.add("handle", handled - decoded)
            self.timer.end_round(handled)

    def shutdown(self) -> None:
        self.is_alive = False


async def run_requests(llm: AsyncLLM, num_requests: int, prompt_len: int, max_tokens: int,
                       stream: bool) -> tuple[int, int]:
    """(output tokens, consumer wake-ups) of num_requests concurrent requests."""
    vocab = int(llm.config.hf_config.vocab_size) - 16

    async def one(i: int) -> tuple[int, int]:
        prompt = [(i * 7 + j * 13) % vocab + 1 for j in range(prompt_len)]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outputs = await llm.add_requests([(f"bench-{i}", {"prompt_token_ids": prompt}, params)], stream=stream)
        wakeups, tokens = 0, 0
        async for batch in outputs:
            wakeups += 1
            tokens = len(batch[-1].outputs[0].token_ids)
        return tokens, wakeups

    results = await asyncio.gather(*(one(i) for i in range(num_requests)))
    return sum(t for t, _ in results), sum(w for _, w in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint dir (default: a tiny random Qwen3)")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--non-streamed", action="store_true", help="add requests with stream=False")
    parser.add_argument("--rounds", type=int, default=2, help="the first round warms up")
    parser.add_argument("--fake-core", action="store_true", help="an in-process stand-in for the core")
    parser.add_argument("--serve", type=int, metavar="PORT", help="run nv serve over the stand-in core on PORT")
    parser.add_argument("--step-ms", type=float, default=5.0, help="--serve: the stand-in core's step time")
    args = parser.parse_args()
    if args.serve is not None:
        from nv_engine.entrypoints.server.cli import main as serve_main

        FakeCoreClient.step_s = args.step_ms / 1e3
        nv_engine.engine.async_llm.EngineCoreClient = FakeCoreClient    # type: ignore[misc,assignment]
        model = args.model or str(cached_random_model("tiny")[0])
        raise SystemExit(serve_main([model, "--port", str(args.serve), "--device", "cpu", "--dtype", "float32",
                                     "--max-model-len", "4096", "--block-size", "16",
                                     "--num-gpu-blocks-override", "100000", "--max-num-seqs", "1024"]))
    if args.fake_core:
        nv_engine.engine.async_llm.EngineCoreClient = FakeCoreClient    # type: ignore[misc,assignment]
    model = args.model or str(cached_random_model("tiny")[0])
    max_model_len = args.prompt_len + args.max_tokens + 16
    blocks = args.requests * math.ceil(max_model_len / 16) + 16
    llm = AsyncLLM(model, device="cpu", dtype="float32", max_model_len=max_model_len, max_num_seqs=args.requests,
                   max_num_batched_tokens=max(2048, args.requests * args.prompt_len),
                   num_gpu_blocks_override=blocks, block_size=16)
    timer = llm.client.timer
    timer.interval_s = math.inf               # sums over the whole round; read below
    try:
        for round_index in range(args.rounds):
            timer.report()
            started = time.perf_counter()
            tokens, wakeups = asyncio.run(run_requests(llm, args.requests, args.prompt_len, args.max_tokens,
                                                       stream=not args.non_streamed))
            elapsed = time.perf_counter() - started
            messages = timer.rounds
            per_message = timer.per_round_ms()
            label = "warm-up" if round_index == 0 and args.rounds > 1 else f"round {round_index}"
            print(f"{label}: {args.requests} requests x {args.max_tokens} tokens "
                  f"({'non-streamed' if args.non_streamed else 'streamed'}): {tokens / elapsed:,.0f} out tok/s, "
                  f"{messages} core messages, {wakeups} consumer wake-ups, {elapsed:.2f} s")
            busy_s = (per_message["decode"] + per_message["handle"]) * messages / 1e3
            print(f"    frontend ms per message: decode {per_message['decode']:.3f}, "
                  f"handle {per_message['handle']:.3f} (deliver {per_message['deliver']:.3f}); "
                  f"receiver busy {100 * busy_s / elapsed:.0f}% of the run")
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
