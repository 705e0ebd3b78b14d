"""Where weights come from: model paths and hub ids, the architecture registry, random-weight
checkpoints of real shapes, and GGUF conversion."""
