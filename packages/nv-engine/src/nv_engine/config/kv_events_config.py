"""KVEventsConfig: whether and where the engine publishes its KV-cache events (vLLM's --kv-events-config)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

PUBLISHERS = ("zmq", "null")


@dataclass(frozen=True)
class KVEventsConfig:
    """`endpoint` with a `*` (any address, or port `*` for a free one), `::`, `ipc://` or `inproc://` is
    bound; any other is connected to (vLLM's rule). Each batch goes out as [topic, 8-byte big-endian
    sequence number, msgpack payload]. publisher "null" records and sends nothing."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    topic: str = "kv-events"
    hwm: int = 100_000                  # the PUB socket's high-water mark (batches a slow subscriber may lag)

    def __post_init__(self) -> None:
        if not isinstance(self.enable_kv_cache_events, bool):
            raise TypeError(f"kv_events_config.enable_kv_cache_events must be a bool, got "
                            f"{self.enable_kv_cache_events!r}")
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv_events_config.publisher must be one of {list(PUBLISHERS)}, got {self.publisher!r}")
        for name in ("endpoint", "topic"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"kv_events_config.{name} must be a string, got {getattr(self, name)!r}")
        if not self.endpoint:
            raise ValueError("kv_events_config.endpoint must not be empty")
        if isinstance(self.hwm, bool) or not isinstance(self.hwm, int) or self.hwm < 0:
            raise ValueError(f"kv_events_config.hwm must be an integer >= 0, got {self.hwm!r}")

    @property
    def publishes(self) -> bool:
        """Events are recorded and sent."""
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_value(cls, value: KVEventsConfig | dict[str, Any] | str | None) -> KVEventsConfig | None:
        """The engine argument as given: a KVEventsConfig, a dict or its JSON text, or None (off).
        ValueError naming the problem for bad JSON or an unknown key."""
        if value is None or isinstance(value, KVEventsConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"kv_events_config is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise TypeError(f"kv_events_config must be a dict or a JSON object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"kv_events_config: unknown key(s) {unknown}; accepted: {sorted(known)}")
        return cls(**value)
