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
the place and the problem), and bounds its *cost* (:func:`cost`): the steps its
evaluation takes at most, whatever the message. :func:`compile_filter` turns a checked
filter into a :class:`CompiledFilter` once (paths split, each ``$in``/``$nin`` of plain
values a set), which fan-out then asks of every message; :func:`evaluate` is the
reference it agrees with (the grammar read literally, no preparation). All pure.

Why a cost: a publish evaluates the filter of every subscribed endpoint of its tenant
on the serving event loop, so what one tenant's filters take per message is time every
other request waits. Bounding each filter's cost, and the sum over a tenant's
endpoints, when they are saved bounds that work per publish by a number the operator
chose, not by what a tenant wrote.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from relaybox.errors import RelayboxError
from relaybox.wire import parse_json

__all__ = [
    "COST_RULE",
    "MISSING",
    "OPERATORS",
    "CompiledFilter",
    "InvalidFilter",
    "check",
    "compile_filter",
    "cost",
    "evaluate",
    "json_equal",
    "matching",
    "parse",
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


def parse(text: str, *, max_depth: int, max_bytes: int, max_cost: int | None = None) -> Any:
    """A filter written as JSON text (a form's field, a command's option), parsed and
    :func:`check`-ed. Text nested too deep for the parser is refused like any other
    bad JSON (:class:`InvalidFilter`), never a crash."""
    try:
        spec = parse_json(text)  # strict: NaN, Infinity and 1e999 are not JSON
    except RecursionError:
        raise InvalidFilter(
            f"filter: nested too deep to read, over the limit of {max_depth}"
        ) from None
    except ValueError as exc:
        raise InvalidFilter(f"filter: not valid JSON ({exc})") from None
    return check(spec, max_depth=max_depth, max_bytes=max_bytes, max_cost=max_cost)


def check(
    spec: Any, *, max_depth: int, max_bytes: int, max_cost: int | None = None
) -> dict[str, Any]:
    """Validate ``spec`` as a filter; returns it. Raises :class:`InvalidFilter` for
    anything outside the grammar, a document nested deeper than ``max_depth`` levels
    (objects and lists), longer than ``max_bytes`` as compact JSON, or costing more
    than ``max_cost`` steps (:func:`cost`; ``None``: any)."""
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
    if max_cost is not None and (steps := cost(spec)) > max_cost:
        raise InvalidFilter(
            f"filter: {steps:,} steps to evaluate, over the limit of {max_cost:,} ({COST_RULE})"
        )
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


# -- cost --------------------------------------------------------------------------------

COST_RULE = (
    "a step is each key of a path, each operator, each $and/$or branch, and each value"
    " of a list or object compared whole; a $in or $nin of plain values is one step"
)
"""How :func:`cost` counts, in the words its refusals use."""

_WHOLE = (list, dict)


def _values(value: Any) -> int:
    """How many JSON values ``value`` is made of (itself included): what comparing it
    whole visits at most."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def cost(spec: Mapping[str, Any]) -> int:
    """The most steps :meth:`CompiledFilter.holds` takes for the checked filter
    ``spec``, whatever the message (:data:`COST_RULE`): each key of each path (a
    lookup), each operator (a comparison), each value of a list or object an
    operator compares whole (``$eq``/``$neq`` operands, and the list and object items
    of ``$in``/``$nin``, compared one by one), each branch of ``$and``/``$or``. The
    plain values (strings, numbers, booleans, null) of ``$in``/``$nin`` cost nothing
    more: they are one set lookup. A step is a bounded piece of work (what varies is
    bounded by the filter's own strings and numbers, and a string of the message is
    hashed once per message, not per filter), so the cost bounds the time a filter
    takes per message; ``filter_max_cost`` and ``filter_tenant_max_cost`` bound it
    when it is saved."""
    total = 0
    for key, value in spec.items():
        if key in ("$and", "$or"):
            total += sum(1 + cost(sub) for sub in value)
            continue
        total += key.count(".") + 1
        condition = value.items() if isinstance(value, dict) else (("$eq", value),)
        for op, operand in condition:
            total += 1
            if op in ("$eq", "$neq") and isinstance(operand, _WHOLE):
                total += _values(operand)
            elif op in ("$in", "$nin") and not _plain(operand):
                total += sum(_values(item) for item in operand if isinstance(item, _WHOLE))
    return total


_PLAIN = frozenset({str, int, float, type(None)})


def _plain(items: list[Any]) -> bool:
    """Whether ``items`` holds only strings, numbers and nulls (no boolean, list or
    object): told without a Python-level loop, since a list of ``$in`` may be long."""
    return set(map(type, items)) <= _PLAIN


# -- compiled evaluation -------------------------------------------------------------------

_BOOL = object()


def _scalar_key(value: Any) -> Any:
    """A plain JSON value as a set member that is equal exactly when :func:`json_equal`
    says so: numbers are Python numbers already (``1 == 1.0``, equal hashes), strings
    and null themselves; booleans are tagged, since Python's ``True == 1``."""
    if value is True or value is False:
        return (_BOOL, value)
    return value


Test = Callable[[Any], bool]
"""A compiled piece of a filter: the document (or a value found in it) -> holds."""


@dataclass(frozen=True, slots=True, eq=False)
class CompiledFilter:
    """A checked filter ready to be asked of many messages (:func:`compile_filter`):
    its paths split once, every ``$in``/``$nin`` of plain values a frozenset, and its
    :func:`cost`. :meth:`holds` agrees with :func:`evaluate` on every document."""

    cost: int
    """At most this many steps per message (:func:`cost`)."""
    test: Test

    def holds(self, document: Any) -> bool:
        """Whether the filter holds for ``document`` (the envelope, as ``json.loads``
        gives it)."""
        return self.test(document)


def compile_filter(spec: Mapping[str, Any]) -> CompiledFilter:
    """The checked filter ``spec`` made ready to evaluate (:class:`CompiledFilter`).
    Takes time and memory in proportion to the filter's size, once."""
    return CompiledFilter(cost(spec), _compile(spec))


def _compile(spec: Mapping[str, Any]) -> Test:
    tests: list[Test] = []
    for key, value in spec.items():
        if key == "$and":
            tests.append(_all([_compile(sub) for sub in value]))
        elif key == "$or":
            tests.append(_any([_compile(sub) for sub in value]))
        else:
            condition = value.items() if isinstance(value, dict) else (("$eq", value),)
            tests.append(_entry(key, [_condition(op, operand) for op, operand in condition]))
    return tests[0] if len(tests) == 1 else _all(tests)


def _all(tests: list[Test]) -> Test:
    def holds(found: Any) -> bool:
        for test in tests:
            if not test(found):
                return False
        return True

    return holds


def _any(tests: list[Test]) -> Test:
    def holds(found: Any) -> bool:
        for test in tests:
            if test(found):
                return True
        return False

    return holds


def _entry(path: str, conditions: list[Test]) -> Test:
    """``path: condition``: the value at ``path`` (split once; a key of digits also
    its list index), and every operator of the condition on it."""
    steps = tuple(
        (part, int(part) if part.isdigit() and part.isascii() else None) for part in path.split(".")
    )
    condition = conditions[0] if len(conditions) == 1 else _all(conditions)

    def holds(document: Any) -> bool:
        node = document
        for part, index in steps:
            if isinstance(node, Mapping):
                node = node.get(part, MISSING)
                if node is MISSING:
                    break
            elif index is not None and isinstance(node, list) and index < len(node):
                node = node[index]
            else:
                node = MISSING
                break
        return condition(node)

    return holds


_ORDERS: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": operator.gt,
    "$gte": operator.ge,
    "$lt": operator.lt,
    "$lte": operator.le,
}


def _condition(op: str, operand: Any) -> Test:
    """One operator of a condition, as a test of the value found (maybe MISSING)."""
    if op in ("$eq", "$neq"):
        if isinstance(operand, _WHOLE):
            same = operand

            def equal(value: Any) -> bool:
                return json_equal(value, same)

        else:
            key = _scalar_key(operand)

            def equal(value: Any) -> bool:
                # A list, an object or MISSING is never equal to a plain value.
                return not isinstance(value, _WHOLE) and _scalar_key(value) == key

        return equal if op == "$eq" else _negated(equal)
    if op in ("$in", "$nin"):
        member = _member(operand)
        return member if op == "$in" else _negated(member)
    if op == "$exists":
        wanted = bool(operand)
        return lambda value: (value is not MISSING) is wanted
    compare = _ORDERS[op]
    if isinstance(operand, str):
        return lambda value: isinstance(value, str) and compare(value, operand)
    return lambda value: (
        isinstance(value, int | float) and not isinstance(value, bool) and compare(value, operand)
    )


def _negated(test: Test) -> Test:
    return lambda value: not test(value)


_SMALL = 8
"""A ``$in`` of at most this many plain values is a tuple, not a set: as quick to
search, and a quarter of the memory (a filter may hold a hundred of them)."""


def _member(operand: list[Any]) -> Test:
    """``$in``: plain values looked up in a set (:func:`_scalar_key`), lists and
    objects compared whole one by one (what :func:`cost` counts for them)."""
    whole: tuple[Any, ...] = ()
    if _plain(operand):  # their own keys (:func:`_scalar_key`): one set built in C
        keys: Any = operand
    else:
        keys = [_scalar_key(x) for x in operand if not isinstance(x, _WHOLE)]
        whole = tuple(x for x in operand if isinstance(x, _WHOLE))
    # Membership by ==, as in a set (no key is NaN: filters hold finite numbers only).
    plain: frozenset[Any] | tuple[Any, ...] = (
        tuple(keys) if len(keys) <= _SMALL else frozenset(keys)
    )

    def holds(value: Any) -> bool:
        if isinstance(value, _WHOLE):
            for item in whole:
                if json_equal(value, item):
                    return True
            return False
        return value is not MISSING and _scalar_key(value) in plain

    return holds
