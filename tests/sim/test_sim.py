"""The simulation in the suite: fixed seeds on both backends, the schedule's
determinism, and checkers shown to fail on a broken state.

Each seed runs ``SUITE_STEPS`` steps of its schedule against real processes (about
half a minute each on two cores); ``python -m tests.sim`` runs any seed, longer.
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import text

from tests.sim.run import Sim, simulate
from tests.sim.schedule import answer, schedule

SUITE_SEEDS = (2, 11)
SUITE_STEPS = 60


def admin_url(backend: str) -> str | None:
    return os.environ["RELAYBOX_TEST_DATABASE_URL"] if backend == "postgres" else None


def test_the_schedule_is_a_function_of_the_seed_and_a_prefix_of_a_longer_one() -> None:
    long = schedule(5, 200)
    assert schedule(5, 200) == long
    assert schedule(5, 80) == long[:80]  # what shrinking by bisection relies on
    assert schedule(6, 200) != long
    kinds = {s.kind for s in long}
    assert {"new", "burst", "dup", "conflict", "kill", "db_reset", "clock"} <= kinds
    assert answer(5, 3, 0, endpoint="plain") == answer(5, 3, 0, endpoint="plain")
    statuses = {answer(5, seq, 0, endpoint="plain").status for seq in range(300)}
    assert {200, 503, 429, 400} <= statuses


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("seed", SUITE_SEEDS)
async def test_seed_keeps_every_invariant(seed: int, backend: str) -> None:
    report = await simulate(
        seed, SUITE_STEPS, backend=backend, admin_url=admin_url(backend), reenable_at_end=True
    )
    assert report.ran == SUITE_STEPS
    assert report.settled, report.as_dict()
    assert not report.violations, "\n".join(v.text() for v in report.violations)
    assert sum(report.faults.values()) > 0 and report.observed["inbox done"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_checkers_report_a_broken_state(backend: str) -> None:
    """After the run settled, the test breaks the tables the way a bug would: a grant
    lost with its event done, an event left pending, an erased row not erased."""

    async def break_it(sim: Sim) -> None:
        assert sim.box is not None
        await sim._erase("cus_1")  # nothing pending: finished at once
        erased = sim.erasures[-1]
        assert erased.erasure is not None and erased.inbox, erased
        async with sim.box.store.transaction() as conn:
            await conn.execute(
                text(
                    "DELETE FROM credit_grants WHERE business_key ="
                    " (SELECT min(business_key) FROM credit_grants WHERE kind = 'grant')"
                )
            )
            await conn.execute(
                text(
                    # Due far ahead: the workers, still running, must not take it
                    # back and finish it before the final check reads it.
                    "UPDATE relaybox_inbox SET status = 'pending', next_attempt_at = 9e9"
                    " WHERE id ="
                    " (SELECT min(id) FROM relaybox_inbox WHERE status = 'done')"
                )
            )
            await conn.execute(
                text("UPDATE relaybox_inbox SET erased_at = NULL WHERE id = :id"),
                {"id": erased.inbox[0]},
            )

    report = await simulate(
        4,
        25,
        backend=backend,
        admin_url=admin_url(backend),
        before_final=break_it,
        reenable_at_end=True,
    )
    broken = {v.checker for v in report.violations}
    assert {"effect_once", "handled_or_dead", "erased"} <= broken, report.as_dict()
    assert report.settled
