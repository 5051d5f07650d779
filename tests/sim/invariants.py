"""The invariants of a run, each a named checker.

A checker reads the database directly (never through the proxy) and what the
provider, the endpoints and the mailbox saw, and returns the violations it found.
``final=False`` is the continuous check, between steps, while processes run and
faults happen: only what holds at every instant. ``final=True`` runs once every fault
is over, every process is up and the rows settled.

==========================  ==========================================================
``acked_stored``            every delivery answered 2xx is stored (once: the inbox
                            key is UNIQUE); (final) with the content of one of its sends
``conflict_quarantined``    every other content 2xx'd under a stored event id has its
                            quarantine row
``stale_refused``           a delivery signed an hour ago is refused (4xx), never 2xx
``handled_or_dead``         (final) every stored event is done, ignored, or dead with
                            a reason
``effect_once``             a grant exists only with its event done; (final) an
                            invoice with any ``invoice.paid`` done has exactly one
                            grant, one e-mail row; balances add up to the ledger
``no_rollback_leak``        every webhook that reached an endpoint and every e-mail
                            sent belongs to a committed message / a committed grant
``delivered_or_dead``       (final) every outbox row is sent or dead with a reason; a
                            sent webhook reached its endpoint; one message id per
                            event (the same id on every attempt)
``fifo_per_key``            on the ordered endpoint, each ordering key's messages were
                            first accepted in their ``webhook-sequence`` order
``lease_fenced``            no claim or lease left expired longer than its hold while
                            every process runs: a dead holder's rows are taken back
``recorded_once``           no event has two ``done`` attempts, no outbox row two
                            ``sent`` ones; (final) a finished row's outcome was written
                            by the attempt of its last lease (lease tokens fence)
``metrics_agree``           (final) ``/metrics`` counts agree with the tables
``erased``                  (final) every erasure asked for is finished, and every
                            row indexed under its customer when it was asked holds no
                            payload, header, body or response any more (and is marked
                            erased, unless the purge had emptied it first)
==========================  ==========================================================
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import aiohttp
from sqlalchemy import text

if TYPE_CHECKING:
    from tests.sim.run import Sim

__all__ = ["CHECKERS", "check", "fetch_rows"]

TIMEOUT = 1.0  # the endpoints' timeout (tests.sim.app.OUTBOUND)


async def check(sim: Sim, *, final: bool) -> None:
    from tests.sim.run import Violation

    for name, checker in CHECKERS.items():
        if final or name in CONTINUOUS:
            sim.report.checks[name] += 1
            for detail in await checker(sim, final):
                sim.report.violations.append(Violation(name, sim.step, detail))


async def fetch_rows(sim: Sim, sql: str, **params: Any) -> list[dict[str, Any]]:
    assert sim.box is not None
    async with sim.box.store.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(sql), params)]


def _hex(fp: Any) -> str:
    return bytes(fp).hex()


def _answers(sim: Sim) -> list[tuple[str, list[tuple[int, str, bytes]]]]:
    """What the provider was answered so far, copied *before* the database is read: an
    answer that arrives while the read runs may be for a row committed after it."""
    return [(event_id, list(sent.answers)) for event_id, sent in list(sim.sent.items())]


async def acked_stored(sim: Sim, final: bool) -> list[str]:
    answered = _answers(sim)
    stored = {
        r["event_id"]: _hex(r["fingerprint"])
        for r in await fetch_rows(sim, "SELECT event_id, fingerprint FROM relaybox_inbox")
    }
    out = []
    for event_id, answers in answered:
        acked = {_hex(fp) for status, _, fp in answers if 200 <= status < 300}
        if acked and event_id not in stored:
            how = [a for status, a, _ in answers if 200 <= status < 300]
            out.append(f"{event_id} answered 2xx ({how[0]}) but not in the inbox")
        # A send may be stored and answered 503 (its COMMIT's answer lost), then 2xx'd
        # as a duplicate on a later try: its content is checked once the provider is done.
        sent_any = {_hex(fp) for _, _, fp in answers}
        if final and event_id in stored and stored[event_id] not in sent_any:
            out.append(f"{event_id} is stored with content the provider never sent")
    return out


async def conflict_quarantined(sim: Sim, final: bool) -> list[str]:
    answered = _answers(sim)
    stored = {
        r["event_id"]: _hex(r["fingerprint"])
        for r in await fetch_rows(sim, "SELECT event_id, fingerprint FROM relaybox_inbox")
    }
    held = {
        (r["event_id"], _hex(r["fingerprint"]))
        for r in await fetch_rows(sim, "SELECT event_id, fingerprint FROM relaybox_quarantine")
    }
    out = []
    if final:
        sim.report.observed["quarantined"] += len(held)
    for event_id, answers in answered:
        for status, answer, fp in answers:
            if not 200 <= status < 300 or event_id not in stored:
                continue
            if _hex(fp) != stored[event_id] and (event_id, _hex(fp)) not in held:
                out.append(f"{event_id}: other content answered {answer!r}, not quarantined")
    return out


async def stale_refused(sim: Sim, final: bool) -> list[str]:
    # Never accepted is what matters: a provider that gave up without an answer (the
    # receiver down for its whole retry budget, status 0) or got a 503 was not answered
    # 2xx either.
    if final:
        sim.report.observed["stale refused"] += sum(s >= 400 for _, s in sim.stale_answers)
        sim.report.observed["stale unanswered"] += sum(s == 0 for _, s in sim.stale_answers)
    return [
        f"{e} signed an hour ago was answered {s}" for e, s in sim.stale_answers if 200 <= s < 300
    ]


async def handled_or_dead(sim: Sim, final: bool) -> list[str]:
    rows = await fetch_rows(
        sim, "SELECT event_id, status, dead_reason, attempts, last_error FROM relaybox_inbox"
    )
    out = []
    for r in rows:
        reason = f":{r['dead_reason']}" if r["status"] == "dead" else ""
        sim.report.observed[f"inbox {r['status']}{reason}"] += 1
        if r["status"] == "dead" and not r["dead_reason"]:
            out.append(f"{r['event_id']} dead without a reason")
        elif r["status"] == "pending":
            out.append(
                f"{r['event_id']} still pending after the run settled"
                f" (attempts {r['attempts']}, last error {r['last_error']!r})"
            )
    return out


async def effect_once(sim: Sim, final: bool) -> list[str]:
    out = []
    grants = await fetch_rows(
        sim,
        "SELECT g.business_key, g.invoice_id, g.event_id, g.kind, i.status"
        " FROM credit_grants g LEFT JOIN relaybox_inbox i"
        " ON i.event_id = g.event_id AND i.source = 'stripe'",
    )
    for g in grants:
        if g["status"] != "done":
            out.append(
                f"{g['kind']} {g['business_key']} made by {g['event_id']},"
                f" whose inbox row is {g['status']!r}, not done"
            )
    if not final:
        return out
    sim.report.observed["grants"] += sum(g["kind"] == "grant" for g in grants)
    sim.report.observed["reversals"] += sum(g["kind"] == "reversal" for g in grants)
    events = await fetch_rows(
        sim,
        "SELECT event_id, status, event_type FROM relaybox_inbox WHERE event_type = 'invoice.paid'",
    )
    done_invoices: set[str] = set()
    for e in events:
        sent = sim.sent.get(e["event_id"])
        if sent is not None and e["status"] == "done":
            done_invoices.add(sent.event["data"]["object"]["id"])
    granted = defaultdict(int)
    for g in grants:
        if g["kind"] == "grant":
            granted[g["invoice_id"]] += 1
    for invoice in done_invoices | set(granted):
        if granted[invoice] != (1 if invoice in done_invoices else 0):
            out.append(
                f"invoice {invoice}: {granted[invoice]} grant(s),"
                f" an invoice.paid done: {invoice in done_invoices}"
            )
    emails = await fetch_rows(sim, "SELECT key FROM relaybox_outbox WHERE channel = 'email'")
    keys = [e["key"] for e in emails]
    for g in grants:
        if g["kind"] == "grant" and keys.count(g["business_key"] + ":confirmation") != 1:
            out.append(
                f"{g['business_key']}: {keys.count(g['business_key'] + ':confirmation')} e-mails"
            )
    [balance] = await fetch_rows(
        sim,
        "SELECT (SELECT coalesce(sum(credits), 0) FROM workspace_balances) AS b,"
        " (SELECT coalesce(sum(credits), 0) FROM credit_grants) AS l",
    )
    if int(balance["b"]) != int(balance["l"]):
        out.append(f"balances add up to {balance['b']}, the ledger to {balance['l']}")
    return out


async def no_rollback_leak(sim: Sim, final: bool) -> list[str]:
    # What arrived, copied before the database is read (see _answers).
    received = {name: list(r.requests) for name, r in sim.endpoints.items()}
    mailed = sim.mailbox.read_text().splitlines() if sim.mailbox.exists() else []
    messages = {r["id"] for r in await fetch_rows(sim, "SELECT id FROM relaybox_messages")}
    done = {
        r["event_id"]
        for r in await fetch_rows(sim, "SELECT event_id FROM relaybox_inbox WHERE status = 'done'")
    }
    out = []
    for name, requests in received.items():
        for seen in requests:
            if seen.webhook_id not in messages:
                out.append(f"{name} received {seen.webhook_id}, which was never committed")
                continue
            event = _data(seen.body).get("event")
            if event is not None and event not in done:
                out.append(f"{name} received {seen.webhook_id} of {event}, whose row is not done")
    granted = {
        r["business_key"]
        for r in await fetch_rows(
            sim, "SELECT business_key FROM credit_grants WHERE kind = 'grant'"
        )
    }
    for line in mailed:
        try:
            key = json.loads(line)["key"]
        except ValueError:  # a line being written right now
            continue
        if key.endswith(":confirmation") and key.removesuffix(":confirmation") not in granted:
            out.append(f"e-mail {key} sent for a grant never committed")
    return out


async def delivered_or_dead(sim: Sim, final: bool) -> list[str]:
    out = []
    rows = await fetch_rows(
        sim,
        "SELECT o.id, o.channel, o.key, o.endpoint_id, o.message_id, o.status,"
        " o.dead_reason, e.status AS endpoint_status"
        " FROM relaybox_outbox o LEFT JOIN relaybox_endpoints e ON e.id = o.endpoint_id",
    )
    names = {v: k for k, v in sim.endpoint_ids.items()}
    seen_ids: dict[str, dict[str, set[str]]] = {name: {} for name in sim.endpoints}
    for name, receiver in sim.endpoints.items():
        for seen in receiver.requests:
            seen_ids[name].setdefault(seen.webhook_id, set()).add(seen.body.decode())
    for r in rows:
        reason = f":{r['dead_reason']}" if r["status"] == "dead" else ""
        sim.report.observed[f"outbox {r['channel']} {r['status']}{reason}"] += 1
        where = f"outbox row {r['id']} ({r['channel']}, {r['key']})"
        if r["status"] == "pending":
            state = f", its endpoint {r['endpoint_status']}" if r["endpoint_status"] else ""
            out.append(f"{where} still pending after the run settled{state}")
        elif r["status"] == "dead" and not r["dead_reason"]:
            out.append(f"{where} dead without a reason")
        elif r["status"] not in ("sent", "dead"):
            out.append(f"{where} is {r['status']!r}")
        name = names.get(r["endpoint_id"] or "")
        if r["status"] == "sent" and name is not None and r["message_id"] not in seen_ids[name]:
            out.append(f"{where} sent, but {name} never received {r['message_id']}")
    mailed = set()
    if sim.mailbox.exists():
        mailed = {json.loads(line)["key"] for line in sim.mailbox.read_text().splitlines()}
    for r in rows:
        if r["channel"] == "email" and r["status"] == "sent" and r["key"] not in mailed:
            out.append(f"e-mail {r['key']} sent, but never in the mailbox")
    for name, ids in seen_ids.items():
        per_event: dict[str, set[str]] = defaultdict(set)
        for webhook_id, bodies in ids.items():
            if len(bodies) > 1:
                out.append(f"{name}: {webhook_id} sent with {len(bodies)} different bodies")
            for body in bodies:
                event = _data(body.encode()).get("event")
                if event is not None:
                    per_event[event].add(webhook_id)
        for event, webhook_ids in per_event.items():
            if len(webhook_ids) > 1:
                out.append(f"{name}: the grant of {event} sent as {sorted(webhook_ids)}")
    return out


async def fifo_per_key(sim: Sim, final: bool) -> list[str]:
    receiver = sim.endpoints.get("ordered")
    if receiver is None:
        return []
    firsts: dict[str, list[int]] = defaultdict(list)
    accepted: set[str] = set()
    counts: dict[str, int] = defaultdict(int)
    for seen in list(receiver.requests):
        n = counts[seen.webhook_id]
        counts[seen.webhook_id] += 1
        seq = _data(seen.body).get("seq")
        from tests.sim.schedule import answer

        a = answer(sim.seed, seq if isinstance(seq, int) else -1, n, endpoint="ordered")
        if a.status >= 300 or a.delay >= TIMEOUT or seen.webhook_id in accepted:
            continue
        accepted.add(seen.webhook_id)
        key = str(_data(seen.body).get("customer"))
        sequence = seen.headers.get("webhook-sequence")
        if sequence is not None:
            firsts[key].append(int(sequence))
    out = []
    if final:
        sim.report.observed["ordered first acceptances"] += sum(map(len, firsts.values()))
    for key, order in firsts.items():
        if order != sorted(order):
            out.append(f"ordering key {key}: accepted in the order {order}")
    return out


async def lease_fenced(sim: Sim, final: bool) -> list[str]:
    """Rows whose claim (inbox) or lease (outbox) ran out more than a hold ago, while
    every process is up and no fault is on: a dead holder's rows must be taken back
    within a poll or two of the hold's end."""
    now = time.time()
    calm = time.monotonic() - max(sim.calm_since, sim.faults_until)
    grace = 5.0
    if calm < grace + 25.0 or any(s for s in sim.skews.values()):  # clock-stepped: skip
        return []
    out = []
    held = await fetch_rows(
        sim,
        "SELECT event_id, next_attempt_at FROM relaybox_inbox WHERE status = 'pending'"
        " AND started_at IS NOT NULL AND next_attempt_at < :t",
        t=now - grace,
    )
    for r in held:
        out.append(f"{r['event_id']} claimed, its hold over for {now - r['next_attempt_at']:.1f} s")
    if sim.backend == "postgres":
        leases = await fetch_rows(
            sim,
            "SELECT outbox_id, until FROM relaybox_outbox_leases WHERE until < :t",
            t=now - grace,
        )
    else:
        leases = await fetch_rows(
            sim,
            "SELECT id AS outbox_id, lease_until AS until FROM relaybox_outbox"
            " WHERE status = 'pending' AND lease_until IS NOT NULL AND lease_until < :t",
            t=now - grace,
        )
    for r in leases:
        out.append(f"outbox row {r['outbox_id']}: lease expired {now - r['until']:.1f} s ago")
    return out


async def recorded_once(sim: Sim, final: bool) -> list[str]:
    """An outcome is recorded by the holder of the claim or lease only: no event has two
    ``done`` attempts, no outbox row two ``sent`` attempts (a second one means a worker
    or a dispatcher recorded over a claim or lease it no longer held)."""
    twice = await fetch_rows(
        sim,
        "SELECT 'inbox' AS q, inbox_id AS id, count(*) AS n FROM relaybox_inbox_attempts"
        " WHERE outcome = 'done' GROUP BY inbox_id HAVING count(*) > 1"
        " UNION ALL SELECT 'outbox', outbox_id, count(*) FROM relaybox_outbox_attempts"
        " WHERE outcome = 'sent' GROUP BY outbox_id HAVING count(*) > 1",
    )
    out = [f"{r['q']} row {r['id']}: {r['n']} successful attempts recorded" for r in twice]
    if not final:
        return out
    # The attempt that decided a finished row is the last one whose outcome was written
    # (neither fenced nor a note of an expired lease): it held the row's last lease.
    # Except a row killed because its endpoint is disabled, which no attempt decided:
    # the disabling or the maintenance sweep kills rows no live lease holds, and a
    # lease that ran out (its dispatcher died or stalled) leaves its token behind.
    decided = await fetch_rows(
        sim,
        "SELECT o.id, o.lease_token AS row_token, a.lease_token AS attempt_token, a.outcome"
        " FROM relaybox_outbox o JOIN relaybox_outbox_attempts a ON a.id = ("
        "   SELECT max(b.id) FROM relaybox_outbox_attempts b WHERE b.outbox_id = o.id"
        "   AND b.outcome NOT IN ('fenced', 'uncertain'))"
        " WHERE o.status IN ('sent', 'dead')"
        " AND NOT (o.status = 'dead' AND o.dead_reason = 'endpoint_disabled')",
    )
    for r in decided:
        if r["row_token"] is not None and r["row_token"] != r["attempt_token"]:
            out.append(
                f"outbox row {r['id']}: {r['outcome']!r} written by lease {r['attempt_token']},"
                f" the row's last lease is {r['row_token']}"
            )
    return out


async def metrics_agree(sim: Sim, final: bool) -> list[str]:
    receiver = sim.running.get("receiver")
    if receiver is None:
        return ["no receiver to scrape"]
    want = await fetch_rows(
        sim,
        "SELECT 'inbox' AS q, status, count(*) AS n FROM relaybox_inbox GROUP BY status"
        " UNION ALL SELECT 'outbox', status, count(*) FROM relaybox_outbox GROUP BY status",
    )
    expected = {(r["q"], r["status"]): int(r["n"]) for r in want}
    got: dict[tuple[str, str], int] = {}
    deadline = time.monotonic() + 15
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(receiver.url + "/metrics") as r:
                text = await r.text()
            got = _scrape(text)
            mismatch = [
                f"{q} {status}: metrics {got.get((q, status), 0)}, tables {n}"
                for (q, status), n in expected.items()
                if got.get((q, status), 0) != n
            ]
            if not mismatch or time.monotonic() > deadline:
                return mismatch
            await asyncio.sleep(1.0)


def _scrape(text: str) -> dict[tuple[str, str], int]:
    """``relaybox_queue_rows`` and ``relaybox_queue_pending``, summed over sources."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        labels_text, _, value = rest.rpartition("}")
        labels = dict(part.split("=", 1) for part in labels_text.split(",") if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        if name == "relaybox_queue_rows":
            out[(labels["queue"], labels["status"])] += int(float(value))
        elif name == "relaybox_dead_letters":
            out[(labels["queue"], "dead")] += int(float(value))
        elif name == "relaybox_queue_pending":
            out[(labels["queue"], "pending")] += int(float(value))
    return out


def _data(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


def _before(purged_at: float | None, asked_at: float) -> bool:
    """Whether the purge emptied the row before the erasure was asked."""
    return purged_at is not None and float(purged_at) < asked_at


async def erased(sim: Sim, final: bool) -> list[str]:
    if not final or not sim.erasures:
        return []
    out: list[str] = []
    asked = [e for e in sim.erasures if e.erasure is not None]
    for e in sim.erasures:
        if e.erasure is None:
            out.append(f"erasure of {e.customer} was never recorded ({e.error or 'no answer'})")
    # The maintenance job (every second here) empties the rows an erasure waited for
    # once they finish: give it a few runs after the rows settled.
    deadline = time.monotonic() + 20
    while True:
        ids = [e.erasure for e in asked]
        open_ = await fetch_rows(
            sim,
            "SELECT id, waiting FROM relaybox_erasures WHERE finished_at IS NULL",
        )
        still = {r["id"]: r["waiting"] for r in open_ if r["id"] in ids}
        if not still or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    for e in asked:
        sim.report.observed["erasures"] += 1
        if e.erasure in still:
            out.append(
                f"erasure {e.erasure} of {e.customer}: still waiting for {still[e.erasure]} rows"
            )
            continue
        [record] = await fetch_rows(
            sim, "SELECT created_at FROM relaybox_erasures WHERE id = :id", id=e.erasure
        )
        asked_at = float(record["created_at"])
        for r in await fetch_rows(
            sim,
            "SELECT i.id, i.status, i.erased_at, i.payload IS NULL AND i.headers IS NULL AS empty,"
            " i.purged_at, i.last_error IS NULL AS no_error,"
            " (SELECT count(*) FROM relaybox_outbox o WHERE o.inbox_id = i.id"
            "  AND o.payload IS NOT NULL AND o.payload <> 'null') AS handler_rows"
            " FROM relaybox_inbox i",
        ):
            if r["id"] not in e.inbox:
                continue
            sim.report.observed["erased inbox rows"] += 1
            what = [
                name
                for name, bad in (
                    # A row the purge had emptied before the erasure, no error text
                    # left: its index row went with it (nothing to erase), so the
                    # erasure did not mark it.
                    (
                        "not marked erased",
                        r["erased_at"] is None
                        and not (_before(r["purged_at"], asked_at) and r["no_error"]),
                    ),
                    ("payload or headers kept", not r["empty"]),
                    (f"{r['handler_rows']} handler outbox payloads kept", r["handler_rows"]),
                )
                if bad
            ]
            if what:
                out.append(
                    f"inbox row {r['id']} ({r['status']}) of {e.customer}, erased by"
                    f" {e.erasure}: {', '.join(what)}"
                )
        for r in await fetch_rows(
            sim, "SELECT id, payload IS NULL AND headers IS NULL AS empty FROM relaybox_quarantine"
        ):
            if r["id"] in e.quarantine and not r["empty"]:
                out.append(f"quarantine row {r['id']} of {e.customer}: content kept after erasure")
        for r in await fetch_rows(
            sim,
            "SELECT m.id, m.erased_at, m.purged_at, m.body, (SELECT count(*) FROM relaybox_outbox o"
            "  WHERE o.message_id = m.id AND o.payload IS NOT NULL AND o.payload <> 'null')"
            "  AS deliveries,"
            " (SELECT count(*) FROM relaybox_outbox_attempts a JOIN relaybox_outbox o"
            "  ON o.id = a.outbox_id WHERE o.message_id = m.id"
            "  AND (a.response IS NOT NULL OR a.headers IS NOT NULL)) AS responses"
            " FROM relaybox_messages m",
        ):
            if r["id"] not in e.messages:
                continue
            sim.report.observed["erased messages"] += 1
            body = r["body"]
            kept = body is not None and body not in ("null", b"null") and body != "null"
            what = [
                name
                for name, bad in (
                    (
                        "not marked erased",
                        r["erased_at"] is None and not _before(r["purged_at"], asked_at),
                    ),
                    ("body kept", kept),
                    (f"{r['deliveries']} delivery payloads kept", r["deliveries"]),
                    (f"{r['responses']} responses kept", r["responses"]),
                )
                if bad
            ]
            if what:
                out.append(
                    f"message {r['id']} of {e.customer}, erased by {e.erasure}: {', '.join(what)}"
                )
    return out


CHECKERS = {
    "acked_stored": acked_stored,
    "conflict_quarantined": conflict_quarantined,
    "stale_refused": stale_refused,
    "handled_or_dead": handled_or_dead,
    "effect_once": effect_once,
    "no_rollback_leak": no_rollback_leak,
    "delivered_or_dead": delivered_or_dead,
    "fifo_per_key": fifo_per_key,
    "lease_fenced": lease_fenced,
    "recorded_once": recorded_once,
    "metrics_agree": metrics_agree,
    "erased": erased,
}
CONTINUOUS = {
    "acked_stored",
    "conflict_quarantined",
    "stale_refused",
    "effect_once",
    "no_rollback_leak",
    "fifo_per_key",
    "lease_fenced",
    "recorded_once",
}
