"""`nv serve`: an OpenAI-compatible HTTP server over LLMEngine (needs the extra `nv-engine[serve]`).

Module map: protocol (request/response bodies), errors (OpenAI error bodies), engine_loop (the thread
that steps the engine; per-request asyncio queues), serving (shared checks, sampling params, logprob
shapes), completions / chat (the handlers), metrics (Prometheus, vLLM names), app (routes), cli
(`nv serve` arguments and startup).
"""
