"""Tool calls in chat completions: parsers that read calls out of a model's text (whole or as it
streams), the request's tools and tool_choice, and the per-choice output parser."""
