"""Structured outputs (JSON schema, regex, choice, grammar) with xgrammar.

`params.StructuredOutputsParams` is what a request sets (exported here and by nv_engine);
`compiler.GrammarCompiler` parses and compiles it in a thread pool, cached per constraint;
`manager.StructuredOutputManager` holds a request until its grammar compiled, keeps a GrammarMatcher
per sequence, fills each step's token bitmask and advances the matchers with the sampled tokens, with
the matchers in the engine's process (`local_matchers.LocalMatchers`) or in their own
(`matcher_process.MatcherProcess`, `matcher_process_child.MatcherProcessChild`);
`grammar_sampling.GrammarSampling` is the engine core's side of a step: grammar steps keep async
scheduling (the bitmask fills while the forward runs, ModelRunner.sample follows).
"""
from nv_engine.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
