"""Payload filters: which messages of its event types an endpoint receives.

A filter is a JSON object matched against the message's envelope (``id``, ``type``,
``timestamp``, ``data``, ``apiVersion``), in the style of Hookdeck's and Convoy's
filters (MongoDB query operators on dotted paths)::

    {"data.customer.country": {"$in": ["PT", "BR"]}, "data.amount": {"$gte": 100}}

The grammar (docs/sending.md has the whole reference):

- A filter is an object; every entry must hold (``{}`` holds for every message). An
  entry is ``path: condition``, ``"$and": [filter, ...]`` or ``"$or": [filter, ...]``
  (lists of at least one filter).
- A path is dot-separated keys walked from the envelope (``data.customer.country``); a
  key made of digits indexes a list (``data.items.0.sku``). A path that leads nowhere
  is *missing*.
- A condition is a value (string, number, boolean, null or a list), meaning ``$eq``,
  or an object of operators, all of which must hold: ``$eq`` and ``$neq`` (any JSON
  value), ``$in`` and ``$nin`` (a list), ``$gt``, ``$gte``, ``$lt``, ``$lte`` (a number
  or a string), ``$exists`` (a boolean). To compare with an object, use ``$eq``.
- Values compare as JSON: ``1`` equals ``1.0``, ``true`` is not ``1``, lists and
  objects compare whole. Order compares numbers with numbers and strings with strings
  (by code point, so ISO 8601 times in one format order correctly); otherwise it does
  not hold. A missing value fails every operator but ``$neq``, ``$nin`` and
  ``$exists: false``; ``null`` is a value (it exists).

:func:`check` validates a filter once, when it is saved (:class:`InvalidFilter` names
the place and the problem); :func:`evaluate` runs at fan-out and assumes a checked
filter. Both are pure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from relaybox.errors import RelayboxError

__all__ = [
    "MISSING",
    "OPERATORS",
    "InvalidFilter",
    "check",
    "evaluate",
    "json_equal",
    "matching",
    "resolve",
]

OPERATORS = frozenset(
    {"$eq", "$neq", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists", "$and", "$or"}
)
"""Every operator of the grammar ($and, $or join filters; the others are conditions)."""

_CONDITIONS = ("$eq", "$neq", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists")
_ORDER = ("$gt", "$gte", "$lt", "$lte")


class InvalidFilter(RelayboxError, ValueError):
    """A filter relaybox refuses; the message names where (``$or[1].data.amount``) and
    what is wrong. Answered 422 ``invalid_filter``."""


class _Missing:
    """A path that leads nowhere (distinct from JSON null)."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def check(spec: Any, *, max_depth: int, max_bytes: int) -> dict[str, Any]:
    """Validate ``spec`` as a filter; returns it. Raises :class:`InvalidFilter` for
    anything outside the grammar, a document nested deeper than ``max_depth`` levels
    (objects and lists) or longer than ``max_bytes`` as compact JSON."""
    try:
        size = len(json.dumps(spec, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError, RecursionError):
        raise InvalidFilter("filter: not a JSON document") from None
    if size > max_bytes:
        raise InvalidFilter(f"filter: {size} bytes as JSON, over the limit of {max_bytes}")
    depth = _depth(spec)
    if depth > max_depth:
        raise InvalidFilter(f"filter: nested {depth} levels deep, over the limit of {max_depth}")
    if not isinstance(spec, dict):
        raise InvalidFilter(f"filter: an object of conditions, not {_kind(spec)}")
    _check_filter(spec, "")
    return spec


def _depth(value: Any) -> int:
    # Iterative: a document too deep for recursion is refused here, not by a crash.
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in node)
    return deepest


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where and not key.startswith("[") else f"{where}{key}"


def _check_filter(spec: dict[str, Any], where: str) -> None:
    for key, value in spec.items():
        here = _at(where, key)
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise InvalidFilter(f"{here}: a non-empty list of filters, not {_kind(value)}")
            for i, sub in enumerate(value):
                if not isinstance(sub, dict):
                    raise InvalidFilter(f"{here}[{i}]: a filter (an object), not {_kind(sub)}")
                _check_filter(sub, f"{here}[{i}]")
        elif key.startswith("$"):
            if key in OPERATORS:
                raise InvalidFilter(f"{here}: {key} applies to a path, as {{path: {{{key}: …}}}}")
            raise InvalidFilter(f"{here}: unknown operator {key} (known: {_known()})")
        else:
            _check_path(key, here)
            _check_condition(value, here)


def _known() -> str:
    return ", ".join(sorted(OPERATORS))


def _check_path(path: str, here: str) -> None:
    if not path or any(not part for part in path.split(".")):
        raise InvalidFilter(f"{here or 'filter'}: a path is dot-separated non-empty keys")


def _check_condition(value: Any, here: str) -> None:
    if not isinstance(value, dict):
        _check_value(value, here)
        return
    if not value:
        raise InvalidFilter(f'{here}: an empty object; use {{"$eq": {{}}}} to match one')
    plain = [k for k in value if not k.startswith("$")]
    if plain:
        raise InvalidFilter(
            f"{here}: {plain[0]!r} is not an operator; nested keys are written as a path"
            f" ({_at(here, plain[0])}), and an object is matched with $eq"
        )
    for op, operand in value.items():
        at = f"{here}.{op}" if here else op
        if op not in _CONDITIONS:
            if op in OPERATORS:
                raise InvalidFilter(f"{at}: {op} joins filters, it is not a condition on a path")
            raise InvalidFilter(f"{at}: unknown operator {op} (known: {_known()})")
        if op in ("$in", "$nin"):
            if not isinstance(operand, list):
                raise InvalidFilter(f"{at}: a list of values, not {_kind(operand)}")
            for i, item in enumerate(operand):
                _check_value(item, f"{at}[{i}]")
        elif op in _ORDER:
            if isinstance(operand, bool) or not isinstance(operand, int | float | str):
                raise InvalidFilter(f"{at}: a number or a string, not {_kind(operand)}")
            _check_value(operand, at)
        elif op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidFilter(f"{at}: true or false, not {_kind(operand)}")
        else:
            _check_value(operand, at)


def _check_value(value: Any, here: str) -> None:
    """A JSON value (finite numbers only)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidFilter(f"{here}: a finite number")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_value(item, f"{here}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            _check_value(item, f"{here}.{k}")
    elif value is not None and not isinstance(value, bool | int | float | str):
        raise InvalidFilter(f"{here}: not a JSON value")


# -- evaluation ------------------------------------------------------------------------


def resolve(document: Any, path: str) -> Any:
    """The value at a dotted ``path`` of ``document``, or :data:`MISSING`."""
    node = document
    for part in path.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return MISSING
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and part.isascii():
            index = int(part)
            if index >= len(node):
                return MISSING
            node = node[index]
        else:
            return MISSING
    return node


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: numbers by value (``1 == 1.0``), booleans only with
    booleans, lists and objects element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False


def _ordered(value: Any, op: str, operand: Any) -> bool:
    number = isinstance(operand, int | float) and not isinstance(operand, bool)
    if number:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
    elif not isinstance(value, str):
        return False
    if op == "$gt":
        return bool(value > operand)
    if op == "$gte":
        return bool(value >= operand)
    if op == "$lt":
        return bool(value < operand)
    return bool(value <= operand)


def _holds(value: Any, op: str, operand: Any) -> bool:
    present = value is not MISSING
    if op == "$eq":
        return present and json_equal(value, operand)
    if op == "$neq":
        return not (present and json_equal(value, operand))
    if op == "$in":
        return present and any(json_equal(value, x) for x in operand)
    if op == "$nin":
        return not (present and any(json_equal(value, x) for x in operand))
    if op == "$exists":
        return present is operand
    return present and _ordered(value, op, operand)


def evaluate(spec: Mapping[str, Any], document: Any) -> bool:
    """Whether the checked filter ``spec`` holds for ``document`` (the envelope)."""
    for key, value in spec.items():
        if key == "$and":
            if not all(evaluate(sub, document) for sub in value):
                return False
        elif key == "$or":
            if not any(evaluate(sub, document) for sub in value):
                return False
        else:
            found = resolve(document, key)
            if isinstance(value, dict):
                if not all(_holds(found, op, operand) for op, operand in value.items()):
                    return False
            elif not _holds(found, "$eq", value):
                return False
    return True


def matching(spec: Mapping[str, Any] | None, document: Any) -> bool:
    """:func:`evaluate`, with no filter (``None``) holding for every document."""
    return spec is None or evaluate(spec, document)
