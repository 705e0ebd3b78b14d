"""StructuredOutputsParams: the constraint one request's output must follow (vLLM's shape)."""
from __future__ import annotations

import copy
import json as json_module
from dataclasses import dataclass, fields

_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """Exactly one of:

    json: a JSON schema (a dict, or its JSON text); the output is one JSON value it accepts,
        written compactly (no free whitespace, so a model cannot spin on blanks);
    json_object: True; the output is one JSON object;
    regex: the output matches this regular expression;
    choice: the output is one of these strings;
    grammar: an EBNF / GBNF grammar (rule `root`), in xgrammar's dialect;
    structural_tag: xgrammar's structural tag, as JSON text.

    ValueError on construction when none or several are set, or a value has the wrong type; the
    engine compiles the constraint when the request is added (ValueError there for a schema,
    regex or grammar that does not parse).
    """

    json: str | dict | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        if self.json_object is False:
            self.json_object = None
        given = [name for name in _KINDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("structured_outputs takes exactly one of json, json_object, regex, choice, "
                             f"grammar, structural_tag; got {', '.join(given) if given else 'none'}")
        if self.json is not None:
            self.json = _schema_dict(self.json)
        if self.json_object is not None and self.json_object is not True:
            raise ValueError(f"structured_outputs: json_object must be true, got {self.json_object!r}")
        for name in ("regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs: {name} must be a non-empty string, got {value!r}")
        if self.structural_tag is not None:
            _json_value("structural_tag", self.structural_tag)
        if self.choice is not None:
            choice = self.choice
            if isinstance(choice, str) or not isinstance(choice, (list, tuple)):
                raise ValueError(f"structured_outputs: choice must be a list of strings, got {choice!r}")
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise ValueError("structured_outputs: choice must be a non-empty list of non-empty strings, "
                                 f"got {choice!r}")
            self.choice = list(choice)

    def __deepcopy__(self, memo: dict[int, object]) -> StructuredOutputsParams:
        """The copy an engine keeps of a request's params (SamplingParams.clone): a JSON schema is copied
        as a JSON tree (copy.deepcopy's bookkeeping costs several times more, for each request)."""
        clone = object.__new__(StructuredOutputsParams)
        for field in fields(self):
            setattr(clone, field.name, _copy_json(getattr(self, field.name), memo))
        return clone

    @property
    def kind(self) -> str:
        """Which constraint is set: one of json, json_object, regex, choice, grammar, structural_tag."""
        return next(name for name in _KINDS if getattr(self, name) is not None)

    @property
    def spec(self) -> str:
        """The constraint as one canonical string (with `kind`, the grammar cache's key)."""
        value = getattr(self, self.kind)
        if isinstance(value, str):
            return value
        return json_module.dumps(value, sort_keys=True, ensure_ascii=False)

    @property
    def cache_key(self) -> tuple[str, str]:
        return self.kind, self.spec


def _copy_json(value: object, memo: dict[int, object]) -> object:
    """A deep copy of a JSON value (dicts, lists, strings, numbers, booleans, None); anything else
    through copy.deepcopy."""
    if value is None or isinstance(value, (str, int, float)):     # immutable (bool is an int)
        return value
    if type(value) is dict:
        return {key: _copy_json(item, memo) for key, item in value.items()}
    if type(value) is list:
        return [_copy_json(item, memo) for item in value]
    return copy.deepcopy(value, memo)


def _json_value(name: str, text: str) -> object:
    try:
        return json_module.loads(text)
    except ValueError as exc:
        raise ValueError(f"structured_outputs: {name} is not valid JSON: {exc}") from None


def _schema_dict(schema: object) -> dict:
    """A JSON schema given as a dict or as JSON text -> the dict (ValueError otherwise)."""
    if isinstance(schema, str):
        schema = _json_value("json", schema)
    if isinstance(schema, bool):    # JSON Schema allows true / false; false accepts nothing
        if not schema:
            raise ValueError("structured_outputs: the json schema `false` accepts no output")
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError(f"structured_outputs: json must be a JSON schema object, got {schema!r}")
    return schema
