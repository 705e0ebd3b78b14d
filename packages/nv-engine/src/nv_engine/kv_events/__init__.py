"""KV-cache events for KV-aware routers (llm-d, Dynamo), in vLLM's wire format: `KVEventsConfig` (the
engine argument kv_events_config), the msgpack message types (`wire`) and `KVEventPublisher` (ZMQ PUB).
Only the config is imported here: the publisher needs pyzmq and msgspec (nv-engine[kv-events])."""
from nv_engine.kv_events.config import KVEventsConfig

__all__ = ["KVEventsConfig"]
