"""Speculative decoding: draft proposers."""
