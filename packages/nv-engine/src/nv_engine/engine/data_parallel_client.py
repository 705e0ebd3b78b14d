"""DataParallelCoreClient: N engine cores behind one frontend (`data_parallel_size`), with the face of one
EngineCoreClient (add / abort / finish / call_utility / is_alive / shutdown), so AsyncLLM drives either.

Each core is an EngineCoreClient (its own process, model copy and KV cache). On CUDA core i runs on the
GPUs i*tp .. (i+1)*tp-1 of the frontend's visible devices (its CUDA_VISIBLE_DEVICES names only those);
on CPU every core shares the CPU.

Dispatch: each request goes to one core. The frontend remembers, per core, the full prompt blocks it
sent there (a PrefixIndex: the block manager's chained hashes, bounded by the core's KV blocks), and
each core's load (its requests in flight from this frontend). A request goes to the alive core holding
the longest prefix of its prompt, unless that core carries more than `max_num_seqs` requests beyond the
least loaded one (a shared system prompt must not pile every request onto one core); misses and ties go
to the least loaded core, equal loads in turn.

A dead core fails only its own open requests (`on_dead(reason, their ids)`); later requests go to the
live cores. When the last core dies, `on_dead(reason, None)`: the engine is dead.

Callbacks (`on_outputs`, `on_dead`) come from each core's receiver thread, one at a time (a lock
serializes them, as with one core); each EngineCoreOutputs carries its core's `engine_index`.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import re
import threading
from collections.abc import Callable, Iterable

from nv_engine import envs
from nv_engine.config.engine_config import EngineConfig
from nv_engine.core.engine_core_outputs import EngineCoreOutputs
from nv_engine.core.engine_core_request import EngineCoreRequest
from nv_engine.engine.core_client import EngineCoreClient
from nv_engine.engine.engine_dead_error import EngineDeadError
from nv_engine.engine.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)


class DataParallelCoreClient:
    def __init__(self, config: EngineConfig, eos_token_ids: Iterable[int], *,
                 on_outputs: Callable[[EngineCoreOutputs], None],
                 on_dead: Callable[[str, list[str] | None], None]) -> None:
        self._on_outputs = on_outputs
        self._on_dead = on_dead
        self.max_imbalance = config.max_num_seqs
        self.prefers_cached_prefixes = config.enable_prefix_caching   # off: the cores cache nothing
        eos = sorted(eos_token_ids)
        self._lock = threading.Lock()            # _open, _load, _prefixes, _next
        self._callback_lock = threading.Lock()   # one callback into the frontend at a time
        num_cores = config.data_parallel_size
        # each core's prompt blocks; the capacity is set once the core tells its number of KV blocks
        self._prefixes = [PrefixIndex(config.block_size, 0) for _ in range(num_cores)]
        # request id -> (core index, completion indices the core still runs)
        self._open: dict[str, tuple[int, set[int]]] = {}
        self._load = [0] * num_cores                # open requests per core
        self._next = 0                              # equal loads: the core whose turn it is
        self._started = False                       # every core is ready
        # the cores start together (each loads its model while the others do); if one fails, the
        # others are shut down and its error raised
        self.clients: list[EngineCoreClient] = []
        with concurrent.futures.ThreadPoolExecutor(num_cores, thread_name_prefix="nv-core-start") as pool:
            starts = [pool.submit(self._start_core, config, eos, index) for index in range(num_cores)]
            concurrent.futures.wait(starts)
        errors: list[tuple[int, BaseException]] = []
        for index, start in enumerate(starts):
            error = start.exception()
            if error is None:
                self.clients.append(start.result())
            else:
                errors.append((index, error))
        with self._callback_lock:
            self._started = True
            if not errors:    # every core started; one that died while the others started fails the start
                errors = [(index, RuntimeError(client.dead_reason)) for index, client in enumerate(self.clients)
                          if client.dead_reason is not None]
        if errors:
            for client in self.clients:
                client.shutdown(timeout=10.0)
            index, error = errors[0]
            raise RuntimeError(f"engine core {index} of {num_cores} failed to start: {error}") from error
        for prefixes, client in zip(self._prefixes, self.clients, strict=True):
            prefixes.capacity = int(client.ready["num_blocks"])
        self.pids = [int(client.ready["pid"]) for client in self.clients]
        self.num_blocks_per_core = [int(client.ready["num_blocks"]) for client in self.clients]
        # the cores' KV blocks together (what the utilities' sums compare with)
        self.ready = {**self.clients[0].ready,
                      "num_blocks": sum(int(client.ready["num_blocks"]) for client in self.clients)}

    # ---- starting the cores ------------------------------------------------------------------
    def _start_core(self, config: EngineConfig, eos_token_ids: list[int], index: int) -> EngineCoreClient:
        client = EngineCoreClient(self._core_config(config, index), eos_token_ids,
                                  on_outputs=lambda outputs: self._core_outputs(index, outputs),
                                  on_dead=lambda reason: self._core_dead(index, reason),
                                  env=self._core_environment(config, index))
        client.wait_ready()
        return client

    @staticmethod
    def _core_environment(config: EngineConfig, index: int) -> dict[str, str]:
        """Core `index`'s CUDA_VISIBLE_DEVICES: its own tensor_parallel_size GPUs of the frontend's
        visible ones (nothing on CPU)."""
        if not config.is_cuda:
            return {}
        import torch

        before = envs.cuda_visible_devices()
        visible = (before.split(",") if before is not None
                   else [str(i) for i in range(torch.cuda.device_count())])
        tp = config.tensor_parallel_size
        return {"CUDA_VISIBLE_DEVICES": ",".join(visible[index * tp:(index + 1) * tp])}

    @staticmethod
    def _core_config(config: EngineConfig, index: int) -> EngineConfig:
        """Core `index`'s config: KV events on an endpoint of its own (a TCP port `index` higher, an
        ipc/inproc path with `_dp<index>` appended), as vLLM offsets them."""
        events = config.kv_events_config
        if events is None or not events.publishes or index == 0:
            return config
        endpoint = events.endpoint
        port = re.fullmatch(r"(tcp://.*:)(\d+)", endpoint)
        if port is not None:
            endpoint = f"{port.group(1)}{int(port.group(2)) + index}"
        elif endpoint.startswith(("ipc://", "inproc://")):
            endpoint = f"{endpoint}_dp{index}"
        return dataclasses.replace(config, kv_events_config=dataclasses.replace(events, endpoint=endpoint))

    # ---- status ------------------------------------------------------------------------------
    @property
    def is_alive(self) -> bool:
        """At least one core serves."""
        return any(client.is_alive for client in self.clients)

    @property
    def dead_engines(self) -> dict[int, str]:
        """Core index -> why it died, for the cores that died (not those shut down)."""
        return {index: client.dead_reason for index, client in enumerate(self.clients)
                if client.dead_reason is not None}

    def load(self) -> list[int]:
        """Requests in flight on each core (sent by this frontend, not finished, aborted or failed)."""
        with self._lock:
            return list(self._load)

    # ---- frontend -> cores -------------------------------------------------------------------
    def note_delivery(self, engine_index: int, seconds: float) -> None:
        """The frontend's delivery time for one OUTPUTS message, on the timer of the core that sent it."""
        self.clients[engine_index].note_delivery(0, seconds)

    def add_requests(self, requests: list[EngineCoreRequest]) -> list[int]:
        """Send each request to its core; returns the core index of each, in order. EngineDeadError
        when no core is alive (then none was sent)."""
        by_core: dict[int, list[EngineCoreRequest]] = {}
        chosen: list[int] = []
        with self._lock:
            for request in requests:
                index = self._choose(self._prefixes[0].block_hashes(request.prompt_token_ids))
                chosen.append(index)
                by_core.setdefault(index, []).append(request)
                self._open[request.request_id] = (index, set(range(request.params.n)))
                self._load[index] += 1
        sent: list[str] = []
        try:
            for index, core_requests in by_core.items():
                self.clients[index].add_requests(core_requests)
                sent.extend(request.request_id for request in core_requests)
        except BaseException:        # a core died meanwhile: nothing of this call stays anywhere
            self.abort_requests(sent)
            self._forget([request.request_id for request in requests])
            raise
        return chosen

    def _choose(self, hashes: list[int]) -> int:
        """The core for a prompt with these block hashes (called under the lock); records the prompt
        in that core's PrefixIndex."""
        alive = [index for index, client in enumerate(self.clients) if client.is_alive]
        if not alive:
            reasons = "; ".join(f"engine {i}: {reason}" for i, reason in self.dead_engines.items())
            raise EngineDeadError(f"no engine core is alive ({reasons or 'shut down'})")
        num_cores = len(self.clients)
        least = min(self._load[index] for index in alive)
        turn = self._next

        def rank(index: int) -> tuple[int, int, int]:
            matched = self._prefixes[index].match_length(hashes) if self.prefers_cached_prefixes else 0
            if self._load[index] > least + self.max_imbalance:
                matched = 0                      # too busy to be worth its cached prefix
            return matched, -self._load[index], -((index - turn) % num_cores)

        best = max(alive, key=rank)
        self._next = (best + 1) % num_cores
        self._prefixes[best].add(hashes)
        return best

    def abort_requests(self, request_ids: list[str]) -> None:
        for index, ids in self._forget(request_ids).items():
            self.clients[index].abort_requests(ids)

    def finish_requests(self, completions: list[tuple[str, int]]) -> None:
        by_core: dict[int, list[tuple[str, int]]] = {}
        with self._lock:
            for request_id, completion in completions:
                entry = self._open.get(request_id)
                if entry is None:
                    continue
                by_core.setdefault(entry[0], []).append((request_id, completion))
                self._close_completion(request_id, completion)
        for index, core_completions in by_core.items():
            self.clients[index].finish_requests(core_completions)

    def call_utility(self, method: str, *args: int) -> concurrent.futures.Future[int]:
        """The utility's result summed over the alive cores (free blocks, unfinished requests)."""
        futures = [client.call_utility(method, *args) for client in self.clients if client.is_alive]
        if not futures:
            raise EngineDeadError("no engine core is alive")
        total: concurrent.futures.Future[int] = concurrent.futures.Future()
        remaining = [len(futures)]
        remaining_lock = threading.Lock()

        def one_done(_: concurrent.futures.Future[int]) -> None:
            with remaining_lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            error = next((f.exception() for f in futures if f.exception() is not None), None)
            if error is not None:
                total.set_exception(error)
            else:
                total.set_result(sum(f.result() for f in futures))

        for future in futures:
            future.add_done_callback(one_done)
        return total

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop every core, all at once (each waits for its process)."""
        if not self.clients:
            return
        with concurrent.futures.ThreadPoolExecutor(len(self.clients), thread_name_prefix="nv-core-stop") as pool:
            list(pool.map(lambda client: client.shutdown(timeout), self.clients))

    # ---- bookkeeping (callers hold no lock unless said) --------------------------------------
    def _forget(self, request_ids: Iterable[str]) -> dict[int, list[str]]:
        """Stop tracking these requests; returns the open ones by core."""
        by_core: dict[int, list[str]] = {}
        with self._lock:
            for request_id in request_ids:
                entry = self._open.pop(request_id, None)
                if entry is not None:
                    self._load[entry[0]] -= 1
                    by_core.setdefault(entry[0], []).append(request_id)
        return by_core

    def _close_completion(self, request_id: str, completion: int) -> None:
        """Completion `completion` of the request ended (called under the lock); the request ends
        with its last completion."""
        entry = self._open.get(request_id)
        if entry is None:
            return
        index, running = entry
        running.discard(completion)
        if not running:
            del self._open[request_id]
            self._load[index] -= 1

    # ---- cores -> frontend (each core's receiver thread) --------------------------------------
    def _core_outputs(self, index: int, outputs: EngineCoreOutputs) -> None:
        outputs.engine_index = index
        with self._lock:
            for update in outputs.updates:
                if update.finish_reason is not None:
                    self._close_completion(update.request_id, update.completion_index)
        self._forget(request_id for request_id, _ in outputs.failed)
        with self._callback_lock:
            self._on_outputs(outputs)

    def _core_dead(self, index: int, reason: str) -> None:
        with self._lock:
            lost = [request_id for request_id, (core, _) in self._open.items() if core == index]
            self._prefixes[index].clear()
        self._forget(lost)
        reason = f"engine core {index}: {reason}"
        with self._callback_lock:
            if not self._started:
                return                  # the start fails with it (the constructor raises)
            if self.is_alive:
                logger.error("%s; %d request(s) failed, the other cores serve on", reason, len(lost))
                self._on_dead(reason, lost)
            else:
                self._on_dead(reason, None)
