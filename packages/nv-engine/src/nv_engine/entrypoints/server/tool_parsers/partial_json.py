"""Scans JSON text that may still be growing (a model writing it token by token): where each value
starts and, once written, ends. Nothing is decoded here except object keys, so a caller can stream
the raw text of a value (a tool call's arguments) as it arrives."""
from __future__ import annotations

import json
from dataclasses import dataclass

_WHITESPACE = " \t\r\n"
_SCALAR_CHARS = frozenset("0123456789+-.eEtrufalsn")


class InvalidJson(ValueError):
    """The text cannot be the start of the JSON value the caller expects."""


@dataclass(frozen=True)
class JsonMember:
    """One `"key": value` of an object: the key decoded, the value as a span of the text."""

    key: str
    value_start: int
    value_end: int | None   # None: the value is still being written


@dataclass(frozen=True)
class JsonObjectScan:
    members: list[JsonMember]
    end: int | None          # one past the closing brace; None while the object is open


class PartialJson:
    """Positions in `text`; every method takes the index a value starts at (after whitespace)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def skip_whitespace(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in _WHITESPACE:
            i += 1
        return i

    def string_end(self, i: int) -> int | None:
        """One past the closing quote of the string opening at `i`; None while it is open."""
        text, j = self.text, i + 1
        while j < len(text):
            ch = text[j]
            if ch == "\\":
                j += 2
                continue
            if ch == '"':
                return j + 1
            j += 1
        return None

    def value_end(self, i: int) -> int | None:
        """One past the value starting at `i`; None while it is being written (a number or literal
        at the very end of the text counts as unfinished: more digits may follow)."""
        text = self.text
        if i >= len(text):
            return None
        ch = text[i]
        if ch == '"':
            return self.string_end(i)
        if ch in "{[":
            depth, j = 0, i
            while j < len(text):
                ch = text[j]
                if ch == '"':
                    end = self.string_end(j)
                    if end is None:
                        return None
                    j = end
                    continue
                if ch in "{[":
                    depth += 1
                elif ch in "}]":
                    depth -= 1
                    if depth == 0:
                        return j + 1
                j += 1
            return None
        if ch in _SCALAR_CHARS:
            j = i
            while j < len(text) and text[j] in _SCALAR_CHARS:
                j += 1
            return None if j == len(text) else j
        raise InvalidJson(f"unexpected {ch!r} at {i}")

    def scan_object(self, i: int) -> JsonObjectScan:
        """The members of the object opening at `i` written so far. Raises InvalidJson when the text
        cannot be the start of an object."""
        text, members = self.text, []
        if i >= len(text):
            return JsonObjectScan(members, None)
        if text[i] != "{":
            raise InvalidJson(f"expected an object at {i}, found {text[i]!r}")
        j = self.skip_whitespace(i + 1)
        if j < len(text) and text[j] == "}":
            return JsonObjectScan(members, j + 1)
        while j < len(text):
            if text[j] != '"':
                raise InvalidJson(f"expected a key at {j}, found {text[j]!r}")
            key_end = self.string_end(j)
            if key_end is None:
                break
            key = self.decode_string(j, key_end)
            j = self.skip_whitespace(key_end)
            if j >= len(text):
                break
            if text[j] != ":":
                raise InvalidJson(f"expected ':' at {j}, found {text[j]!r}")
            value_start = self.skip_whitespace(j + 1)
            if value_start >= len(text):
                members.append(JsonMember(key, value_start, None))
                break
            value_end = self.value_end(value_start)
            members.append(JsonMember(key, value_start, value_end))
            if value_end is None:
                break
            j = self.skip_whitespace(value_end)
            if j >= len(text):
                break
            if text[j] == "}":
                return JsonObjectScan(members, j + 1)
            if text[j] != ",":
                raise InvalidJson(f"expected ',' or '}}' at {j}, found {text[j]!r}")
            j = self.skip_whitespace(j + 1)
        return JsonObjectScan(members, None)

    def decode_string(self, start: int, end: int) -> str:
        try:
            value = json.loads(self.text[start:end])
        except ValueError as exc:
            raise InvalidJson(f"bad string at {start}: {exc}") from exc
        return str(value)
