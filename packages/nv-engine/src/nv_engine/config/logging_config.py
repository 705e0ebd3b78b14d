"""The log output of nv's packages: `configure_logging()` gives the `nv_*` loggers one stderr handler
with vLLM's line format (`INFO 12-01 02:30:00 [llm_engine.py:12] message`), at the level of the
NV_LOGGING_LEVEL environment variable (default INFO). The loggers then stop propagating to the root
logger, so a program's own logging setup (or none) neither hides nor repeats their lines."""
from __future__ import annotations

import logging
import sys
from typing import TextIO

from nv_engine import envs

LOGGER_NAMES = ("nv_engine", "nv_kvcache", "nv_kernels", "nv_layers", "nv_qwen3", "nv_llama")
LOG_FORMAT = "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"
LEVEL_ENV_VAR = envs.LOGGING_LEVEL


class _NvHandler(logging.StreamHandler):
    """The handler configure_logging installs (found again by its class, so a second call replaces it)."""


def configure_logging(level: str | int | None = None, stream: TextIO | None = None) -> None:
    """Configure the nv_* loggers (idempotent: a later call replaces the earlier handler). `level`:
    a logging level name or number; None: $NV_LOGGING_LEVEL, else INFO. ValueError for an unknown name."""
    if level is None:
        level = envs.logging_level() or "INFO"
    if isinstance(level, str):
        name = level.strip().upper()
        number = logging.getLevelName(name)
        if not isinstance(number, int):
            raise ValueError(f"unknown logging level {level!r} (from {LEVEL_ENV_VAR} or --log-level); use "
                             "DEBUG, INFO, WARNING, ERROR or CRITICAL")
        level = number
    handler = _NvHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    for logger_name in LOGGER_NAMES:
        logger = logging.getLogger(logger_name)
        for old in [h for h in logger.handlers if isinstance(h, _NvHandler)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
