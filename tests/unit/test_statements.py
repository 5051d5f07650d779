"""``relaybox.store.statements``: the statements the asynchronous store and the
synchronous one both run, written once. Their steps are driven here by hand, without
a database: what each yields, and what it makes of the rows it is sent."""

from __future__ import annotations

from typing import Any

from relaybox.store import keys
from relaybox.store import statements as st
from relaybox.store.inbox_rows import NewAttempt, NewOperation, OutboxRow
from relaybox.store.outbox_rows import NewMessage


def drive(steps: st.Steps[Any], answers: list[list[Any]]) -> tuple[list[st.Statement], Any]:
    """Run ``steps``, sending ``answers`` as the rows of each statement in turn."""
    seen = [next(steps)]
    try:
        for rows in answers:
            seen.append(steps.send(rows))
    except StopIteration as done:
        return seen, done.value
    raise AssertionError(f"more statements than answers: {seen}")


OPERATION = NewOperation("order-1", "fp-a", 7, "stripe", "t1", 100.0)


KEY, ROW = keys.operation_params("order-1", "fp-a", 7, "stripe", "t1", 100.0)


def test_a_new_business_key_is_one_statement_on_postgres_and_two_on_sqlite() -> None:
    seen, answer = drive(st.operation_insert(OPERATION, "postgres"), [[(True, True)]])
    assert seen == [("operation_insert", (*KEY, *ROW))]
    assert answer == (True, "fp-a")
    seen, answer = drive(st.operation_insert(OPERATION, "sqlite"), [[(1,)], [(1,)]])
    assert seen == [("operation_insert", KEY), ("operation_record", ROW)]
    assert answer == (True, "fp-a")


def test_a_taken_business_key_reads_what_is_stored() -> None:
    stored = (keys.operation_fingerprint("fp-b"), "fp-b")
    seen, answer = drive(st.operation_insert(OPERATION, "sqlite"), [[], [stored]])
    assert seen[1] == ("operation_get", (KEY[0], "order-1"))
    assert answer == (False, "fp-b")


def test_a_message_key_taken_stops_before_the_message() -> None:
    message = NewMessage("m1", "t1", "order.paid", "k1", "{}", 100.0)
    seen, answer = drive(st.message_insert(message), [[]])
    assert [name for name, _ in seen] == ["message_key_insert"]
    assert answer is False


def test_a_message_under_an_old_key_adopts_it() -> None:
    message = NewMessage("m1", "t1", "order.paid", "k1", "{}", 100.0)
    seen, answer = drive(st.message_insert(message), [[(1,)], [], []])
    assert [name for name, _ in seen] == [
        "message_key_insert",
        "message_insert",
        "message_key_adopt",
    ]
    assert answer is False
    no_key = NewMessage("m2", "t1", "order.paid", None, "{}", 100.0)
    seen, answer = drive(st.message_insert(no_key), [[("m2",)]])
    assert [name for name, _ in seen] == ["message_insert"] and answer is True


def test_outbox_rows_are_one_insert_each_and_plain_tuples_still_pass() -> None:
    rows = [OutboxRow("email", "k1", "{}", "t1", 7), ("sms", "k2", "[]", None, 8)]
    seen, answer = drive(st.outbox_insert_rows(rows, now=5.0), [[], []])  # type: ignore[arg-type]
    assert seen == [
        ("outbox_insert", ("email", "k1", "{}", "t1", 7, 5.0)),
        ("outbox_insert", ("sms", "k2", "[]", None, 8, 5.0)),
    ]
    assert answer is None


def test_one_step_statements_carry_their_parameters_in_the_blocks_order() -> None:
    attempt = NewAttempt(7, 2, "retry", "boom", "w1", 1.0, 2.0)
    assert st.attempt_insert(attempt) == ("attempt_insert", (7, 2, "retry", "boom", "w1", 1.0, 2.0))
    assert st.inbox_begin(7, attempt=2, now=3.0) == ("inbox_begin_done", (7, 3.0, 2))
    assert st.inbox_lock([1, 2], lambda ids: f"{list(ids)}") == ("inbox_lock", ("[1, 2]",))
    assert st.delivery_insert("m1", "t1", ["e1"], list, now=1.0, ordering_key="o", sequence=3) == (
        "delivery_insert",
        ("m1", "t1", 1.0, ["e1"], "o", 3),
    )
