"""What users run: the `nv` command (generate, bench, serve) and the OpenAI-compatible server."""
