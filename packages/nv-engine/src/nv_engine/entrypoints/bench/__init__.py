"""`nv bench`: throughput (the offline headline benchmark, `nv bench throughput`) and serve (a load client
for a running OpenAI-compatible server, as `vllm bench serve`: serve_client, serve_dataset, serve_metrics,
serve_types)."""
