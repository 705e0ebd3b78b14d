"""Reasoning parsers: split a model's `<think>` text from its answer (chat completions' `reasoning`)."""
