"""DraftAcceptance: one sequence's recent draft acceptance, as DraftLengthPolicy keeps it (the policy's docstring
says what the fields mean to it). A fresh one asks for a probe at once: a new request drafts in its first step."""
from __future__ import annotations


class DraftAcceptance:
    __slots__ = ("accepted", "asked", "backoff", "found", "resume_at", "streak", "tested")

    def __init__(self) -> None:
        # exponentially decayed counts over the sequence's drafting steps: draft tokens the target accepted, and
        # draft tokens it tested (the accepted ones plus the first rejected one, where one was); accepted <= tested
        self.accepted = 0.0
        self.tested = 0.0
        # -1: drafting as the estimate says; >= 0: drafting stopped, the next draft (a probe) once the sequence
        # holds this many tokens
        self.resume_at = 0
        self.backoff = 0      # tokens the next stop waits (0: the policy's shortest)
        self.streak = 0       # drafting steps since the last probe, while drafting goes on
        # exponentially decayed counts over the drafting steps that asked the sequence for drafts (its draft length
        # above 0): asked, and those in which the proposer found some (an ngram lookup may find nothing)
        self.asked = 0.0
        self.found = 0.0
