"""Retention per tenant and per source: which age applies to which row, and the purge
passes that apply them.

An age comes from the most specific scope that sets it:

* **inbound** (an event's payload and headers, a quarantine entry's): the event's
  tenant (when its source mapped the account to one), then its source, then
  ``retention.payload_max_age``;
* **outbound** (a delivery's payload and its attempts' response bytes, a message's
  body): the tenant, then ``retention.outbox_payload_max_age``.

A tenant's ages are set in the configuration file (``[retention.tenants.ID]``) or
through the admin API (stored in ``relaybox_retention_policies``); for each age, the
admin API's value wins over the file's, and removing it there brings the file's back.
A source's age is set in the file only (``[retention.sources.NAME]``): sources are
declared there.

:func:`plan` turns the policies into passes over each table, so that a purge costs
what the number of distinct ages sets, not the number of tenants:

* one pass per distinct tenant age, over those tenants' rows only (``tenant = ANY``,
  a partial ``(tenant, time)`` index, chunks of :data:`TENANTS_PER_STATEMENT`);
* inbound, one pass per source with an age of its own (a ``(source, time)`` index);
* one pass for everything else at the global age. When some tenant or source keeps
  its payloads *longer* than the global age, this pass (and a source's, when a tenant
  keeps longer than its source) scans the candidates from a cursor and leaves the
  rows whose own age has not passed: a row is purged only once its own age passed,
  whichever pass reads it. Otherwise it is the plain batch of a global purge.

Keys (the digests that decide a duplicate, a repeated publish, a business key) are
kept for good unless a keys window is set: ``retention.keys_max_age``, a source's
``keys_max_age`` (its events' keys and its handlers' business keys) or a tenant's
(its messages' idempotency keys). :func:`keys_plan` turns them into expiries by day.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

from relaybox.store import keys
from relaybox.store.history import PurgeTable
from relaybox.store.keys import KEY_KINDS, KeyKind, day_of

if TYPE_CHECKING:
    from relaybox.config import RetentionSettings
    from relaybox.store import Store

__all__ = [
    "TENANTS_PER_STATEMENT",
    "AgeOrigin",
    "KeysPass",
    "PurgePass",
    "RetentionPolicies",
    "ScanMarks",
    "TenantAges",
    "keys_plan",
    "load_policies",
    "plan",
]

TENANTS_PER_STATEMENT = 1000
"""Tenants one batch statement of a tenant-group pass names at most."""

_POLICY_PAGE = 1000
"""Policies read per statement when the purge loads them."""

AgeOrigin = Literal["api", "config", "source", "default"]
"""Where an age comes from: the admin API, the tenant's table in the configuration
file, the event's source (inbound), the global setting."""

INBOUND: tuple[PurgeTable, ...] = ("inbox", "quarantine")
OUTBOUND: tuple[PurgeTable, ...] = ("outbox", "messages")

_Scope = TypeVar("_Scope")


def _set_ages(
    scopes: Mapping[str, _Scope], age: Callable[[_Scope], float | None]
) -> dict[str, float]:
    """The ``age`` of each of ``scopes`` (sources or tenants, by name) that sets one."""
    return {name: found for name, scope in scopes.items() if (found := age(scope)) is not None}


@dataclass(frozen=True, slots=True)
class TenantAges:
    """A tenant's ages as they apply, and where each comes from. ``payload_max_age``
    is ``None`` when the tenant has none of its own: its events' sources decide (or
    the global age)."""

    tenant: str
    payload_max_age: float | None
    payload_origin: AgeOrigin
    outbox_payload_max_age: float
    outbox_origin: AgeOrigin
    config_payload_max_age: float | None = None
    config_outbox_payload_max_age: float | None = None
    api_payload_max_age: float | None = None
    api_outbox_payload_max_age: float | None = None
    updated_at: float | None = None
    updated_by: str | None = None


@dataclass(frozen=True)
class RetentionPolicies:
    """Every age that applies: the global two, each source's, each tenant's (inbound
    and outbound apart, the admin API's already merged over the file's)."""

    payload_max_age: float
    outbox_payload_max_age: float
    sources: Mapping[str, float] = field(default_factory=dict)
    tenants_inbound: Mapping[str, float] = field(default_factory=dict)
    tenants_outbound: Mapping[str, float] = field(default_factory=dict)
    keys_max_age: float | None = None
    """How long keys are kept (``None``: for good), where no scope sets its own."""
    sources_keys: Mapping[str, float] = field(default_factory=dict)
    """Each source's keys window: its events' keys and its handlers' business keys."""
    tenants_keys: Mapping[str, float] = field(default_factory=dict)
    """Each tenant's keys window: the idempotency keys of its published messages."""

    @classmethod
    def from_settings(
        cls,
        settings: RetentionSettings,
        stored: Mapping[str, tuple[float | None, ...]] | None = None,
    ) -> RetentionPolicies:
        """The policies of the configuration, with ``stored`` (tenant: the admin API's
        (inbound, outbound[, keys]) ages, ``None`` where it sets none) over the
        file's."""
        inbound = _set_ages(settings.tenants, lambda ages: ages.payload_max_age)
        outbound = _set_ages(settings.tenants, lambda ages: ages.outbox_payload_max_age)
        tenant_keys = _set_ages(settings.tenants, lambda ages: ages.keys_max_age)
        for tenant, ages_set in (stored or {}).items():
            inbound_age, outbound_age = ages_set[0], ages_set[1]
            keys_age = ages_set[2] if len(ages_set) > 2 else None
            if inbound_age is not None:
                inbound[tenant] = inbound_age
            if outbound_age is not None:
                outbound[tenant] = outbound_age
            if keys_age is not None:
                tenant_keys[tenant] = keys_age
        return cls(
            payload_max_age=settings.payload_max_age,
            outbox_payload_max_age=settings.outbox_payload_max_age,
            sources=_set_ages(settings.sources, lambda s: s.payload_max_age),
            tenants_inbound=inbound,
            tenants_outbound=outbound,
            keys_max_age=settings.keys_max_age,
            sources_keys=_set_ages(settings.sources, lambda s: s.keys_max_age),
            tenants_keys=tenant_keys,
        )

    @property
    def scoped(self) -> bool:
        """Whether any tenant or source has an age of its own."""
        return bool(self.sources or self.tenants_inbound or self.tenants_outbound)

    def inbound_age(self, tenant: str | None, source: str | None) -> float:
        """The age of an event's (or quarantine entry's) payload."""
        if tenant is not None and tenant in self.tenants_inbound:
            return self.tenants_inbound[tenant]
        if source is not None and source in self.sources:
            return self.sources[source]
        return self.payload_max_age

    def outbound_age(self, tenant: str | None) -> float:
        """The age of a delivery's payload and of a message's body."""
        if tenant is not None and tenant in self.tenants_outbound:
            return self.tenants_outbound[tenant]
        return self.outbox_payload_max_age

    def age_of(self, table: PurgeTable, tenant: str | None, source: str | None) -> float:
        if table in INBOUND:
            return self.inbound_age(tenant, source)
        return self.outbound_age(tenant)

    def digest(self) -> str:
        """A fingerprint of every age: a scan's mark holds while it is the same."""
        text = repr(
            (
                self.payload_max_age,
                self.outbox_payload_max_age,
                sorted(self.sources.items()),
                sorted(self.tenants_inbound.items()),
                sorted(self.tenants_outbound.items()),
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def ages(self, table: PurgeTable) -> set[float]:
        """Every distinct age that applies to some row of ``table``."""
        if table in INBOUND:
            return {self.payload_max_age, *self.sources.values(), *self.tenants_inbound.values()}
        return {self.outbox_payload_max_age, *self.tenants_outbound.values()}


@dataclass(frozen=True, slots=True)
class KeysPass:
    """One expiry of keys (:meth:`KeysStore.expire`): the keys of ``kind`` first seen
    before day ``before_day``, of ``scope`` only when it is set (a source's for
    ``event`` and ``operation``, a tenant's for ``message``), else of every scope but
    those in ``keep`` (they keep theirs longer; their own passes expire them)."""

    kind: KeyKind
    before_day: int
    scope: str | None = None
    keep: tuple[str, ...] = ()


def keys_plan(policies: RetentionPolicies, now: float) -> list[KeysPass]:
    """The expiries of keys at ``now``: each scope with a window of its own, then the
    global window (when one is set) for every scope without a longer one. An event key
    and a business key belong to their source, an idempotency key to its tenant: a
    tenant's window applies to its messages' keys, a source's to the other two.

    Keys carry their scope as a 32-bit number (:func:`relaybox.store.keys.scope_of`),
    which two names may share (2^-32 a pair): the names with a window of their own on
    one number get one pass at the longest of their windows, and that number is kept
    from the global pass when any of them keeps longer than it, so that no key is
    forgotten before its own window says."""
    passes: list[KeysPass] = []
    for kind in KEY_KINDS:
        if kind == "outbox":
            passes += _outbox_keys_plan(policies, now)
            continue
        scoped = policies.tenants_keys if kind == "message" else policies.sources_keys
        windows = _scope_windows(scoped)
        for name, age in sorted(windows.items()):
            passes.append(KeysPass(kind, day_of(now - age), scope=name))
        if policies.keys_max_age is not None:
            longer = tuple(sorted(n for n, a in windows.items() if a > policies.keys_max_age))
            passes.append(KeysPass(kind, day_of(now - policies.keys_max_age), keep=longer))
    return passes


def _scope_windows(scoped: Mapping[str, float]) -> dict[str, float]:
    """The window of each scope number that ``scoped`` (names and their windows) sets,
    under the first name on it in sorted order: the longest of its names' windows."""
    windows: dict[int, tuple[str, float]] = {}
    for name, age in sorted(scoped.items()):
        number = keys.scope_of(name)
        first, longest = windows.get(number, (name, age))
        windows[number] = (first, max(longest, age))
    return dict(windows.values())


def _outbox_keys_plan(policies: RetentionPolicies, now: float) -> list[KeysPass]:
    """The outbox's keys (a delivery's belongs to a tenant, a handler row's to a source)
    carry no scope: with the global window set, they go at the longest window of all
    (the global one, every tenant's and every source's), so that none is forgotten
    before its own window says; without it, they are kept for good."""
    if policies.keys_max_age is None:
        return []
    longest = max(
        [policies.keys_max_age, *policies.tenants_keys.values(), *policies.sources_keys.values()]
    )
    return [KeysPass("outbox", day_of(now - longest))]


@dataclass(frozen=True, slots=True)
class PurgePass:
    """One pass of a purge over ``table`` at ``cutoff`` (a time: rows that finished
    before it):

    * ``kind="all"``: every candidate (the plain batch of a global purge);
    * ``kind="tenants"``: the candidates of ``tenants`` (all sharing this age);
    * ``kind="scan"``: the candidates in (time, id) order, of ``source`` only when it
      is set, each purged only once its own age passed (some keep theirs longer).
    """

    table: PurgeTable
    kind: Literal["all", "tenants", "scan"]
    cutoff: float
    tenants: tuple[str, ...] = ()
    source: str | None = None


class ScanMarks:
    """Where each scan pass of the next purge may start, remembered by the process that
    purges (the maintenance loop): a scan leaves only rows whose own age has not
    passed, and each of those belongs to a tenant or a source whose own pass purges it
    when it is due. So while the ages are the same, the next scan starts at the time
    this one ended (the earliest row it could not purge, if one was held by another
    transaction), instead of reading again every row that a longer-keeping tenant
    keeps. Another age anywhere (another digest) starts from the beginning; so does a
    new process."""

    def __init__(self) -> None:
        self._marks: dict[tuple[PurgeTable, str | None], tuple[str, float]] = {}

    def start(self, table: PurgeTable, source: str | None, digest: str) -> float | None:
        """The time the scan of ``table`` (``source``'s) may start at; ``None``: from
        the beginning."""
        found = self._marks.get((table, source))
        return found[1] if found is not None and found[0] == digest else None

    def done(self, table: PurgeTable, source: str | None, digest: str, upto: float) -> None:
        """The scan ended: every row before ``upto`` is purged or left to its own pass."""
        self._marks[(table, source)] = (digest, upto)


def _chunks(names: list[str]) -> Iterator[tuple[str, ...]]:
    for start in range(0, len(names), TENANTS_PER_STATEMENT):
        yield tuple(names[start : start + TENANTS_PER_STATEMENT])


def plan(policies: RetentionPolicies, now: float) -> list[PurgePass]:
    """The passes of a purge at ``now``, in order: per table (events, quarantine
    entries, deliveries, then messages: a message's body goes once its deliveries'
    payloads went), the tenant groups, then the sources, then the rest."""
    passes: list[PurgePass] = []
    for table in (*INBOUND, *OUTBOUND):
        inbound = table in INBOUND
        tenant_ages = policies.tenants_inbound if inbound else policies.tenants_outbound
        default = policies.payload_max_age if inbound else policies.outbox_payload_max_age
        groups: dict[float, list[str]] = {}
        for tenant, age in tenant_ages.items():
            groups.setdefault(age, []).append(tenant)
        for age in sorted(groups):
            for chunk in _chunks(sorted(groups[age])):
                passes.append(PurgePass(table, "tenants", now - age, tenants=chunk))
        longest_tenant = max(tenant_ages.values(), default=0.0)
        if inbound:
            # A scan: an event whose tenant keeps longer than its source is left.
            for source, age in sorted(policies.sources.items()):
                passes.append(PurgePass(table, "scan", now - age, source=source))
        longest_source = max(policies.sources.values(), default=0.0) if inbound else 0.0
        longer = max(longest_tenant, longest_source) > default
        passes.append(PurgePass(table, "scan" if longer else "all", now - default))
    return passes


async def load_policies(store: Store, settings: RetentionSettings) -> RetentionPolicies:
    """The policies now: the configuration's, with every tenant's stored in the
    database (at most ``retention.max_tenant_policies``) over them."""
    stored: dict[str, tuple[float | None, ...]] = {}
    after = ""
    while len(stored) < settings.max_tenant_policies:
        page = await store.retention.policy_page(after=after, limit=_POLICY_PAGE)
        for row in page:
            stored[row.tenant] = (
                row.payload_max_age,
                row.outbox_payload_max_age,
                row.keys_max_age,
            )
        if len(page) < _POLICY_PAGE:
            break
        after = page[-1].tenant
    return RetentionPolicies.from_settings(settings, stored)
