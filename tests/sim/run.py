"""One simulated run: the real pipeline as real processes, driven by a seed's schedule.

:func:`simulate` starts a fresh database (a PostgreSQL database of its own, or a
SQLite file), then ``relaybox serve --roles receiver``, two ``relaybox worker``, two
``relaybox dispatch`` and ``relaybox maintenance`` (every one with
``--app tests.sim.app:box``; on PostgreSQL through a :class:`TcpProxy`), two webhook
endpoints of tenant ``t1`` (one ordered) and a provider that signs deliveries as
Stripe does and retries them until a 2xx, as Stripe does. It plays the schedule step
by step, checks the invariants every few steps and once everything settled, and
returns a :class:`Report`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from examples.credits import app as credits
from sqlalchemy.engine import make_url

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound import enable_endpoint, list_endpoints
from relaybox.sources.base import subject_digest
from tests.sim import invariants
from tests.sim.app import OUTBOUND
from tests.sim.schedule import ACCOUNTS, Step, answer, schedule
from tests.support.outbound_app import endpoint, local
from tests.support.procs import Proc, Procs, skewed
from tests.support.proxy import TcpProxy
from tests.support.receivers import HttpReceiver, Reply, Seen

__all__ = ["Report", "Violation", "simulate"]

APP = "tests.sim.app:box"
CLAIM_HOLD = 0.5  # tests.support.procs.FAST_WORKER
TENANTS = ",".join(f"{a}=ws_{i}" for i, a in enumerate(ACCOUNTS))
CHECK_EVERY = 10  # steps between continuous checks


@dataclass
class Violation:
    checker: str
    step: int
    detail: str

    def text(self) -> str:
        return f"[{self.checker}] at step {self.step}: {self.detail}"


@dataclass
class Report:
    seed: int
    backend: str
    steps: int
    ran: int = 0
    seconds: float = 0.0
    events: int = 0  # distinct provider events
    deliveries: int = 0  # HTTP requests the provider made
    acked: int = 0  # of which answered 2xx
    webhooks: int = 0  # requests the endpoints received
    faults: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    observed: Counter[str] = field(default_factory=Counter)
    """What the final checks looked at (rows by status, quarantines, ordered sequences
    compared...): a check that saw nothing proves nothing."""
    violations: list[Violation] = field(default_factory=list)
    settled: bool = False
    workdir: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "backend": self.backend,
            "steps": self.steps,
            "ran": self.ran,
            "seconds": round(self.seconds, 1),
            "events": self.events,
            "deliveries": self.deliveries,
            "acked": self.acked,
            "webhooks": self.webhooks,
            "faults": dict(self.faults),
            "checks": dict(self.checks),
            "observed": dict(self.observed),
            "settled": self.settled,
            "violations": [v.__dict__ for v in self.violations],
        }


@dataclass
class Erased:
    """An erasure the run asked for: the customer, and what relaybox had indexed under
    it just before (the rows that must end up emptied)."""

    customer: str
    inbox: list[int] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    quarantine: list[int] = field(default_factory=list)
    erasure: int | None = None  # relaybox_erasures.id, once box.erase() answered
    error: str = ""


@dataclass
class Sent:
    """What the provider sent for one event id, and what it was answered."""

    event: dict[str, Any]  # the Stripe event as first sent
    first: tuple[bytes, dict[str, str], bytes] | None = None  # its first signed bytes, fp
    answers: list[tuple[int, str, bytes]] = field(default_factory=list)  # status, answer, fp


class Sim:
    def __init__(self, seed: int, backend: str, workdir: Path, admin_url: str | None) -> None:
        self.seed, self.backend, self.workdir, self.admin_url = seed, backend, workdir, admin_url
        self.report = Report(seed, backend, 0, workdir=str(workdir))
        self.sent: dict[str, Sent] = {}
        self.stale_answers: list[tuple[str, int]] = []
        self.senders: set[asyncio.Task[None]] = set()
        self.procs = Procs(workdir)
        self.running: dict[str, Proc] = {}
        self.skews: dict[str, float] = {}
        self.restarts: set[asyncio.Task[None]] = set()
        self.faults_until = 0.0  # monotonic: a database fault lasts until then
        self.calm_since = time.monotonic()  # since when every process is up, no fault
        self.proxy: TcpProxy | None = None
        self.endpoints: dict[str, HttpReceiver] = {}
        self.endpoint_ids: dict[str, str] = {}
        self.erasures: list[Erased] = []
        self.requests_per: Counter[tuple[str, str]] = Counter()
        self.step = 0
        self.database_url = ""  # what the checks use (never through the proxy)
        self.process_url = ""  # what the processes use
        self.box: Relaybox | None = None
        self.signer = credits.configure(
            Relaybox(settings=Settings(database_url="sqlite:///unused.db")),
            {"CREDITS_TENANTS": TENANTS},
        )
        self.mailbox = workdir / "mailbox.jsonl"
        self.http: aiohttp.ClientSession | None = None

    # -- set-up ---------------------------------------------------------------------

    async def start(self) -> None:
        if self.backend == "postgres":
            assert self.admin_url
            name = f"relaybox_sim_{self.seed}_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
            conn = await asyncpg.connect(_dsn(self.admin_url))
            try:
                await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()
            self.database_url = (
                make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)
            )
            target = make_url(self.admin_url)
            self.proxy = await TcpProxy(host=target.host, port=target.port or 5432).start()
            self.process_url = (
                make_url(self.database_url)
                .set(host="127.0.0.1", port=self.proxy.port)
                .render_as_string(hide_password=False)
            )
        else:
            self.database_url = f"sqlite:///{self.workdir / 'relaybox.db'}"
            self.process_url = self.database_url
        self.box = Relaybox(settings=Settings(database_url=self.database_url))
        local(self.box, **OUTBOUND)
        await credits.setup(self.box)
        for name, ordered in (("plain", False), ("ordered", True)):
            receiver = HttpReceiver(self._script(name))
            await receiver.__aenter__()
            self.endpoints[name] = receiver
            self.endpoint_ids[name], _ = await endpoint(
                self.box,
                receiver.url,
                ordered=ordered,
                on_dead="skip",
                timeout=1.0,
                schedule=[0.1, 0.3, 0.6, 1.0, 1.0, 1.0],
            )
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        self.procs.base_env.update(
            {
                "CREDITS_TENANTS": TENANTS,
                "SIM_MAILBOX": str(self.mailbox),
                "RELAYBOX_RETENTION__INTERVAL": "1",
                "RELAYBOX_RETENTION__PAYLOAD_MAX_AGE": "2",
                "RELAYBOX_RETENTION__OUTBOX_PAYLOAD_MAX_AGE": "2",
                "RELAYBOX_WORKER__CONCURRENCY": "2",
                "RELAYBOX_LOG_LEVEL": "warning",
            }
        )
        await asyncio.gather(*(self._start_proc(name) for name in _PROCS))

    def _script(self, name: str) -> Any:
        def reply(seen: Seen) -> Reply:
            key = (name, seen.webhook_id)
            n = self.requests_per[key]
            self.requests_per[key] += 1
            seq = _seq(seen.body)
            a = answer(self.seed, seq, n, endpoint=name)
            headers = {"retry-after": str(a.retry_after)} if a.retry_after else {}
            return Reply(a.status, headers=headers, delay=a.delay)

        return reply

    async def _start_proc(self, name: str) -> None:
        env = skewed(self.skews[name]) if self.skews.get(name) else None
        url = self.process_url
        if name == "receiver":
            proc = await self.procs.serve(
                url, roles="receiver", app=APP, env=env, name=name, within=60
            )
        elif name.startswith("worker"):
            proc = self.procs.worker(url, app=APP, env=env, name=name)
        elif name.startswith("dispatcher"):
            proc = self.procs.start(name, ["dispatch", "--app", APP, "--database-url", url], env)
        else:
            proc = self.procs.start(name, ["maintenance", "--app", APP, "--database-url", url], env)
        self.running[name] = proc

    async def close(self, *, keep_database: bool = False) -> None:
        for task in [*self.senders, *self.restarts]:
            task.cancel()
        self.procs.cleanup()
        if self.http is not None:
            await self.http.close()
        for receiver in self.endpoints.values():
            with contextlib.suppress(Exception):
                await receiver.__aexit__(None, None, None)
        if self.box is not None:
            await self.box.close()
        if self.proxy is not None:
            await self.proxy.close()
        if (
            self.backend == "postgres"
            and self.admin_url
            and self.database_url
            and not keep_database
        ):
            name = make_url(self.database_url).database
            conn = await asyncpg.connect(_dsn(self.admin_url))
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()

    # -- the provider ---------------------------------------------------------------

    def _event(self, args: dict[str, Any]) -> dict[str, Any]:
        invoice = {
            "id": f"in_s{self.seed}_{args['invoice']}",
            "object": "invoice",
            "status": "paid",
            "amount_paid": 2000,
            "currency": "usd",
            "customer": args["customer"],
            "seq": args["invoice"],
            "sim": args["sim"],
        }
        return _stripe_event(args["event"], "invoice.paid", invoice, args["account"])

    def send(self, event: dict[str, Any], *, at: float | None = None, raw: bool = False) -> None:
        sent = self.sent.setdefault(event["id"], Sent(event))
        task = asyncio.create_task(self._deliver(sent, event, at=at, raw=raw))
        self.senders.add(task)
        task.add_done_callback(self.senders.discard)

    async def _deliver(
        self, sent: Sent, event: dict[str, Any], *, at: float | None, raw: bool
    ) -> None:
        """Like a provider: retried on a 5xx or a refused connection, never on a 4xx
        or a 2xx (a stale signature is sent once per answer)."""
        assert self.http is not None
        if raw and sent.first is not None:
            body, headers, fp = sent.first
        else:
            body = json.dumps(event, separators=(",", ":")).encode()
            now = time.time() if at is None else at
            stripe = self.signer.sources["stripe"]
            headers = stripe.sign(body, event_id=event["id"], event_type=event["type"], now=now)
            headers = {**headers, "content-type": "application/json"}
            fp = stripe.verify(headers, body, now).fingerprint
            if sent.first is None:
                sent.first = (body, headers, fp)
        for attempt in range(60):
            receiver = self.running.get("receiver")
            status, text = 0, ""
            if receiver is not None and receiver.alive():
                self.report.deliveries += 1
                try:
                    url = receiver.url + "/webhooks/stripe"
                    async with self.http.post(url, data=body, headers=headers) as r:
                        status = r.status
                        text = await r.text()
                except (TimeoutError, aiohttp.ClientError, OSError):
                    status, text = 0, ""
            answer_status = _relaybox_status(text) if 200 <= status < 300 else ""
            if 200 <= status < 300 and not answer_status:
                # Not relaybox's answer: whatever took the port of a killed receiver.
                self.report.observed["foreign answers"] += 1
                status = 0
            if 200 <= status < 300:
                self.report.acked += 1
                where = f"{answer_status} by {receiver.name if receiver else '?'} pid"
                where += f" {receiver.pid if receiver else '?'} at {time.time():.3f}"
                self._answered(sent, at, (status, where, fp))
                return
            if 400 <= status < 500:
                self._answered(sent, at, (status, text[:200], fp))
                return
            await asyncio.sleep(min(0.05 * (attempt + 1), 1.0))
        self._answered(sent, at, (status, "gave up", fp))

    def _answered(self, sent: Sent, at: float | None, answer: tuple[int, str, bytes]) -> None:
        if at is None:
            sent.answers.append(answer)
        else:  # signed in the past on purpose: kept apart
            self.stale_answers.append((sent.event["id"], answer[0]))

    # -- steps ----------------------------------------------------------------------

    async def play(self, step: Step) -> None:
        self.step = step.n
        kind, args = step.kind, step.args
        if kind in ("new", "same_invoice"):
            self.send(self._event(args))
        elif kind == "burst":
            for one in args["events"]:
                self.send(self._event(one))
        elif kind == "dup":
            self.send(self.sent[args["event"]].event)
        elif kind == "same_bytes":
            prior = self.sent[args["event"]]
            if prior.first is None:  # the first send has not signed yet
                self.send(prior.event)
            else:
                self.send(prior.event, raw=True)
        elif kind == "conflict":
            original = self.sent[args["event"]].event
            other = json.loads(json.dumps(original))
            other["data"]["object"]["conflict"] = step.n  # other content, same id
            self.send(other)
        elif kind == "stale":
            self.send(self.sent[args["event"]].event, at=time.time() - 3600)
        elif kind == "refund":
            charge = {
                "id": f"ch_s{self.seed}_{args['invoice']}",
                "object": "charge",
                "invoice": f"in_s{self.seed}_{args['invoice']}",
                "amount_refunded": 2000,
                "refunded": True,
            }
            self.send(_stripe_event(args["event"], "charge.refunded", charge, args["account"]))
        else:
            self.report.faults[kind] += 1
            await self._fault(kind, args)
        if step.gap:
            await asyncio.sleep(step.gap)

    async def _fault(self, kind: str, args: dict[str, Any]) -> None:
        now = time.monotonic()
        if "erase" in args:
            self.report.faults["erase"] += 1
            self._later(0, self._erase(args["erase"]))
        if kind == "kill":
            name = args["proc"]
            proc = self.running.pop(name, None)
            if proc is not None and proc.alive():
                proc.kill()
            self.skews.pop(name, None)
            self._restart(name, args["down"])
        elif kind == "clock":
            name = args["proc"]
            self.skews[name] = args["skew"]
            proc = self.running.pop(name, None)
            if proc is not None and proc.alive():
                proc.kill()
            self._restart(name, 0.0)
        elif kind in ("db_reset", "db_blackhole", "db_delay"):
            seconds = args.get("seconds", 0.2)
            self.faults_until = max(self.faults_until, now + seconds)
            if self.proxy is not None:
                self._later(seconds, self._db_fault(kind, seconds, args.get("ms", 0)))
            else:  # SQLite: the file's write lock held instead
                self._later(seconds, self._sqlite_lock(seconds))
        elif kind == "idle_tx":
            self.faults_until = max(self.faults_until, now + args["seconds"])
            self._later(args["seconds"], self._idle_tx(args["seconds"]))
        elif kind == "maintenance":
            proc = self.procs.start(
                "maintenance-once",
                ["maintenance", "--once", "--app", APP, "--database-url", self.process_url],
            )
            self._later(0, self._reap(proc))
        elif kind == "pause":
            await self._reenable()
        self.calm_since = max(self.calm_since, now)

    async def _erase(self, customer: str) -> None:
        """A data-protection request for one customer, as ``relaybox erase --subject``
        makes it (``box.erase``), while the processes run and faults happen. What is
        indexed under the customer when it is asked must be emptied once its rows have
        finished (the ``erased`` checker); keys and fingerprints stay, so every other
        checker holds as before."""
        assert self.box is not None
        erased = Erased(customer)
        self.erasures.append(erased)
        refs = await invariants.fetch_rows(
            self,
            "SELECT kind, ref FROM relaybox_subjects WHERE digest = :d",
            d=subject_digest(customer),
        )
        erased.inbox = [int(r["ref"]) for r in refs if r["kind"] == "inbox"]
        erased.messages = [str(r["ref"]) for r in refs if r["kind"] == "message"]
        held = await invariants.fetch_rows(self, "SELECT id, inbox_id FROM relaybox_quarantine")
        erased.quarantine = [r["id"] for r in held if r["inbox_id"] in set(erased.inbox)]
        for _ in range(20):  # SQLite: the write lock may be held for seconds right now
            try:
                erasure = await self.box.erase(
                    subject=customer, actor="simulation", reason=f"step {self.step}"
                )
            except Exception as exc:
                erased.error = f"{type(exc).__name__}: {exc}"[:300]
                await asyncio.sleep(1.0)
                continue
            erased.erasure, erased.error = erasure.id, ""
            return

    def _later(self, seconds: float, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)

    def _restart(self, name: str, down: float) -> None:
        async def again() -> None:
            await asyncio.sleep(down)
            for _ in range(5):
                try:
                    await self._start_proc(name)
                    break
                except Exception:  # the database may be cut right now: try again
                    await asyncio.sleep(1.0)
            self.calm_since = time.monotonic()

        self._later(down, again())

    async def _reap(self, proc: Proc) -> None:
        with contextlib.suppress(TimeoutError):
            await proc.wait_exit(within=60)

    async def _db_fault(self, kind: str, seconds: float, ms: int) -> None:
        assert self.proxy is not None
        if kind == "db_reset":
            self.proxy.cut()
            await asyncio.sleep(0.2)
            self.proxy.restore()
        elif kind == "db_blackhole":
            self.proxy.blackhole()
            await asyncio.sleep(seconds)
            self.proxy.flow()
        else:
            self.proxy.delay = ms / 1000
            await asyncio.sleep(seconds)
            self.proxy.delay = 0.0
        self.calm_since = time.monotonic()

    async def _sqlite_lock(self, seconds: float) -> None:
        path = make_url(self.database_url).database
        done = threading.Event()

        def hold() -> None:
            db = sqlite3.connect(str(path), timeout=30)
            try:
                db.execute("BEGIN IMMEDIATE")
                done.wait(seconds)
                db.rollback()
            finally:
                db.close()

        thread = asyncio.to_thread(hold)
        await thread
        self.calm_since = time.monotonic()

    async def _idle_tx(self, seconds: float) -> None:
        """A connection that locks rows a worker or a dispatcher wants, then sits idle in
        its transaction (PostgreSQL; SQLite: the write lock)."""
        if self.backend != "postgres":
            await self._sqlite_lock(seconds)
            return
        conn = await asyncpg.connect(_dsn(self.database_url))
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.execute(
                "SELECT id FROM relaybox_inbox WHERE status = 'pending' ORDER BY id LIMIT 5"
                " FOR UPDATE SKIP LOCKED"
            )
            await conn.execute(
                "SELECT id FROM relaybox_outbox WHERE status = 'pending' ORDER BY id LIMIT 5"
                " FOR UPDATE SKIP LOCKED"
            )
            await asyncio.sleep(seconds)
            await tx.rollback()
        finally:
            await conn.close()
        self.calm_since = time.monotonic()

    async def _reenable(self) -> None:
        """An operator switches disabled endpoints back on (a 410 disables one)."""
        assert self.box is not None
        for ep in await list_endpoints(self.box, "t1"):
            if ep.status != "enabled":
                await enable_endpoint(self.box, ep.id, tenant="t1", reason="simulation")

    # -- end ------------------------------------------------------------------------

    async def heal(self) -> None:
        """Every fault over, every process up."""
        for task in list(self.restarts):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 30)
        if self.proxy is not None:
            self.proxy.restore()
            self.proxy.flow()
            self.proxy.delay = 0.0
        # Clocks set right again (NTP): a process whose clock is off by more than
        # clock_max_skew takes no work, by design, so the run could never settle.
        for name in [n for n, skew in self.skews.items() if skew]:
            del self.skews[name]
            proc = self.running.pop(name, None)
            if proc is not None:
                proc.kill()
        for name in _PROCS:
            proc = self.running.get(name)
            if proc is None or not proc.alive():
                await self._start_proc(name)
        self.calm_since = time.monotonic()

    async def settle(self, within: float) -> bool:
        """Until the provider has its answers and no row is pending. ``within`` seconds
        without progress (the provider's answers and the pending rows unchanged) is a
        failure; a slow machine that still makes progress gets up to four times that."""
        assert self.box is not None
        began = last_change = time.monotonic()
        seen: tuple[int, int, int] | None = None
        while time.monotonic() - last_change < within and time.monotonic() - began < 4 * within:
            pending = await invariants.fetch_rows(
                self,
                "SELECT (SELECT count(*) FROM relaybox_inbox WHERE status = 'pending') AS i,"
                " (SELECT count(*) FROM relaybox_outbox WHERE status = 'pending') AS o",
            )
            now = (len(self.senders), int(pending[0]["i"]), int(pending[0]["o"]))
            if now == (0, 0, 0):
                return True
            if now != seen:
                seen, last_change = now, time.monotonic()
            await asyncio.sleep(0.25)
        return False


_PROCS = ("receiver", "worker0", "worker1", "dispatcher0", "dispatcher1", "maintenance")


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _relaybox_status(text: str) -> str:
    """The ``status`` of a receiver's 2xx answer ('' when it is not relaybox's)."""
    try:
        status = json.loads(text).get("status", "")
    except (ValueError, AttributeError):
        return ""
    ok = status in ("accepted", "duplicate", "quarantined", "ignored")
    return str(status) if ok else ""


def _seq(body: bytes) -> int:
    try:
        data = json.loads(body)
        return int(data["data"]["seq"])
    except (ValueError, KeyError, TypeError):
        return -1


def _stripe_event(
    event_id: str, event_type: str, obj: dict[str, Any], account: str
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_700_000_000,
        "type": event_type,
        "livemode": False,
        "data": {"object": obj},
    }
    if account != credits.DEV_ACCOUNT:
        event["account"] = account
    return event


async def simulate(
    seed: int,
    steps: int,
    *,
    backend: str = "sqlite",
    admin_url: str | None = None,
    workdir: Path | None = None,
    settle_within: float = 90.0,
    keep: bool = False,
    before_final: Callable[[Sim], Awaitable[None]] | None = None,
    reenable_at_end: bool = False,
) -> Report:
    """Run ``schedule(seed, steps)`` against fresh processes and a fresh database.
    ``reenable_at_end``: switch disabled endpoints back on before settling, which
    releases the deliveries tests/sim/test_found.py shows stranded."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix=f"relaybox-sim-{seed}-")) if workdir is None else workdir
    sim = Sim(seed, backend, work, admin_url)
    report = sim.report
    report.steps = steps
    began = time.monotonic()
    try:
        await sim.start()
        plan = schedule(seed, steps)
        for step in plan:
            await sim.play(step)
            report.ran = step.n + 1
            if (step.n + 1) % CHECK_EVERY == 0:
                await invariants.check(sim, final=False)
                if report.violations:
                    break
        if not report.violations:
            await sim.heal()
            if reenable_at_end:  # an operator switches disabled endpoints back on
                await sim._reenable()
            report.settled = await sim.settle(settle_within)
            if before_final is not None:  # the tests' way to prove a checker can fail
                await before_final(sim)
            await invariants.check(sim, final=True)
    finally:
        report.seconds = time.monotonic() - began
        report.events = len(sim.sent)
        report.webhooks = sum(len(r.requests) for r in sim.endpoints.values())
        await sim.close(keep_database=keep and report.failed)
        if keep and report.failed and backend == "postgres":
            report.workdir += f" (database kept: {sim.database_url})"
        if own and not keep and not report.violations:
            shutil.rmtree(work, ignore_errors=True)
    return report
