"""Bounded JSON schemas the structured-output tests share (offline and through the server): nested objects,
required fields, enums, arrays with maxItems, booleans and null, integers with bounds, strings with maxLength,
anyOf, a pattern. Every string and array is bounded, so even random weights under the grammar finish them
within the tests' token budgets (a "length" finish is a failure)."""
from __future__ import annotations

SCHEMAS = [
    # nested objects, required fields
    {"type": "object", "additionalProperties": False, "required": ["user"],
     "properties": {"user": {"type": "object", "additionalProperties": False, "required": ["id", "name"],
                             "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                            "name": {"type": "string", "maxLength": 6}}}}},
    # enums
    {"type": "object", "additionalProperties": False, "required": ["color", "size"],
     "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}}},
    # an array with maxItems
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    # booleans and null, all required
    {"type": "object", "additionalProperties": False, "required": ["ok", "note"],
     "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}},
    # integers with bounds
    {"type": "object", "additionalProperties": False, "required": ["age", "year"],
     "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 99},
                    "year": {"type": "integer", "minimum": 1990, "maximum": 2030}}},
    # a string with maxLength
    {"type": "string", "maxLength": 5},
    # an array of objects with maxItems
    {"type": "array", "maxItems": 3,
     "items": {"type": "object", "additionalProperties": False, "required": ["k", "v"],
               "properties": {"k": {"enum": ["a", "b"]}, "v": {"type": "integer", "minimum": 0, "maximum": 9}}}},
    # anyOf
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"type": "string", "maxLength": 3}]},
    # a string pattern
    {"type": "string", "pattern": "^[a-z]{2,4}$"},
]
