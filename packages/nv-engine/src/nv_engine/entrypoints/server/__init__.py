"""`nv serve`: an OpenAI-compatible HTTP server over AsyncLLM, whose engine core runs in its own
process (needs the extra `nv-engine[serve]`).

Module map: protocol (request/response bodies), errors (OpenAI error bodies), engine_loop (an
in-process LLMEngine stepped by a thread, for tests that reach into the engine), stat_logger
(AsyncLLM's step statistics into the Prometheus metrics), serving (shared checks, sampling params, logprob
shapes), completions / chat (the handlers), metrics (Prometheus, vLLM names), app (routes), limits
(per-request and per-server bounds), guard (ASGI layer: auth and body size before parsing, the
in-flight bound, 500 bodies), chat_template_sandbox / chat_template_worker (request templates in a
bounded subprocess), draining_server (SIGTERM drain), cli (`nv serve` arguments and startup).
"""
