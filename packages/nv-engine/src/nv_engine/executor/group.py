"""WorkerGroup: the spawned worker processes of one engine, their pipes, and a watcher thread.

The watcher thread owns every read from the workers. It queues their replies, notices a dead
worker at once (process sentinel / closed pipe) and then terminates the other workers and aborts
the driver's process group, so nothing waits on a dead peer. It also enforces the failure rule:
once a rank failed, the others get `grace_s` to finish the call; ranks still busy after that are
stuck in a collective waiting for the failed one, and the group is terminated ("broken").
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import cast

from nv_engine.executor.worker import BYE, ERR, HELLO, SHUTDOWN, encode, worker_main

DEAD = "dead"
Reply = tuple[int, str, int, object]  # (rank, kind, call_id, payload)


class WorkerGroup:
    def __init__(self, *, ranks: Iterable[int], grace_s: float, on_broken: Callable[[], None],
                 **worker_kwargs: object) -> None:
        ctx = mp.get_context("spawn")
        self.grace_s = grace_s
        self._on_broken = on_broken
        self.procs: dict[int, BaseProcess] = {}
        self.conns: dict[int, Connection] = {}
        self.replies: queue.Queue[Reply] = queue.Queue()
        self.broken: str | None = None     # why the group cannot be used any more
        self.broken_by_death = False
        self._lock = threading.Lock()
        self._hellos: set[int] = set()
        self._hello_cv = threading.Condition(self._lock)
        self._local_busy = False           # the driver's own rank is inside a call
        self._kill_at: float | None = None
        self._worker_failed = False        # a worker answered this call with an error (maybe before the driver's
                                           # rank entered it: the grace then starts when it does)
        self._closing = False
        self._stopped = False
        self._wake_r, self._wake_w = os.pipe()
        try:
            for rank in ranks:
                parent_end, child_end = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=worker_main, name=f"nv-tp-worker-{rank}", daemon=True,
                                   kwargs=dict(worker_kwargs, rank=rank, conn=child_end))
                self.conns[rank] = parent_end
                proc.start()   # pickles the config: may raise
                child_end.close()
                self.procs[rank] = proc
        except BaseException:
            for proc in self.procs.values():
                proc.kill()
                proc.join()
            for conn in self.conns.values():
                conn.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self._thread = threading.Thread(target=self._watch, name="nv-tp-watcher", daemon=True)
        self._thread.start()

    @property
    def pids(self) -> dict[int, int]:
        # a started process has a pid (procs holds started ones only)
        return {rank: proc.pid for rank, proc in self.procs.items() if proc.pid is not None}

    # ---- driver side (main thread) -------------------------------------------------------------
    def wait_hellos(self) -> None:
        """Block until every worker has started (imports done), or raise when one died first."""
        with self._hello_cv:
            while len(self._hellos) < len(self.procs) and self.broken is None:
                self._hello_cv.wait(0.5)
        if self.broken is not None:
            raise RuntimeError(f"tensor-parallel worker failed to start: {self.broken}")

    def broadcast(self, payload: bytes) -> None:
        with self._lock:
            self._worker_failed = False    # a new call
        for rank, conn in self.conns.items():
            try:
                conn.send_bytes(payload)
            except OSError as exc:
                self.mark_broken(f"worker rank {rank} cannot be reached ({exc})", death=True)
                raise RuntimeError(f"tensor-parallel executor: {self.broken}") from exc

    def set_local_busy(self, busy: bool) -> None:
        with self._lock:
            self._local_busy = busy
            failed_first = busy and self._worker_failed
            self._kill_at = time.monotonic() + self.grace_s if failed_first else None
        if failed_first:
            os.write(self._wake_w, b"x")   # the watcher's wait takes the deadline now

    def collect(self, call_id: int, local_failed: bool) -> dict[int, tuple[str, object]]:
        """Replies to `call_id` from every worker (fewer when the group broke on the way)."""
        got: dict[int, tuple[str, object]] = {}
        deadline = time.monotonic() + self.grace_s if local_failed else None
        while len(got) < len(self.procs) and self.broken is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                missing = sorted(set(self.procs) - set(got))
                self.mark_broken(f"ranks {missing} did not finish within {self.grace_s}s after "
                                 "another rank failed (stuck in a collective); workers terminated")
                break
            timeout = 0.5 if deadline is None else min(0.5, deadline - now)
            try:
                rank, kind, reply_id, payload = self.replies.get(timeout=timeout)
            except queue.Empty:
                continue
            if kind == DEAD or reply_id != call_id:
                continue  # a death sets self.broken; other ids are leftovers of an aborted call
            got[rank] = (kind, payload)
            if kind == ERR and deadline is None:
                deadline = time.monotonic() + self.grace_s
        while self.broken is not None:   # keep the replies that arrived before the break
            try:
                rank, kind, reply_id, payload = self.replies.get_nowait()
            except queue.Empty:
                break
            if kind != DEAD and reply_id == call_id:
                got[rank] = (kind, payload)
        return got

    def mark_broken(self, reason: str, *, death: bool = False) -> None:
        """Record the first failure, terminate every worker and abort the driver's group."""
        with self._lock:
            if self.broken is not None or self._closing:
                return
            self.broken, self.broken_by_death = reason, death
            self._hello_cv.notify_all()
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        self._on_broken()

    def request_shutdown(self) -> None:
        with self._lock:
            self._closing = True
        if self.broken is None:
            for conn in self.conns.values():
                try:
                    conn.send_bytes(encode((-1, SHUTDOWN, (), {})))
                except OSError:
                    pass

    def join_and_stop(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closing = True
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._stopped = True
        os.write(self._wake_w, b"x")
        self._thread.join(2.0)
        for conn in self.conns.values():
            conn.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        for proc in self.procs.values():
            proc.close()

    # ---- watcher thread ------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            self._watch_loop()
        except BaseException as exc:  # never leave the driver waiting on a dead watcher
            if not self._stopped:
                self.mark_broken(f"the worker watcher thread failed: {exc!r}")

    def _watch_loop(self) -> None:
        readers = {conn: rank for rank, conn in self.conns.items()}
        sentinels = {proc.sentinel: rank for rank, proc in self.procs.items()}
        while not self._stopped:
            with self._lock:
                kill_at = self._kill_at if self._local_busy else None
            timeout = 1.0 if kill_at is None else max(0.0, min(1.0, kill_at - time.monotonic()))
            ready = wait([*readers, *sentinels, self._wake_r], timeout)
            if self._stopped:
                return
            if self._wake_r in ready:
                os.read(self._wake_r, 64)  # a new deadline (set_local_busy): the next wait takes it
            for obj in ready:
                if obj in readers:
                    self._read_one(cast(Connection, obj), readers)   # a key of readers
            for obj in ready:
                if obj in sentinels:
                    rank = sentinels.pop(cast(int, obj))              # a process sentinel (an fd)
                    conn = self.conns[rank]
                    while conn in readers and conn.poll(0):   # its last words come first
                        self._read_one(conn, readers)
                    readers.pop(conn, None)
                    self._on_exit(rank)
            if kill_at is not None and time.monotonic() >= kill_at:
                with self._lock:
                    still_busy = self._local_busy and self._kill_at is not None
                if still_busy:
                    self.mark_broken(f"the driver's rank did not finish within {self.grace_s}s after "
                                     "a worker failed (stuck in a collective); workers terminated")

    def _read_one(self, conn: Connection, readers: dict[Connection, int]) -> None:
        rank = readers[conn]
        try:
            kind, call_id, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            readers.pop(conn, None)  # the sentinel reports the exit
            return
        if kind == HELLO:
            with self._hello_cv:
                self._hellos.add(rank)
                self._hello_cv.notify_all()
            return
        if kind == BYE:
            return
        self.replies.put((rank, kind, call_id, payload))
        if kind == ERR:
            with self._lock:
                self._worker_failed = True
                if self._local_busy and self._kill_at is None:
                    self._kill_at = time.monotonic() + self.grace_s

    def _on_exit(self, rank: int) -> None:
        proc = self.procs[rank]
        with self._lock:
            closing = self._closing
        if closing:
            return
        proc.join(1.0)  # the sentinel can fire just before the exit status is available
        reason = f"worker rank {rank} (pid {proc.pid}) died with exit code {proc.exitcode}"
        self.mark_broken(reason, death=True)
        self.replies.put((rank, DEAD, -1, reason))
