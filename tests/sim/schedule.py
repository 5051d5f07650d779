"""The schedule: every input and fault of a run, derived from its seed alone.

``schedule(seed, steps)`` is a pure function: the same seed gives the same list of
:class:`Step` on any machine, and a prefix of it (``schedule(seed, k)`` for ``k`` <
``steps``) is the first ``k`` steps of the longer one, which is what shrinking by
bisection relies on. Endpoint answers are drawn per request from
``answer(seed, seq, n)`` (the n-th request carrying message ``seq``), so they too
follow from the seed, whichever process sends them and when.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ACCOUNTS",
    "PROCESSES",
    "Answer",
    "Step",
    "answer",
    "describe",
    "schedule",
]

ACCOUNTS = ("acct_credits_dev", "acct_sim_a", "acct_sim_b")
"""Connect accounts the provider signs for (each maps to a workspace)."""
CUSTOMERS = ("cus_0", "cus_1", "cus_2", "cus_3")
"""An invoice's customer: the ordering key of its published webhook, and the subject
its inbox event and its message are indexed under (what an erasure names)."""
PROCESSES = ("receiver", "worker0", "worker1", "dispatcher0", "dispatcher1", "maintenance")
"""The long-running processes of a run: any of them may be SIGKILLed or clock-stepped."""

# Relative weights of the step kinds.
KINDS: dict[str, int] = {
    "new": 30,  # a new event naming a new invoice
    "burst": 6,  # several new events at once
    "dup": 8,  # a resend of an earlier event (re-signed now)
    "same_bytes": 3,  # the very bytes and signature of an earlier send, again
    "same_invoice": 5,  # a new event id naming an invoice already seen
    "conflict": 3,  # an earlier event id with other content
    "stale": 2,  # an earlier event signed an hour ago (a replay outside the tolerance)
    "refund": 4,  # charge.refunded for an invoice (maybe before its grant)
    "kill": 6,  # SIGKILL one process; it is restarted after `down` seconds
    "clock": 2,  # restart one process with its wall clock stepped
    "db_reset": 2,  # every database connection reset (PostgreSQL: through the proxy)
    "db_blackhole": 2,  # the database stops answering for a while
    "db_delay": 2,  # every database packet delayed for a while
    "idle_tx": 2,  # a connection left idle in a transaction holding rows
    "maintenance": 2,  # the retention purge runs now (relaybox maintenance --once); may erase
    "pause": 4,  # nothing new for a moment; may erase one customer
}


@dataclass(frozen=True)
class Step:
    n: int
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    gap: float = 0.0
    """Seconds to wait after the step before the next one."""

    def text(self) -> str:
        return f"{self.n:>4} {self.kind:<13} {json.dumps(self.args, sort_keys=True)}"


def _behaviour(rng: random.Random) -> dict[str, Any]:
    r = rng.random()
    if r < 0.10:
        return {"fail": "transient", "times": rng.randint(1, 2)}
    if r < 0.15:
        return {"fail": "permanent"}
    if r < 0.25:
        return {"slow": round(rng.uniform(0.1, 0.6), 2)}
    return {}


def schedule(seed: int, steps: int) -> list[Step]:
    """The first ``steps`` steps of seed ``seed``'s run."""
    rng = random.Random(seed)
    kinds, weights = zip(*KINDS.items(), strict=True)
    out: list[Step] = []
    sent: list[dict[str, Any]] = []  # the events sent so far (id, invoice, account, ...)
    invoices = 0
    events = 0

    def new_event(invoice: int | None = None) -> dict[str, Any]:
        nonlocal invoices, events
        events += 1
        if invoice is None:
            invoices += 1
            invoice = invoices
        account = ACCOUNTS[rng.randrange(len(ACCOUNTS))]
        # An invoice keeps its account and customer whatever event names it.
        for e in sent:
            if e["invoice"] == invoice:
                account = e["account"]
        customer = CUSTOMERS[invoice % len(CUSTOMERS)]
        event = {
            "event": f"evt_s{seed}_{events}",
            "invoice": invoice,
            "account": account,
            "customer": customer,
            "sim": _behaviour(rng),
        }
        sent.append(event)
        return event

    for n in range(steps):
        kind = rng.choices(kinds, weights)[0]
        if (
            kind in ("dup", "same_bytes", "same_invoice", "conflict", "stale", "refund")
            and not sent
        ):
            kind = "new"
        args: dict[str, Any]
        if kind == "new":
            args = new_event()
        elif kind == "burst":
            args = {"events": [new_event() for _ in range(rng.randint(3, 8))]}
        elif kind in ("dup", "same_bytes", "stale", "conflict"):
            args = {"event": rng.choice(sent)["event"]}
        elif kind == "same_invoice":
            args = new_event(rng.choice(sent)["invoice"])
        elif kind == "refund":
            target = rng.choice(sent)
            events += 1
            args = {
                "event": f"evt_s{seed}_{events}",
                "invoice": target["invoice"],
                "account": target["account"],
            }
        elif kind == "kill":
            args = {"proc": rng.choice(PROCESSES), "down": round(rng.uniform(0.0, 2.0), 2)}
        elif kind == "clock":
            args = {
                "proc": rng.choice(PROCESSES[1:5]),
                "skew": rng.choice([-1, 1]) * round(rng.uniform(1.0, 20.0), 1),
            }
        elif kind in ("db_blackhole", "db_delay", "idle_tx"):
            args = {"seconds": round(rng.uniform(0.3, 3.0), 2)}
            if kind == "db_delay":
                args["ms"] = rng.choice([20, 50, 200, 800])
        else:
            args = {}
        if kind in ("maintenance", "pause"):
            # Half of them also erase one customer (a data-protection request), drawn
            # from a stream of the step's own: the schedule of every other step, and
            # of every seed recorded before erasures were simulated, stays the same.
            erasing = random.Random(f"erase:{seed}:{n}")
            if erasing.random() < 0.5:
                args["erase"] = CUSTOMERS[erasing.randrange(len(CUSTOMERS))]
        gap = round(rng.expovariate(1 / 0.15), 3) if kind != "pause" else rng.uniform(0.5, 2.0)
        out.append(Step(n, kind, args, round(min(gap, 3.0), 3)))
    return out


@dataclass(frozen=True)
class Answer:
    status: int
    delay: float = 0.0  # > the outbound timeout: a timeout
    retry_after: float | None = None


def answer(seed: int, seq: int, n: int, *, endpoint: str) -> Answer:
    """What endpoint ``endpoint`` answers to the ``n``-th request (from 0) carrying the
    message of invoice ``seq``: mostly 200, sometimes 5xx, 429 with Retry-After, a
    timeout, 4xx (dead at once) or, rarely, 410 (the endpoint is disabled)."""
    digest = hashlib.sha256(f"{seed}:{endpoint}:{seq}:{n}".encode()).digest()
    r = int.from_bytes(digest[:8], "big") / 2**64
    if n >= 4:  # let every message settle within a few attempts
        return Answer(200)
    if r < 0.70:
        return Answer(200, delay=0.3 if r < 0.05 else 0.0)
    if r < 0.82:
        return Answer(503)
    if r < 0.88:
        return Answer(429, retry_after=0.5)
    if r < 0.94:
        return Answer(200, delay=1.6)  # answered after the attempt's timeout
    if r < 0.985:
        return Answer(400)
    return Answer(410)


def describe(steps: list[Step]) -> str:
    return "\n".join(s.text() for s in steps)


def as_json(steps: list[Step]) -> list[dict[str, Any]]:
    return [asdict(s) for s in steps]
