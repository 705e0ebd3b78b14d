"""What runs on every tensor-parallel rank: the model runner, its input staging, CUDA graphs, KV-cache
memory sizing, the sampler's device tensors and the copy of sampled ids back to the host."""
