"""KVEventPublisher: sends the engine's KV-cache events on a ZMQ PUB socket, one batch per engine step."""
from __future__ import annotations

import time

from nv_engine.config.kv_events_config import KVEventsConfig
from nv_kvcache import KVCacheEvent

try:
    import msgspec
    import zmq

    from nv_engine.core.kv_events.wire import KVEventBatch, to_wire
except ImportError as exc:          # the kv-events extra is missing
    raise ImportError(f"KV-cache events need pyzmq and msgspec: pip install 'nv-engine[kv-events]' ({exc})") from exc


class KVEventPublisher:
    """`publish(events)` encodes a KVEventBatch and sends [topic, sequence number (8 bytes, big-endian,
    from 0), payload] without blocking: PUB drops batches for a subscriber more than `hwm` behind, as
    vLLM's does (no replay socket here). Call from one thread (ZMQ sockets are not thread-safe)."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int | None = None) -> None:
        self.config = config
        self.data_parallel_rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._seq = 0
        socket = zmq.Context.instance().socket(zmq.PUB)
        socket.set_hwm(config.hwm)
        socket.setsockopt(zmq.LINGER, 0)
        endpoint = config.endpoint
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                socket.bind(endpoint)
            else:
                socket.connect(endpoint)
        except zmq.ZMQError as exc:
            socket.close()
            raise ValueError(f"kv_events_config.endpoint {endpoint!r}: {exc}") from exc
        self.endpoint: str = socket.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint   # the bound port, for *
        self._socket: zmq.Socket | None = socket

    @classmethod
    def from_config(cls, config: KVEventsConfig | None) -> KVEventPublisher | None:
        """A publisher when the config enables events with a real publisher; None otherwise."""
        if config is None or not config.publishes:
            return None
        return cls(config)

    @property
    def num_batches_sent(self) -> int:
        return self._seq

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Send the events as one batch (nothing when there are none)."""
        if not events:
            return
        if self._socket is None:
            raise RuntimeError("the KV-event publisher was shut down")
        batch = KVEventBatch(time.time(), [to_wire(e) for e in events], self.data_parallel_rank)
        self._socket.send_multipart((self._topic, self._seq.to_bytes(8, "big"), self._encoder.encode(batch)),
                                    flags=zmq.NOBLOCK)
        self._seq += 1

    def shutdown(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
