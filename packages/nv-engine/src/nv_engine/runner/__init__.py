"""What runs on every tensor-parallel rank: the model runner, its input staging, CUDA graphs, KV-cache
memory sizing, the sampler's device tensors, the copy of sampled ids back to the host, and speculative
decoding's verification (draft_verifier) and draft model (draft_model_runner)."""
