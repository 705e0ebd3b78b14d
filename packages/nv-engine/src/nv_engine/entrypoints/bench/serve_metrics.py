"""The aggregate figures of one `nv bench serve` run: throughput, and mean / median / std / percentiles
(numpy's linear interpolation, as vLLM's benchmark) of TTFT, TPOT, ITL and E2E latency over the
successful requests, in milliseconds; printed as `vllm bench serve` prints them and as a JSON dict."""
from __future__ import annotations

import numpy as np

from nv_engine.entrypoints.bench.serve_types import RequestRecord

METRICS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}


class BenchServeMetrics:
    """Aggregates of the records of one run that lasted `duration_s`."""

    def __init__(self, records: list[RequestRecord], duration_s: float, selected: list[str] | None = None,
                 percentiles: list[float] | None = None) -> None:
        selected = ["ttft", "tpot", "itl"] if selected is None else selected
        unknown = [m for m in selected if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown percentile metric(s) {unknown}: choose from {sorted(METRICS)}")
        self.percentiles = [99.0] if percentiles is None else percentiles
        if any(not 0 <= p <= 100 for p in self.percentiles):
            raise ValueError(f"metric percentiles must be in [0, 100], got {self.percentiles}")
        if duration_s <= 0:
            raise ValueError(f"the run's duration must be positive, got {duration_s}")
        self.records = sorted(records, key=lambda r: r.index)
        self.duration_s = duration_s
        self.selected = selected
        self.ok = [r for r in self.records if r.success]
        # per chunk when any successful request came without per-chunk usage
        self.per_token = bool(self.ok) and all(r.per_token for r in self.ok)

    @property
    def unit(self) -> str:
        return "per token" if self.per_token else "per chunk"

    def samples_ms(self, metric: str) -> list[float]:
        """The metric's samples in ms: one per successful request (ITL: one per gap)."""
        if metric == "ttft":
            values = [r.ttft for r in self.ok]
        elif metric == "e2el":
            values = [r.e2el for r in self.ok]
        elif metric == "tpot":
            values = [t for r in self.ok if (t := r.tpot) is not None]
        else:
            values = [gap for r in self.ok for gap in r.itl]
        return [v * 1000.0 for v in values]

    def summary(self, metric: str) -> dict[str, float]:
        """mean/median/std and p{percentile} of the metric in ms (0.0 without samples, as vLLM)."""
        values = np.array(self.samples_ms(metric) or [0.0], dtype=np.float64)
        out = {f"mean_{metric}_ms": float(values.mean()), f"median_{metric}_ms": float(np.median(values)),
               f"std_{metric}_ms": float(values.std())}
        for p in self.percentiles:
            out[f"p{p:g}_{metric}_ms"] = float(np.percentile(values, p))
        return out

    def to_dict(self) -> dict:
        input_tokens = sum(r.prompt_len for r in self.ok)
        output_tokens = sum(r.output_tokens for r in self.ok)
        result: dict = {
            "duration": self.duration_s, "completed": len(self.ok), "failed": len(self.records) - len(self.ok),
            "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
            "request_throughput": len(self.ok) / self.duration_s,
            "output_throughput": output_tokens / self.duration_s,
            "total_token_throughput": (input_tokens + output_tokens) / self.duration_s,
            "itl_tpot_unit": self.unit,
        }
        for metric in METRICS:
            result.update(self.summary(metric))
        result.update(
            input_lens=[r.prompt_len for r in self.records], output_lens=[r.output_tokens for r in self.records],
            ttfts=[r.ttft for r in self.records], itls=[r.itl for r in self.records],
            e2els=[r.e2el for r in self.records], errors=[r.error for r in self.records])
        return result

    def table(self) -> str:
        """The result as `vllm bench serve` prints it (ITL and TPOT titles say "per chunk" when so)."""
        d = self.to_dict()
        lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

        def row(label: str, value: object) -> None:
            lines.append(f"{label:<40} {value:<10}")

        row("Successful requests:", d["completed"])
        row("Failed requests:", d["failed"])
        row("Benchmark duration (s):", f"{d['duration']:.2f}")
        row("Total input tokens:", d["total_input_tokens"])
        row("Total generated tokens:", d["total_output_tokens"])
        row("Request throughput (req/s):", f"{d['request_throughput']:.2f}")
        row("Output token throughput (tok/s):", f"{d['output_throughput']:.2f}")
        row("Total Token throughput (tok/s):", f"{d['total_token_throughput']:.2f}")
        for metric in self.selected:
            title = METRICS[metric]
            if metric in ("itl", "tpot") and not self.per_token:
                title += " (per chunk)"
            lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
            name = metric.upper()
            row(f"Mean {name} (ms):", f"{d[f'mean_{metric}_ms']:.2f}")
            row(f"Median {name} (ms):", f"{d[f'median_{metric}_ms']:.2f}")
            for p in self.percentiles:
                row(f"P{p:g} {name} (ms):", f"{d[f'p{p:g}_{metric}_ms']:.2f}")
        lines.append("=" * 50)
        return "\n".join(lines)
