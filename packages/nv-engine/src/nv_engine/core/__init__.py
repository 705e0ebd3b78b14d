"""The engine core: the engine minus tokenization and detokenization (vLLM v1's EngineCore).

Module map: engine_core (`EngineCore`: scheduler + executor, one step per `step()`), engine_core_process (an
EngineCore in its own process, over ZMQ), engine_core_request / engine_core_outputs / sequence_update /
engine_core_message / engine_core_codec (what crosses between a frontend and a core, and how it is framed),
request_table (the core's unfinished requests), engine_sequence (an nv_kvcache Sequence with sampling state),
step (the numpy-only step contract between host and ranks), step_builder / sampling_batch / block_table_cache
(a scheduler decision -> StepInput), prompt_logprobs_recording, warmup_steps (compile every kernel variant at
start), stage_timer (where a loop's time goes), kv_events/ (KV-cache events for routers).
"""
