"""KV-cache events off the engine: the kv_events_config argument, vLLM's wire format byte for byte
(array_like, tagged, omit_defaults), and the ZMQ PUB framing [topic, 8-byte big-endian seq, payload]."""
from __future__ import annotations

import argparse
import time

import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from nv_engine.config.engine_args import EngineArgs  # noqa: E402
from nv_engine.config.kv_events_config import KVEventsConfig  # noqa: E402
from nv_engine.core.kv_events.publisher import KVEventPublisher  # noqa: E402
from nv_engine.core.kv_events.wire import BlockStored, KVEventBatch, to_wire  # noqa: E402
from nv_kvcache import AllBlocksCleared, BlockRemoved  # noqa: E402
from nv_kvcache import BlockStored as CacheStored  # noqa: E402


def test_config_from_json_dict_and_refusals():
    assert KVEventsConfig.from_value(None) is None
    config = KVEventsConfig.from_value('{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000"}')
    assert config == KVEventsConfig(True, "zmq", "tcp://*:6000", "kv-events") and config.publishes
    assert not KVEventsConfig.from_value({"enable_kv_cache_events": True, "publisher": "null"}).publishes
    assert not KVEventsConfig.from_value({}).publishes
    for bad, error, match in (("{not json", ValueError, "not valid JSON"),
                              ({"enable_kv_cache_events": True, "replay": 1}, ValueError, "unknown key"),
                              ({"publisher": "kafka"}, ValueError, "publisher"),
                              ({"enable_kv_cache_events": "yes"}, TypeError, "bool"),
                              ([1], TypeError, "dict")):
        with pytest.raises(error, match=match):
            KVEventsConfig.from_value(bad)   # type: ignore[arg-type]


def test_engine_argument_and_flag():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    EngineArgs.add_cli_arguments(parser)
    args = parser.parse_args(["m", "--kv-events-config", '{"enable_kv_cache_events": true, "topic": "t"}'])
    assert EngineArgs.from_cli_args(args).kv_events_config == {"enable_kv_cache_events": True, "topic": "t"}
    with pytest.raises(ValueError, match="unknown key"):      # refused before any model is read
        EngineArgs(model="/no/such/model", kv_events_config={"bogus": 1}).create_engine_config()


def test_wire_format_is_vllms():
    stored = CacheStored([2**64 - 1, 7], None, list(range(8)), 4)
    batch = KVEventBatch(1.5, [to_wire(stored), to_wire(BlockRemoved([7])), to_wire(AllBlocksCleared())])
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert raw[:2] == [1.5, [["BlockStored", [2**64 - 1, 7], None, list(range(8)), 4, None, "GPU"],
                             ["BlockRemoved", [7], "GPU"], ["AllBlocksCleared"]]]
    assert raw[2:] in ([], [None])           # rank None (msgspec versions differ on trailing defaults)
    with_rank = msgspec.msgpack.encode(KVEventBatch(1.5, [], 3))
    assert msgspec.msgpack.decode(with_rank) == [1.5, [], 3]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch) == batch
    assert isinstance(batch.events[0], BlockStored)


def test_publisher_frames_and_sequence_numbers(tmp_path):
    publisher = KVEventPublisher(KVEventsConfig(True, endpoint=f"ipc://{tmp_path}/events", topic="kv"))
    subscriber = zmq.Context.instance().socket(zmq.SUB)
    try:
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.connect(publisher.endpoint)
        deadline = time.monotonic() + 10
        while not subscriber.poll(50):        # PUB drops until the subscription arrives: probe with batches
            assert time.monotonic() < deadline, "the subscriber never received a batch"
            publisher.publish([BlockRemoved([0])])
        while subscriber.poll(50):
            subscriber.recv_multipart()
        sent = publisher.num_batches_sent
        publisher.publish([])                 # nothing to send: no batch, no sequence number
        publisher.publish([CacheStored([11], 10, [1, 2], 2), AllBlocksCleared()])
        topic, seq, payload = subscriber.recv_multipart()
        assert topic == b"kv" and int.from_bytes(seq, "big") == sent
        batch = msgspec.msgpack.decode(payload, type=KVEventBatch)
        assert [type(e).__name__ for e in batch.events] == ["BlockStored", "AllBlocksCleared"]
        assert batch.events[0].parent_block_hash == 10
    finally:
        subscriber.close(linger=0)
        publisher.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        publisher.publish([AllBlocksCleared()])
    with pytest.raises(ValueError, match="endpoint"):
        KVEventPublisher(KVEventsConfig(True, endpoint="nonsense://x"))
