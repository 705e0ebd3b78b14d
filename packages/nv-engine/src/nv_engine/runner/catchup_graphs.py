"""CatchupGraphs: a draft model's catch-up forwards (draft_model speculative decoding) in full CUDA graphs.

In a drafting step the draft first computes the tokens it lags behind on (spec_decode.draft_model_planner): in
steady decoding 1 token per sequence (some drafts were rejected) or 2 (all were accepted: the last draft, which the
draft never took as input, and the bonus token). An eager forward of the draft costs a Python dispatch per kernel
(several ms for a 28-layer model), more than the forward itself at small batch. These graphs run such a catch-up in
the verify graphs' fixed layout (runner.verify_layout: every sequence gets Q = 1 + k rows, its tokens last, padding
rows in front that store nothing), one graph per batch size up to the most sequences a drafting step has. A catch-up
that does not fit (a prompt chunk, a draft that lags by more than Q tokens after steps without drafts, more
sequences) runs eagerly.
"""
from __future__ import annotations

from nv_engine.core.step import StepInput
from nv_engine.runner.verify_graphs import VerifyGraphs


class CatchupGraphs(VerifyGraphs):
    """VerifyGraphs over the draft model, for steps without drafts whose sequences have 1 to Q tokens each (the
    catch-up StepInputs of DraftInputs.catchup): `padded_size(step)`, `stage(padded, step)`, `replay(padded, B)`
    -> hidden [B * Q, H], whose StagedStep.logits_rows are the step's logits_indices (each drafting sequence's last
    token, at row b * Q + Q - 1)."""

    def padded_size(self, step: StepInput) -> int | None:
        """The captured batch size that runs this catch-up forward, or None (it does not fit: run it eagerly)."""
        if not self.graphs.graphs or not self.layout.holds(step):
            return None
        return self.graphs.padded_size(step.num_seqs)
