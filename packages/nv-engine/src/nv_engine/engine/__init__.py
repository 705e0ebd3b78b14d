"""The frontend side of the engine: requests in, RequestOutputs out (vLLM v1's engine/).

Module map: llm_engine (`LLMEngine`: tokenizer + output processor in front of an in-process EngineCore),
async_llm (`AsyncLLM`: the asyncio API over an engine core in its own process), core_client /
data_parallel_client / core_forkserver / engine_dead_error (reaching engine-core processes), request_preparer /
engine_requests (checks and tokenization before a request reaches the core), output_processor / request_state /
completion_state / detokenizer / byte_level_vocab (per-request state, incremental detokenization, stop strings),
outputs (`RequestOutput`, `CompletionOutput`, `Logprob`), output_stream (merged outputs of n requests),
prefix_index (the data-parallel dispatcher's view of each core's prefix cache).
"""
