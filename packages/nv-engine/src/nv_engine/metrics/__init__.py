"""Engine metrics: per-step figures (IterationStats, FinishedRequestStats) that the frontend fills, a
RequestStatsTracker that fills them from the outputs of each step, and the stat loggers that consume
them once per step with the scheduler's SchedulerStats: PrometheusStatLogger (the `vllm:` metrics, vLLM's
names) and LoggingStatLogger (one INFO line per interval)."""
from nv_engine.metrics.iteration_stats import FinishedRequestStats, IterationStats
from nv_engine.metrics.logging_stat_logger import LoggingStatLogger
from nv_engine.metrics.prometheus_stat_logger import PrometheusStatLogger
from nv_engine.metrics.request_stats_tracker import RequestStatsTracker

__all__ = ["FinishedRequestStats", "IterationStats", "LoggingStatLogger", "PrometheusStatLogger",
           "RequestStatsTracker"]
