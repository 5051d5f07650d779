"""Payload filters (relaybox.outbound.filters): hypothesis checks evaluate() against a
reference evaluator written here from the documented grammar, and the compiled filters
fan-out runs (compile_filter) against evaluate(); check() refuses what is outside the
grammar with a message naming the place, and what costs more than its bound; cost()
bounds the work of an evaluation. No database."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaybox.outbound.filters import (
    InvalidFilter,
    check,
    compile_filter,
    cost,
    evaluate,
    parse,
)

BOUNDS = {"max_depth": 8, "max_bytes": 4096}

# -- the reference: the grammar of docs/sending.md, read literally ------------------------

_ABSENT = object()


def ref_lookup(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if type(doc) is dict and key in doc:
            doc = doc[key]
        elif type(doc) is list and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return _ABSENT
    return doc


def ref_same(a: Any, b: Any) -> bool:
    # Compare canonical JSON texts, numbers as floats: 1 and 1.0 are one number,
    # true is not 1 (json writes booleans as true/false).
    def canon(v: Any) -> Any:
        if type(v) is bool or v is None or type(v) is str:
            return v
        if type(v) in (int, float):
            return ("n", float(v))
        if type(v) is list:
            return ["l", *[canon(x) for x in v]]
        return {k: canon(x) for k, x in v.items()}

    return json.dumps(canon(a), sort_keys=True) == json.dumps(canon(b), sort_keys=True)


def ref_order(value: Any, op: str, bound: Any) -> bool:
    both_numbers = all(type(x) in (int, float) for x in (value, bound))
    both_strings = type(value) is str and type(bound) is str
    if not (both_numbers or both_strings):
        return False
    return {
        "$gt": value > bound,
        "$gte": value >= bound,
        "$lt": value < bound,
        "$lte": value <= bound,
    }[op]


def ref_condition(value: Any, op: str, operand: Any) -> bool:
    there = value is not _ABSENT
    if op == "$exists":
        return there == operand
    if op == "$neq":
        return not there or not ref_same(value, operand)
    if op == "$nin":
        return not there or all(not ref_same(value, x) for x in operand)
    if not there:
        return False
    if op == "$eq":
        return ref_same(value, operand)
    if op == "$in":
        return any(ref_same(value, x) for x in operand)
    return ref_order(value, op, operand)


def ref_match(spec: dict[str, Any], doc: Any) -> bool:
    results = []
    for key, value in spec.items():
        if key == "$and":
            results.append(all(ref_match(s, doc) for s in value))
        elif key == "$or":
            results.append(any(ref_match(s, doc) for s in value))
        elif type(value) is dict:
            found = ref_lookup(doc, key)
            results.append(all(ref_condition(found, op, x) for op, x in value.items()))
        else:
            results.append(ref_condition(ref_lookup(doc, key), "$eq", value))
    return all(results)


# -- strategies ---------------------------------------------------------------------------

KEYS = ["a", "b", "c", "0", "1"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, 1.5, -2.5]),
    st.sampled_from(["", "PT", "BR", "a", "b", "2026-01-01T00:00:00Z"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
paths = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3).map(".".join)
orderable = st.one_of(
    st.integers(-3, 3), st.sampled_from([0.5, -1.5]), st.sampled_from(["", "a", "b", "PT"])
)
operators = st.one_of(
    st.tuples(st.sampled_from(["$eq", "$neq"]), values),
    st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(values, max_size=3)),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), orderable),
    st.tuples(st.just("$exists"), st.booleans()),
)
conditions = st.one_of(
    scalars,
    st.lists(scalars, max_size=2),
    st.lists(operators, min_size=1, max_size=3).map(dict),
)
filters = st.recursive(
    st.dictionaries(paths, conditions, max_size=3),
    lambda inner: st.one_of(
        st.dictionaries(paths, conditions, max_size=2),
        st.builds(
            lambda op, subs, rest: {**rest, op: subs},
            st.sampled_from(["$and", "$or"]),
            st.lists(inner, min_size=1, max_size=3),
            st.dictionaries(paths, conditions, max_size=2),
        ),
    ),
    max_leaves=6,
)


def all_paths(doc: Any, prefix: str = "") -> list[str]:
    """Every path that leads somewhere in ``doc``."""
    found = []
    items = doc.items() if type(doc) is dict else enumerate(doc) if type(doc) is list else ()
    for key, value in items:
        path = f"{prefix}{key}"
        found.append(path)
        found.extend(all_paths(value, path + "."))
    return found


@st.composite
def conditions_on(draw: st.DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """One path and one condition, often a path of ``doc`` and an operand equal (or
    near) to its value there, so that every operator is seen holding and failing."""
    present = [p for p in all_paths(doc) if all(k != "" for k in p.split("."))]
    if present and draw(st.booleans()):
        path = draw(st.sampled_from(present))
    else:
        path = draw(paths)
    found = ref_lookup(doc, path)
    # The value itself, and its look-alikes of other JSON types (true / 1 / 1.0 / "1").
    twins = [] if found is _ABSENT else [found]
    if type(found) in (bool, int, float):
        twins += [int(found), float(found), str(int(found)), bool(found)]
    alike = st.one_of(st.sampled_from(twins), values) if twins else values
    op = draw(
        st.sampled_from(
            ["=", "$eq", "$neq", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists"]
        )
    )
    if op == "=":
        literal = draw(alike)
        if type(literal) is dict:
            return {path: {"$eq": literal}}
        return {path: literal}
    if op in ("$eq", "$neq"):
        return {path: {op: draw(alike)}}
    if op in ("$in", "$nin"):
        return {path: {op: draw(st.lists(alike, max_size=3))}}
    if op == "$exists":
        return {path: {op: draw(st.booleans())}}
    usable = type(found) in (int, float, str)
    return {path: {op: draw(st.one_of(st.just(found), orderable) if usable else orderable)}}


@st.composite
def focused(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = draw(documents)
    parts = draw(st.lists(conditions_on(doc), min_size=1, max_size=3))
    shape = draw(st.sampled_from(["one", "and", "or", "merged"]))
    if shape == "one":
        spec = parts[0]
    elif shape == "merged":
        spec = {k: v for part in parts for k, v in part.items()}
    else:
        spec = {f"${shape}": parts}
    return spec, doc


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=focused())
def test_each_operator_agrees_with_the_reference(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    spec, doc = case
    assert check(spec, max_depth=64, max_bytes=1 << 20) == spec
    assert evaluate(spec, doc) is ref_match(spec, doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=filters, doc=documents)
def test_evaluate_agrees_with_the_reference(spec: dict[str, Any], doc: dict[str, Any]) -> None:
    assert check(spec, max_depth=64, max_bytes=1 << 20) == spec
    assert evaluate(spec, doc) is ref_match(spec, doc)


@settings(max_examples=150, deadline=None)
@given(spec=filters, doc=documents)
def test_a_filter_agrees_with_its_json_round_trip(spec: dict[str, Any], doc: Any) -> None:
    # Stored as JSON text and read back: the same answer.
    again = json.loads(json.dumps(spec))
    assert evaluate(again, json.loads(json.dumps(doc))) is evaluate(spec, doc)


@settings(max_examples=100, deadline=None)
@given(spec=filters, doc=documents)
def test_or_and_and_combine_as_documented(spec: dict[str, Any], doc: dict[str, Any]) -> None:
    either = {"$or": [spec, {"a": {"$exists": True}}]}
    assert evaluate(either, doc) is (evaluate(spec, doc) or "a" in doc)
    assert evaluate({"$and": [spec, spec]}, doc) is evaluate(spec, doc)


# -- examples from the documentation --------------------------------------------------------

ENVELOPE = {
    "id": "msg_1",
    "type": "order.paid",
    "timestamp": "2026-03-01T10:00:00.000Z",
    "data": {
        "customer": {"country": "PT", "vip": True, "tags": ["b2b"]},
        "amount": 120,
        "items": [{"sku": "A-1"}, {"sku": "B-2"}],
        "note": None,
    },
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, True),
        ({"data.customer.country": {"$in": ["PT", "BR"]}}, True),
        ({"data.customer.country": {"$nin": ["PT", "BR"]}}, False),
        ({"data.customer.country": "PT"}, True),
        ({"data.amount": {"$gte": 100, "$lt": 200}}, True),
        ({"data.amount": {"$gt": 120}}, False),
        ({"data.amount": 120.0}, True),
        ({"data.amount": {"$gt": "100"}}, False),  # a number is not ordered with a string
        ({"data.customer.vip": 1}, False),  # true is not 1
        ({"data.items.1.sku": "B-2"}, True),
        ({"data.items.2.sku": {"$exists": False}}, True),
        ({"data.note": {"$exists": True}}, True),  # null exists
        ({"data.note": None}, True),
        ({"data.missing": {"$neq": "x"}}, True),  # missing: $neq holds
        ({"data.missing": {"$eq": None}}, False),  # missing is not null
        ({"data.customer.tags": ["b2b"]}, True),
        ({"data.customer": {"$eq": {"country": "PT", "vip": True, "tags": ["b2b"]}}}, True),
        ({"timestamp": {"$gte": "2026-03-01T00:00:00.000Z"}}, True),
        ({"$or": [{"type": "order.refunded"}, {"data.amount": {"$lte": 120}}]}, True),
        ({"$and": [{"type": "order.paid"}, {"data.customer.country": "BR"}]}, False),
    ],
)
def test_documented_examples(spec: dict[str, Any], expected: bool) -> None:
    assert evaluate(check(spec, **BOUNDS), ENVELOPE) is expected


# -- what check() refuses ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "filter: an object of conditions, not a list"),
        ({"data.a": {"$regex": "x"}}, "data.a.$regex: unknown operator $regex"),
        ({"$nor": []}, "$nor: unknown operator $nor"),
        ({"$in": [1]}, "$in: $in applies to a path"),
        ({"data.a": {"$in": "PT"}}, "data.a.$in: a list of values, not a string"),
        ({"data.a": {"$nin": {"x": 1}}}, "data.a.$nin: a list of values, not an object"),
        ({"data.a": {"$gt": True}}, "data.a.$gt: a number or a string, not a boolean"),
        ({"data.a": {"$lte": [1]}}, "data.a.$lte: a number or a string, not a list"),
        ({"data.a": {"$exists": 1}}, "data.a.$exists: true or false, not a number"),
        ({"data.a": {"$or": []}}, "data.a.$or: $or joins filters"),
        ({"$or": []}, "$or: a non-empty list of filters, not a list"),
        ({"$and": {"a": 1}}, "$and: a non-empty list of filters, not an object"),
        ({"$or": [{"a": 1}, "b"]}, "$or[1]: a filter (an object), not a string"),
        ({"$or": [{"a": {"$bad": 1}}]}, "$or[0].a.$bad: unknown operator $bad"),
        ({"data..a": 1}, "data..a: a path is dot-separated non-empty keys"),
        ({"": 1}, "filter: a path is dot-separated non-empty keys"),
        ({"data": {"customer": "PT"}}, "data: 'customer' is not an operator"),
        ({"data.a": {}}, "data.a: an empty object"),
        ({"data.a": float("nan")}, "data.a: a finite number"),
        ({"data.a": {"$eq": float("inf")}}, "data.a.$eq: a finite number"),
    ],
)
def test_check_names_the_problem(spec: Any, message: str) -> None:
    with pytest.raises(InvalidFilter) as caught:
        check(spec, **BOUNDS)
    assert str(caught.value).startswith(message), str(caught.value)


def test_check_bounds_depth_and_size() -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(10):
        deep = {"$and": [deep]}
    with pytest.raises(InvalidFilter, match=r"^filter: nested 21 levels deep, over the limit of 8"):
        check(deep, **BOUNDS)
    big = {"data.a": {"$in": list(range(2000))}}
    with pytest.raises(InvalidFilter, match=r"^filter: \d+ bytes as JSON, over the limit of 4096"):
        check(big, **BOUNDS)
    very_deep: Any = 1
    for _ in range(100_000):
        very_deep = [very_deep]
    with pytest.raises(InvalidFilter, match=r"not a JSON document|levels deep"):
        check({"a": very_deep}, **BOUNDS)


# -- compiled filters and their cost --------------------------------------------------------

# Values that JSON equality tells apart where Python's does not (true / 1 / 1.0 / "1"),
# and lists and objects inside $in and $nin, which the compiled filter compares whole.
twins = st.sampled_from([0, 1, -1, 0.0, 1.0, -0.0, 2.5, True, False, None, "1", "", 10**20, 1e20])
wide_values = st.recursive(
    st.one_of(scalars, twins),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
wide_documents = st.dictionaries(st.sampled_from(KEYS), wide_values, max_size=4)
wide_operators = st.one_of(
    st.tuples(st.sampled_from(["$eq", "$neq"]), wide_values),
    st.tuples(st.sampled_from(["$in", "$nin"]), st.lists(wide_values, max_size=6)),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), orderable),
    st.tuples(st.just("$exists"), st.booleans()),
)
wide_filters = st.recursive(
    st.dictionaries(paths, st.lists(wide_operators, min_size=1, max_size=3).map(dict), max_size=3),
    lambda inner: st.builds(
        lambda op, subs, rest: {**rest, op: subs},
        st.sampled_from(["$and", "$or"]),
        st.lists(inner, min_size=1, max_size=3),
        st.dictionaries(paths, conditions, max_size=2),
    ),
    max_leaves=6,
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=focused())
def test_compiled_filters_agree_with_evaluate_on_each_operator(
    case: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    spec, doc = case
    assert compile_filter(spec).holds(doc) is evaluate(spec, doc)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.one_of(filters, wide_filters), doc=st.one_of(documents, wide_documents))
def test_compiled_filters_agree_with_evaluate(spec: dict[str, Any], doc: dict[str, Any]) -> None:
    check(spec, max_depth=64, max_bytes=1 << 20)
    compiled = compile_filter(spec)
    assert compiled.holds(doc) is evaluate(spec, doc)
    # As fan-out reads them: the filter from its stored text, the envelope from its.
    stored = compile_filter(json.loads(json.dumps(spec)))
    assert stored.holds(json.loads(json.dumps(doc))) is evaluate(spec, doc)
    assert stored.cost == compiled.cost == cost(spec)


@pytest.mark.parametrize(
    ("value", "operand", "expected"),
    [
        (1, [True], False),  # true is not 1, though True == 1 in Python
        (True, [1, 1.0], False),
        (True, [True], True),
        (0, [False, None, "0"], False),
        (1.0, [1], True),  # 1 equals 1.0
        (-0.0, [0], True),
        (10**20, [1e20], True),
        (10**20 + 1, [1e20], False),
        ([1, True], [[1, True]], True),
        ([1, True], [[1, 1]], False),
        ({"a": [1]}, [{"a": [1.0]}], True),
        (None, [None], True),
    ],
)
def test_in_compares_as_json(value: Any, operand: list[Any], expected: bool) -> None:
    doc = {"data": {"v": value}}
    for op, holds in (("$in", expected), ("$nin", not expected)):
        spec = {"data.v": {op: operand}}
        assert compile_filter(spec).holds(doc) is holds is evaluate(spec, doc)


@pytest.mark.parametrize(
    ("spec", "steps"),
    [
        ({}, 0),
        ({"type": "order.paid"}, 2),  # one path key, one operator
        ({"data.customer.country": {"$in": ["PT", "BR"]}, "data.amount": {"$gte": 100}}, 7),
        ({"data.v": {"$in": [0] * 2030}}, 3),  # a set: one lookup however long
        ({"data.v": {"$in": [[1, 2], {"a": 1}, 3]}}, 3 + 3 + 2),  # lists/objects whole
        ({"data.v": {"$eq": [1, [2]]}}, 3 + 4),
        ({"data.v": {"$gt": 1, "$lt": 5}}, 4),
        ({"$or": [{"a": 1}, {"b.c": 2}]}, (1 + 2) + (1 + 3)),
        ({"$and": [{"$or": [{"a": 1}]}], "b": 1}, (1 + (1 + 2)) + 2),
    ],
)
def test_cost_counts_steps(spec: dict[str, Any], steps: int) -> None:
    assert cost(spec) == steps == compile_filter(spec).cost


def test_check_bounds_the_cost() -> None:
    many = {f"data.k{i}": i for i in range(100)}  # 3 steps each
    assert check(many, **BOUNDS, max_cost=300) == many
    with pytest.raises(
        InvalidFilter, match=r"^filter: 300 steps to evaluate, over the limit of 299 \(a step is"
    ):
        check(many, **BOUNDS, max_cost=299)
    # The largest $in that fits the size costs next to nothing: it is a set.
    zeros = {"data.v": {"$in": [0] * 2030}}
    assert check(zeros, **BOUNDS, max_cost=3) == zeros


def test_parse_reads_text_and_refuses_what_json_cannot_read() -> None:
    assert parse(' {"data.v": 1} ', **BOUNDS) == {"data.v": 1}
    with pytest.raises(InvalidFilter, match=r"^filter: not valid JSON"):
        parse("{nope", **BOUNDS)
    with pytest.raises(InvalidFilter, match=r"^data\.v\.\$gt: a number or a string"):
        parse('{"data.v": {"$gt": [1]}}', **BOUNDS)
    # Deeper than the parser's stack: a refusal like any other, never RecursionError.
    deep = '{"a": ' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(InvalidFilter, match=r"^filter: nested too deep to read"):
        parse(deep, **BOUNDS)
    shallow_enough = '{"a": {"$eq": ' + "[" * 500 + "]" * 500 + "}}"
    with pytest.raises(InvalidFilter, match=r"^filter: nested 502 levels deep"):
        parse(shallow_enough, **BOUNDS)
