"""Configuration: engine_args (`EngineArgs`, the one list of user-facing engine arguments, which the `LLM`
keywords and the CLI flags derive from), engine_config (`EngineConfig`, the resolved and frozen settings every
part reads), kv_events_config (`KVEventsConfig`), speculative_config (`SpeculativeConfig`), logging_config (the
`nv_*` loggers' format and level). Environment variables are read in `nv_engine.envs` only."""
