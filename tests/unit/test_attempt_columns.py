"""An attempt's record as the statements that write it take it (attempt_columns), and
what the attempt log keeps of a recorded batch (attempt_log): no database."""

from __future__ import annotations

import dataclasses

from relaybox.store.dispatch_rows import Attempt, Decision, Result, attempt_columns, attempt_log
from relaybox.store.outbox_rows import Delivery, Target

NOW = 1_000_000.0


def delivery(outbox_id: int, *, attempt: int = 1, uncertain: bool = False) -> Delivery:
    target = Target("ep_1", "t1", "https://example.com/", "standard", None, None)
    return Delivery(
        outbox_id, "webhook", "k", None, "t1", attempt, attempt + 10, uncertain, 30.0, None, target
    )


def made(d: Delivery, result: Result | None, decision: Decision) -> Attempt:
    return Attempt(d, result, decision, "d1", NOW - 1, 0.25)


def test_each_column_is_the_attempts_in_order() -> None:
    sent = made(
        delivery(1),
        Result("sent", 200, response="ok", headers='{"request": []}'),
        Decision("sent", "sent"),
    )
    retry = made(
        delivery(2, attempt=3),
        Result("retry", 503, "HTTP 503", retry_after=5.0),
        Decision("retry", "retry", at=NOW + 5),
    )
    failed = made(
        delivery(3), Result("failed", 400, "HTTP 400"), Decision("dead", "failed", "rejected")
    )
    cols = attempt_columns([sent, retry, failed])
    assert cols.id == [1, 2, 3]
    assert cols.lease_token == [11, 13, 11]
    assert cols.attempt == [1, 3, 1]
    assert cols.endpoint_id == ["ep_1"] * 3
    assert cols.dispatcher == ["d1"] * 3
    assert (cols.started, cols.duration) == ([NOW - 1] * 3, [0.25] * 3)
    assert cols.status == ["sent", "pending", "dead"]  # a retry leaves the row pending
    assert cols.next_at == [None, NOW + 5, None]
    assert cols.reason == [None, None, "rejected"]
    assert cols.outcome == ["sent", "retry", "failed"]
    assert cols.status_code == [200, 503, 400]
    assert cols.error == [None, "HTTP 503", "HTTP 400"]
    assert cols.response == ["ok", None, None]
    assert cols.headers == ['{"request": []}', None, None]
    empty = attempt_columns([])
    assert all(getattr(empty, f.name) == [] for f in dataclasses.fields(empty))


def test_without_an_attempt_the_error_says_why() -> None:
    held = made(delivery(1, uncertain=True), None, Decision("held", "held", "uncertain"))
    died = made(delivery(2, attempt=4), None, Decision("dead", "exhausted", "exhausted"))
    accepted = made(delivery(3, uncertain=True), None, Decision("sent", "accepted"))
    cols = attempt_columns([held, died, accepted])
    assert cols.error == [
        "outcome unknown: a dispatcher's lease expired; review, then redeliver",
        "attempt 3 did not finish: the dispatcher died",
        None,
    ]
    assert cols.status_code == cols.response == cols.headers == [None, None, None]
    assert cols.status == ["held", "dead", "sent"]
    assert [a.error for a in (held, died, accepted)] == cols.error


def test_the_log_keeps_attempts_made_fenced_and_uncertain_ones() -> None:
    sent = made(delivery(1), Result("sent", 200), Decision("sent", "sent"))
    stale = made(delivery(2), Result("sent", 200), Decision("sent", "sent"))
    again = made(
        delivery(3, attempt=2, uncertain=True),
        Result("retry", 500, "HTTP 500"),
        Decision("retry", "retry", at=NOW + 1),
    )
    held = made(delivery(4, attempt=2, uncertain=True), None, Decision("held", "held", "uncertain"))
    written = {sent.key, again.key, held.key}  # stale's row was taken over
    log = attempt_log([sent, stale, again, held], written, NOW)
    cols = attempt_columns(log)
    assert list(zip(cols.id, cols.attempt, cols.lease_token, cols.outcome, strict=True)) == [
        (1, 1, 11, "sent"),
        (2, 1, 11, "fenced"),
        (3, 1, 11, "uncertain"),  # the attempt before, whose lease expired
        (3, 2, 12, "retry"),
        (4, 1, 11, "uncertain"),  # held: no attempt made, only the one before logged
    ]
    uncertain = log[2]
    assert (uncertain.dispatcher, uncertain.started, uncertain.duration) == (None, NOW, 0.0)
    assert uncertain.error == "the lease expired before the outcome was recorded"
    assert cols.status_code == [200, 200, None, 500, None]
