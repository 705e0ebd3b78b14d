"""Speculative decoding on the host: SpeculativeDecoding (the engine core's side), the draft proposers NgramProposer
(prompt lookup) and DraftModelPlanner (a draft model's forwards, run by runner.draft_model_runner)."""
