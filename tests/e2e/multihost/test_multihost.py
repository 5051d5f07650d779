"""Several hosts against one PostgreSQL: three network namespaces (``net.py``), each
running ``relaybox serve`` (receiver and worker) and ``relaybox dispatch`` of
``hostapp.py``; PostgreSQL and the outbox's sink on the database's host. Load goes
through every host's receiver; then one fault per test:

* a whole host's processes SIGKILLed;
* a host cut off from the database (its link down) while its transactions are open,
  then back;
* two hosts' clocks 60 s ahead and 60 s behind (``tests/support/skewclock``).

After each: every delivery answered 2xx is processed exactly once in effect (one
``mh_effects`` row per invoice), every outbox row is delivered to the sink, a key
delivered twice only where relaybox recorded an uncertain outcome or an attempt that
got no answer (the documented resends, under the same webhook-id), and the work of a
lost host moved to the others within its claim hold (and lease). The counts are
printed (``-s`` shows them).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from relaybox import Relaybox, Secret, sources
from relaybox.config import Settings
from tests.conftest import admin_url
from tests.e2e.multihost.hostapp import EFFECTS_DDL, SECRET
from tests.e2e.multihost.net import Network, NoNamespaces, host_env, make_network, post_all
from tests.support.outbound_app import endpoint, local, publish_one
from tests.support.procs import skewed
from tests.support.receivers import HttpReceiver, OrderCheckingReceiver

pytestmark = pytest.mark.slow

CLAIM_HOLD = 2.0  # host_env
LEASE_TTL = 8.0
SLACK = 10.0  # polling, process start-up of the claimers on a loaded machine
_STRIPE = sources.stripe(secrets=[Secret(SECRET)])


@pytest.fixture
async def net(tmp_path: Path) -> AsyncIterator[Network]:
    try:
        network = make_network(tmp_path)
    except NoNamespaces as exc:
        pytest.skip(f"multi-host tests need network namespaces: {exc}")
    try:
        yield network
    finally:
        await network.close()


@pytest.fixture
async def db(pg_url: str) -> AsyncIterator[Relaybox]:
    box = Relaybox(settings=Settings(database_url=pg_url))
    async with box.store.transaction() as conn:
        await conn.execute(text(EFFECTS_DDL))
    yield box
    await box.close()


def deliveries(prefix: str, n: int) -> list[tuple[str, bytes, dict[str, str]]]:
    out = []
    for i in range(n):
        invoice = f"in_{prefix}_{i:04d}"
        event = {
            "id": f"evt_{prefix}_{i:04d}",
            "object": "event",
            "type": "invoice.paid",
            "created": 1_700_000_000,
            "data": {"object": {"id": invoice, "object": "invoice", "amount_paid": 100}},
        }
        body = json.dumps(event).encode()
        headers = _STRIPE.sign(
            body, event_id=event["id"], event_type="invoice.paid", now=time.time()
        )
        out.append((invoice, body, {**headers, "content-type": "application/json"}))
    return out


async def scalar(box: Relaybox, sql: str, **params: Any) -> Any:
    async with box.store.transaction() as conn:
        return (await conn.execute(text(sql), params)).scalar()


async def rows(box: Relaybox, sql: str, **params: Any) -> list[Any]:
    async with box.store.transaction() as conn:
        return list(await conn.execute(text(sql), params))


async def held_inbox(box: Relaybox) -> set[int]:
    """Inbox rows a worker holds now (claimed, hold not run out)."""
    found = await rows(
        box,
        "SELECT id FROM relaybox_inbox WHERE status = 'pending'"
        " AND next_attempt_at > extract(epoch FROM clock_timestamp())",
    )
    return {r[0] for r in found}


async def leased_by(box: Relaybox, pids: set[int]) -> set[int]:
    """Outbox rows under a lease of one of these dispatcher processes (owner host:pid:…)."""
    found = await rows(box, "SELECT outbox_id, owner FROM relaybox_outbox_leases")
    return {r[0] for r in found if int(str(r[1]).split(":")[1]) in pids}


async def not_done_locked(box: Relaybox, ids: set[int]) -> int:
    """Rows of ``ids`` not done and row-locked by an open transaction (``FOR SHARE SKIP
    LOCKED`` skips them), e.g. a cut-off host's, which PostgreSQL still sees open."""
    async with box.store.transaction() as conn:
        left = await conn.execute(
            text("SELECT id FROM relaybox_inbox WHERE id = ANY(:ids) AND status <> 'done'"),
            {"ids": list(ids)},
        )
        left_ids = [r[0] for r in left]
        free = await conn.execute(
            text("SELECT id FROM relaybox_inbox WHERE id = ANY(:ids) FOR SHARE SKIP LOCKED"),
            {"ids": left_ids},
        )
        return len(left_ids) - len(list(free))


async def in_transaction(db: Relaybox, net: Network, host: Any) -> int:
    """The host's connections with a transaction open now (PostgreSQL's view, matched
    by the proxy's ports; through a Unix-socket target, every connection of the
    database but ``db``'s own)."""
    assert net.proxy is not None
    if net.proxy.target_unix:
        return int(
            await scalar(
                db,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid()",
            )
        )
    ports = net.proxy.upstream_ports(host.address)
    if not ports:
        return 0
    return int(
        await scalar(
            db,
            "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(:ports)"
            " AND state IN ('active', 'idle in transaction')"
            " AND xact_start IS NOT NULL",
            ports=list(ports),
        )
    )


async def seconds_until_done(
    box: Relaybox,
    table: str,
    ids: set[int],
    done: str,
    since: float,
    within: float,
    *,
    unlocked_only: bool = False,
) -> float | None:
    """Seconds from ``since`` (monotonic) until every row of ``ids`` has ``done``
    (``unlocked_only``: except rows an open transaction locks)."""
    if not ids:
        return 0.0
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = await scalar(
            box,
            f"SELECT count(*) FROM {table} WHERE id = ANY(:ids) AND status <> '{done}'",
            ids=list(ids),
        )
        if unlocked_only and left:
            left -= await not_done_locked(box, ids)
        if left == 0:
            return time.monotonic() - since
        await asyncio.sleep(0.1)
    return None


@dataclass
class Tally:
    sent: int
    accepted: int  # answered 2xx
    processed: int  # invoices with an effect
    effects: int  # effect rows (more than processed: a double effect)
    doubled: int  # 2xx'd invoices with other than exactly one effect
    delivered: int  # outbox keys the sink saw
    duplicates: int  # keys the sink saw more than once
    uncertain: int  # of those, keys whose attempt log records an uncertain or unanswered attempt
    lost: int  # outbox keys never delivered, and 2xx'd invoices never processed
    inbox: dict[str, int]

    def line(self, name: str, **extra: Any) -> str:
        fields = {
            "sent": self.sent,
            "2xx": self.accepted,
            "processed": self.processed,
            "effects": self.effects,
            "delivered": self.delivered,
            "duplicates": self.duplicates,
            "uncertain_resends": self.uncertain,
            "lost": self.lost,
            **extra,
        }
        return f"multihost[{name}]: " + " ".join(f"{k}={v}" for k, v in fields.items())


async def settle(db: Relaybox, net: Network, accepted: set[str], *, within: float) -> None:
    """Until every 2xx'd invoice has an effect, the inbox has nothing pending and the
    sink saw every outbox row's key (or ``within`` seconds)."""
    assert net.sink is not None
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done = {r[0] for r in await rows(db, "SELECT DISTINCT invoice FROM mh_effects")}
        pending = await scalar(db, "SELECT count(*) FROM relaybox_inbox WHERE status = 'pending'")
        keys = {f"grant:{i}" for i in done}
        if accepted <= done and not pending and keys <= set(net.sink.seen):
            outbox = await scalar(db, "SELECT count(*) FROM relaybox_outbox WHERE status <> 'sent'")
            if not outbox:
                return
        await asyncio.sleep(0.2)


async def tally(db: Relaybox, net: Network, invoices: list[str], statuses: list[Any]) -> Tally:
    assert net.sink is not None
    accepted = {i for i, s in zip(invoices, statuses, strict=True) if s is not None and s < 300}
    effects = {
        r[0]: r[1]
        for r in await rows(db, "SELECT invoice, count(*) FROM mh_effects GROUP BY invoice")
    }
    keys = {f"grant:{i}" for i in effects}
    seen = net.sink.seen
    dup_keys = {k for k, n in seen.items() if n > 1}
    uncertain = 0
    if dup_keys:
        # A resend relaybox recorded as such: after an uncertain outcome (a lease that
        # expired unrecorded), or after an attempt that got no answer (a timeout or a
        # cut connection: the request may have arrived, so it is sent again, with the
        # same webhook-id).
        uncertain = await scalar(
            db,
            "SELECT count(DISTINCT o.key) FROM relaybox_outbox o JOIN relaybox_outbox_attempts a"
            " ON a.outbox_id = o.id WHERE o.key = ANY(:keys)"
            " AND (a.outcome = 'uncertain' OR (a.outcome = 'retry' AND a.status_code IS NULL))",
            keys=sorted(dup_keys),
        )
    by_status = {
        r[0]: r[1]
        for r in await rows(db, "SELECT status, count(*) FROM relaybox_inbox GROUP BY status")
    }
    return Tally(
        sent=len(invoices),
        accepted=len(accepted),
        processed=len(effects),
        effects=sum(effects.values()),
        doubled=sum(1 for i in accepted if effects.get(i) != 1)
        + sum(1 for n in effects.values() if n > 1),
        delivered=len(keys & set(seen)),
        duplicates=len(dup_keys),
        uncertain=uncertain,
        lost=len(keys - set(seen)) + len(accepted - set(effects)),
        inbox=by_status,
    )


def check(t: Tally) -> None:
    assert t.doubled == 0, f"a 2xx'd delivery not processed exactly once in effect: {t}"
    assert t.lost == 0, f"lost work: {t}"
    assert t.duplicates == t.uncertain, f"an outbox duplicate that relaybox did not record: {t}"
    assert set(t.inbox) <= {"done"}, f"inbox rows not done: {t.inbox}"
    assert t.accepted > 0


async def start_hosts(net: Network, db: Relaybox, envs: list[dict[str, str]]) -> None:
    await net.start(admin_url(), str(db.store.engine.url.database))
    assert net.sink is not None
    for n, env in enumerate(envs, 1):
        net.add_host(f"h{n}", {**env, "MH_SINK_URL": net.sink.url, "MH_HOST": f"h{n}"})
    try:
        await asyncio.gather(*(h.run(net.database_url) for h in net.hosts))
    except Exception as exc:
        raise AssertionError(f"hosts did not start: {exc}\n{net.tails()}") from None


async def test_a_host_sigkilled_under_load(net: Network, db: Relaybox) -> None:
    await start_hosts(net, db, [host_env() for _ in range(3)])
    first, second = deliveries("k1", 180), deliveries("k2", 120)
    urls = [h.url for h in net.hosts]
    dead = net.hosts[1]
    pids = {p.pid for p in dead.procs}
    load = asyncio.create_task(post_all(urls, first))  # round robin: every host at once
    started = time.monotonic()
    leased: set[int] = set()
    held: set[int] = set()
    # Until its dispatcher is mid-delivery, or workers hold inbox rows. Looked for from
    # the load's start: the three hosts take it in well under a second (an event held
    # for a few milliseconds), and a first look half a second in found it all done.
    while time.monotonic() < started + 15:
        leased, held = await leased_by(db, pids), await held_inbox(db)
        if leased or held:
            break
        await asyncio.sleep(0.005)
    assert leased or held, f"the host died holding no work: nothing to move\n{net.tails()}"
    t0 = time.monotonic()
    dead.kill()
    inbox_moved, outbox_moved = await asyncio.gather(
        seconds_until_done(db, "relaybox_inbox", held, "done", t0, CLAIM_HOLD + 30),
        seconds_until_done(db, "relaybox_outbox", leased, "sent", t0, LEASE_TTL + 30),
    )
    statuses = await load
    statuses += await post_all([net.hosts[0].url, net.hosts[2].url], second)
    invoices = [i for i, _, _ in first + second]
    accepted = {i for i, s in zip(invoices, statuses, strict=True) if s is not None and s < 300}
    await settle(db, net, accepted, within=60)
    t = await tally(db, net, invoices, statuses)
    print(
        "\n"
        + t.line(
            "host SIGKILLed",
            held_at_kill=len(held),
            leased_by_dead=len(leased),
            inbox_moved_s=None if inbox_moved is None else round(inbox_moved, 2),
            outbox_moved_s=None if outbox_moved is None else round(outbox_moved, 2),
            claim_hold_s=CLAIM_HOLD,
            lease_ttl_s=LEASE_TTL,
        )
    )
    check(t)
    assert inbox_moved is not None and inbox_moved <= CLAIM_HOLD + SLACK, net.tails()
    assert outbox_moved is not None and outbox_moved <= LEASE_TTL + SLACK, net.tails()


async def test_a_host_cut_off_from_the_database_mid_transaction_and_back(
    net: Network, db: Relaybox
) -> None:
    await start_hosts(net, db, [host_env() for _ in range(3)])
    first, second = deliveries("c1", 180), deliveries("c2", 120)
    urls = [h.url for h in net.hosts]
    load = asyncio.create_task(post_all(urls, first))
    cut = net.hosts[1]
    # Cut while the host is mid-transaction: one of its connections has a transaction
    # open (seen through the proxy's ports), and it still has after the link is down
    # (PostgreSQL keeps the backend, idle in transaction, holding its row locks).
    open_tx, tries, t0 = 0, 0, time.monotonic()
    while not open_tx and tries < 40:
        tries += 1
        while time.monotonic() < t0 + 30:
            if await in_transaction(db, net, cut):
                break
            await asyncio.sleep(0.005)
        cut.link(False)
        t0 = time.monotonic()
        open_tx = await in_transaction(db, net, cut)
        if not open_tx:  # it committed in between: a short flap, and try again
            cut.link(True)
            await asyncio.sleep(0.05)
    assert open_tx, f"never cut the host mid-transaction in {tries} tries\n{net.tails()}"
    held = await held_inbox(db)
    more = asyncio.create_task(post_all([net.hosts[0].url, net.hosts[2].url], second))
    moved = await seconds_until_done(
        db, "relaybox_inbox", held, "done", t0, CLAIM_HOLD + SLACK, unlocked_only=True
    )
    await asyncio.sleep(max(0.0, t0 + CLAIM_HOLD + 2 - time.monotonic()))  # down past the hold
    down = time.monotonic() - t0
    waiting = await not_done_locked(db, held)
    cut.link(True)
    # requests to the cut host while it was away got no answer (None): not accepted
    statuses = await load
    statuses += await more
    invoices = [i for i, _, _ in first + second]
    accepted = {i for i, s in zip(invoices, statuses, strict=True) if s is not None and s < 300}
    await settle(db, net, accepted, within=60)
    t = await tally(db, net, invoices, statuses)
    assert all(p.alive() for p in cut.procs), cut.tails()  # it came back, not restarted
    print(
        "\n"
        + t.line(
            "host cut off",
            its_open_transactions_at_cut=open_tx,
            cut_tries=tries,
            held_at_cut=len(held),
            link_down_s=round(down, 2),
            held_rows_moved_s=None if moved is None else round(moved, 2),
            locked_by_cut_host_until_back=waiting,
            claim_hold_s=CLAIM_HOLD,
        )
    )
    check(t)
    assert moved is not None and moved <= CLAIM_HOLD + SLACK, net.tails()


async def test_hosts_with_clocks_60_s_ahead_and_behind(net: Network, db: Relaybox) -> None:
    """The skewed hosts run (``clock_max_skew`` raised above their skew): only the
    database's clock keeps them from taking what the others hold."""
    allow = {"RELAYBOX_CLOCK_MAX_SKEW": "120"}
    envs = [host_env(), skewed(60, host_env(**allow)), skewed(-60, host_env(**allow))]
    await start_hosts(net, db, envs)
    batch = deliveries("s", 300)
    statuses = await post_all([h.url for h in net.hosts], batch)
    invoices = [i for i, _, _ in batch]
    accepted = {i for i, s in zip(invoices, statuses, strict=True) if s is not None and s < 300}
    await settle(db, net, accepted, within=60)
    t = await tally(db, net, invoices, statuses)
    by_host = {
        r[0]: r[1]
        for r in await rows(db, "SELECT host, count(*) FROM mh_effects GROUP BY host ORDER BY host")
    }
    assert net.sink is not None
    print(
        "\n"
        + t.line(
            "clocks +60 s / -60 s",
            processed_by_host=by_host,
            delivered_by_host=dict(sorted(net.sink.by_host.items())),
        )
    )
    check(t)
    assert t.accepted == t.sent  # the skewed receivers accept too (signatures on DB time)
    # No fault: a row attempted twice was taken while another host held it.
    retaken = await scalar(db, "SELECT count(*) FROM relaybox_inbox WHERE attempts > 1")
    resent = await scalar(db, "SELECT count(*) FROM relaybox_outbox WHERE attempts > 1")
    assert (retaken, resent) == (0, 0), "a held row or a leased delivery was taken"


ORDER_KEYS = ("order_1", "order_2", "order_3")
ORDER_PER_KEY = 40
FORWARD_PORT = 9100  # each host's loopback port to the test's receiver


async def test_ordered_delivery_across_hosts_one_sigkilled(net: Network, db: Relaybox) -> None:
    """An ordered endpoint, 3 keys x 40 messages, the dispatchers of three hosts, one
    host SIGKILLed mid-run; the receiver fails 30 % of new messages at random and
    accepts a key's message only as the next one after the last it accepted. Every
    message arrives, in its key's order, and more than one host delivered."""
    checker = OrderCheckingReceiver(ORDER_KEYS)
    async with HttpReceiver(checker.reply, host=net.gateway) as receiver:
        await start_hosts(net, db, [host_env() for _ in range(3)])
        for h in net.hosts:
            h.forward(FORWARD_PORT, net.gateway, receiver.port)
        local(db)
        url = f"http://127.0.0.1:{FORWARD_PORT}/hook"
        await endpoint(db, url, ordered=True, schedule=[0.05] * 30, max_in_flight=4)
        for i in range(ORDER_PER_KEY):
            for key in ORDER_KEYS:
                await publish_one(db, "order.updated", {"i": i}, ordering_key=key)
        victim = net.hosts[1]
        total = len(ORDER_KEYS) * ORDER_PER_KEY
        killed_at = None
        deadline = time.monotonic() + 180
        while checker.total() < total and time.monotonic() < deadline:
            if killed_at is None and checker.total() >= total // 3:
                victim.kill()
                killed_at = checker.total()
            await asyncio.sleep(0.05)
        assert checker.total() == total, f"accepted {checker.accepted}\n{net.tails()}"
        assert killed_at is not None
        requests = len(receiver.requests)

    assert checker.out_of_order == [], checker.out_of_order
    for key in ORDER_KEYS:
        assert checker.accepted[key] == list(range(1, ORDER_PER_KEY + 1))
    by_pid = {p.pid: h.name for h in net.hosts for p in h.procs}
    owners = await rows(
        db, "SELECT DISTINCT dispatcher FROM relaybox_outbox_attempts WHERE dispatcher IS NOT NULL"
    )
    hosts = {by_pid.get(int(str(r[0]).split(":")[1]), "?") for r in owners}
    print(
        f"\nmultihost[ordered, host SIGKILLed]: messages={total} requests={requests}"
        f" accepted_when_killed={killed_at} delivering_hosts={sorted(hosts)} out_of_order=0"
    )
    assert len(hosts - {"?"}) >= 2, hosts
