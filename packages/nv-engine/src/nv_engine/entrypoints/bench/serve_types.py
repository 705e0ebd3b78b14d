"""The plain records of `nv bench serve` (picklable: they cross into and out of the client workers): a
request as the client sends it, the settings every request shares, and what the client measured."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchServeRequest:
    """A prompt (token ids for /v1/completions, or text) and the tokens to ask for. extra_body: more fields of
    the request body (a JSON schema's response_format, ignore_eos, ...), merged over the benchmark's own."""

    prompt: str | list[int]
    output_len: int
    prompt_len: int | None = None    # None for a text prompt: the server's usage tells
    extra_body: dict | None = None


@dataclass
class RequestRecord:
    """What the client saw of one request (seconds, from the worker's monotonic clock).

    itl: one entry per output token after the first (per_token) or per streamed chunk after the first
    (not per_token: the server sent no per-chunk usage)."""

    index: int
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    num_chunks: int = 0           # chunks that carried output
    start: float = 0.0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list[float] = field(default_factory=list)
    per_token: bool = False       # the server sent usage in every chunk: itl is per token

    @property
    def tpot(self) -> float | None:
        """(e2el - ttft) / (outputs - 1): outputs are tokens (per_token) or chunks; None with fewer than 2."""
        outputs = self.output_tokens if self.per_token else self.num_chunks
        return (self.e2el - self.ttft) / (outputs - 1) if outputs > 1 else None


@dataclass(frozen=True)
class ClientSettings:
    """What every worker sends with each request."""

    url: str                       # base URL + endpoint
    model: str
    chat: bool                     # /v1/chat/completions (messages) rather than /v1/completions
    temperature: float
    ignore_eos: bool
    api_key: str | None
    request_timeout_s: float = 6 * 3600.0
