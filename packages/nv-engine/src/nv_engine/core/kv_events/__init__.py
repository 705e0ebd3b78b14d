"""KV-cache events for KV-aware routers (llm-d, Dynamo), in vLLM's wire format: the msgpack message types
(`wire`) and `KVEventPublisher` (`publisher`, ZMQ PUB), which the engine core feeds with the block manager's
events. Their configuration is `nv_engine.config.kv_events_config.KVEventsConfig` (the engine argument
kv_events_config). Nothing is imported here: the publisher needs pyzmq and msgspec (nv-engine[kv-events])."""
