"""Pull-based recovery: find deliveries the provider made while relaybox could not take
them, and bring them in.

Some providers retry for days (Stripe); GitHub does not retry a failed delivery at
all. Whatever relaybox never received it can never process, so for such providers
recovery is ours: list the provider's recent deliveries, find the event ids missing
from the inbox, and either

- **ingest** them (default): fetch each missing delivery's original request
  (headers and payload) from the provider's API and insert it through the same inbox
  insert as the receiver (same event key, same accept rules, same worker and
  handlers). The request comes from an API authenticated with our token, not from an
  HTTP POST, so the row is marked ``recovered_via``. The body is re-serialised
  compactly from the API's JSON; when that reproduces the provider's bytes the
  signature is checked as usual, and a later live redelivery is then a plain
  duplicate; or
- **redeliver**: ask the provider to send them again (GitHub: ``POST
  …/deliveries/{id}/attempts``); they arrive signed at the receiver like any other
  delivery. The receiver must be reachable from the provider.

Recovery is idempotent: the inbox's unique event key decides, so running it twice
changes nothing, and a delivery that arrives live while recovery runs is a duplicate.
Each action is recorded in ``relaybox_recoveries`` and counted on
``relaybox_recovered_deliveries{source,action}``.

:class:`GitHubDeliveries` follows GitHub's REST shape: ``GET
/repos/{owner}/{repo}/hooks/{hook_id}/deliveries`` (or ``/orgs/{org}/hooks/{id}/…``,
or ``/app/hook/deliveries`` with an App JWT), newest first, ``per_page`` ≤ 100 and
cursor pagination through the ``Link`` header; ``GET …/deliveries/{id}`` for the full
``request.headers`` / ``request.payload``; ``POST …/deliveries/{id}/attempts`` (202)
to redeliver. GitHub keeps deliveries for a few days: run recovery soon after an
outage (``relaybox recover --source github --since 6h``).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp
import structlog

from relaybox import tracing
from relaybox.errors import ConfigurationError, RejectedDelivery, RelayboxError
from relaybox.inbound.projections import counter
from relaybox.sources.base import Source, Verified, extract
from relaybox.store import NewDelivery
from relaybox.store.history import RecoveryRecord

if TYPE_CHECKING:
    from relaybox.runtime import InboundRuntime, Runtime

__all__ = [
    "DeliveryLog",
    "DeliveryRequest",
    "DeliverySummary",
    "GitHubDeliveries",
    "RecoveryError",
    "RecoveryReport",
    "log_for",
    "recover",
    "register",
]

log = structlog.get_logger("relaybox.recovery")

Mode = Literal["ingest", "redeliver"]

# Credentials of the hop, never part of the provider's message (as in the receiver).
_DROP_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


class RecoveryError(RelayboxError):
    """The provider's delivery API refused or failed a request."""


@dataclass(frozen=True)
class DeliverySummary:
    """One delivery attempt as the provider lists it."""

    delivery_id: str
    event_id: str  # GitHub: the guid, sent as X-GitHub-Delivery, kept by redeliveries
    delivered_at: float
    status_code: int | None = None
    redelivery: bool = False
    event: str | None = None
    action: str | None = None


@dataclass(frozen=True)
class DeliveryRequest:
    """The original request of a delivery: header names in lower case, parsed payload."""

    headers: dict[str, str]
    payload: Any


class DeliveryLog(Protocol):
    """What a provider offers for recovery. ``name`` marks recovered rows."""

    name: str

    def deliveries(self, since: float) -> AsyncIterator[DeliverySummary]:
        """Attempts delivered at or after ``since``, in any order."""
        ...

    async def request(self, delivery_id: str) -> DeliveryRequest: ...

    async def redeliver(self, delivery_id: str) -> None: ...

    async def close(self) -> None: ...


class GitHubDeliveries:
    """GitHub's webhook deliveries API for one hook: a repository's (``repo`` +
    ``hook_id``), an organization's (``org`` + ``hook_id``) or a GitHub App's
    (``app=True``; ``token`` is then the App's JWT)."""

    name = "github-api"

    def __init__(
        self,
        *,
        token: str,
        repo: str | None = None,
        org: str | None = None,
        hook_id: int | str | None = None,
        app: bool = False,
        api_url: str = "https://api.github.com",
        per_page: int = 100,
        timeout: float = 30.0,
        max_pages: int = 1000,
    ) -> None:
        if not token:
            raise ConfigurationError("GitHub recovery needs an API token")
        if app:
            if repo or org or hook_id is not None:
                raise ConfigurationError("an App hook takes no repo, org or hook id")
            base = "/app/hook/deliveries"
        elif hook_id is None or bool(repo) == bool(org):
            raise ConfigurationError("give a hook id and either a repo (owner/name) or an org")
        elif repo:
            if repo.count("/") != 1:
                raise ConfigurationError(f"repo must be owner/name, not {repo!r}")
            base = f"/repos/{repo}/hooks/{hook_id}/deliveries"
        else:
            base = f"/orgs/{org}/hooks/{hook_id}/deliveries"
        if not 1 <= per_page <= 100:
            raise ConfigurationError("per_page must be between 1 and 100 (GitHub's limit)")
        self.base = api_url.rstrip("/") + base
        self.per_page = per_page
        self.max_pages = max_pages
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never print the token
        return f"GitHubDeliveries({self.base!r})"

    async def __aenter__(self) -> GitHubDeliveries:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={
                    "Accept": "application/vnd.github+json",
                    "Authorization": f"Bearer {self._token}",
                    "X-GitHub-Api-Version": "2022-11-28",
                    "User-Agent": "relaybox-recovery",
                },
            )
        return self._session

    async def _call(self, method: str, url: str, **params: Any) -> tuple[Any, Any]:
        path = "/" + url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        try:
            async with self._http().request(method, url, params=params or None) as response:
                text = await response.text()
                links = response.links
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            # Not a database problem: say which side failed (the CLI maps OSError to 3).
            raise RecoveryError(f"GitHub API unreachable ({method} {path}): {exc!r}") from None
        if status >= 300:
            try:
                message = json.loads(text).get("message", "")
            except (ValueError, AttributeError):
                message = text[:200]
            raise RecoveryError(f"GitHub answered {status} to {method} {path}: {message}")
        return (json.loads(text) if text.strip() else None), links

    async def deliveries(self, since: float) -> AsyncIterator[DeliverySummary]:
        """Newest first, following the ``Link: rel="next"`` cursor, until a page
        reaches deliveries older than ``since``."""
        url: str | None = self.base
        params: dict[str, Any] = {"per_page": self.per_page}
        for _ in range(self.max_pages):
            if url is None:
                return
            items, links = await self._call("GET", url, **params)
            params = {}  # the next link carries per_page and the cursor
            older = False
            for item in items or ():
                summary = _github_summary(item)
                if summary.delivered_at < since:
                    older = True
                    continue
                yield summary
            nxt = links.get("next") if links else None
            url = None if older or nxt is None else str(nxt.get("url"))
        raise RecoveryError(f"more than {self.max_pages} pages of deliveries: narrow --since")

    async def request(self, delivery_id: str) -> DeliveryRequest:
        item, _ = await self._call("GET", f"{self.base}/{delivery_id}")
        req = (item or {}).get("request") or {}
        headers = req.get("headers") or {}
        if not isinstance(headers, Mapping):
            raise RecoveryError(f"delivery {delivery_id} has no request headers")
        payload = req.get("payload")
        if isinstance(payload, str):  # a form-encoded hook, or a payload sent as text
            try:
                payload = json.loads(payload)
            except ValueError:
                raise RecoveryError(f"delivery {delivery_id} payload is not JSON") from None
        return DeliveryRequest({str(k).lower(): str(v) for k, v in headers.items()}, payload)

    async def redeliver(self, delivery_id: str) -> None:
        await self._call("POST", f"{self.base}/{delivery_id}/attempts")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _github_summary(item: Mapping[str, Any]) -> DeliverySummary:
    when = datetime.fromisoformat(str(item["delivered_at"]).replace("Z", "+00:00"))
    code = item.get("status_code")
    return DeliverySummary(
        delivery_id=str(item["id"]),
        event_id=str(item["guid"]),
        delivered_at=when.timestamp(),
        status_code=code if isinstance(code, int) else None,
        redelivery=bool(item.get("redelivery")),
        event=item.get("event"),
        action=item.get("action"),
    )


@dataclass
class RecoveryReport:
    source: str
    since: float
    mode: str
    dry_run: bool
    listed: int = 0  # distinct event ids the provider delivered (or tried) since T
    present: int = 0  # of those, already in the inbox
    missing: list[str] = field(default_factory=list)
    ingested: list[str] = field(default_factory=list)
    redelivery_requested: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # arrived meanwhile
    failed: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def recover(
    box: InboundRuntime,
    source_name: str,
    deliveries: DeliveryLog,
    *,
    since: float,
    mode: Mode = "ingest",
    dry_run: bool = False,
    account: str | None = None,
    tenant: str | None = None,
) -> RecoveryReport:
    """Bring in the deliveries of ``source_name`` made since ``since`` and missing from
    the inbox. ``account``/``tenant`` override what a recovered delivery maps to when
    its signature cannot be checked again (the source's secrets then prove nothing).

    Traced as ``relaybox.inbound.recovery`` (its counts); each delivery it brings in keeps
    this span's context, as a received one keeps its request's."""
    with tracing.span(
        "relaybox.recovery", attributes={"relaybox.source": source_name, "relaybox.mode": mode}
    ) as span:
        report = RecoveryReport(source_name, since, mode, dry_run)
        await _recover(box, deliveries, report, account=account, tenant=tenant)
        if span.is_recording():
            span.set_attributes(
                {
                    "relaybox.recovery.listed": report.listed,
                    "relaybox.recovery.missing": len(report.missing),
                    "relaybox.recovery.ingested": len(report.ingested),
                    "relaybox.recovery.failed": len(report.failed),
                }
            )
        return report


async def _recover(
    box: InboundRuntime,
    deliveries: DeliveryLog,
    report: RecoveryReport,
    *,
    account: str | None,
    tenant: str | None,
) -> None:
    """Fill ``report`` (its source, time, mode and dry run as asked) with what the
    recovery found and did."""
    source_name, since, mode, dry_run = report.source, report.since, report.mode, report.dry_run
    source = box.sources.get(source_name)
    if source is None:
        raise ConfigurationError(f"no source named {source_name!r}")
    if mode not in ("ingest", "redeliver"):
        raise ConfigurationError(f"mode must be ingest or redeliver, not {mode!r}")
    newest: dict[str, DeliverySummary] = {}
    async for item in deliveries.deliveries(since):
        kept = newest.get(item.event_id)
        if kept is None or item.delivered_at > kept.delivered_at:
            newest[item.event_id] = item
    report.listed = len(newest)
    present = await _present(box, source_name, list(newest))
    report.present = len(present)
    # Oldest first, so inbox ids follow the provider's order; listings come newest
    # first, which breaks ties between attempts of the same second.
    missing = sorted(
        (s for s in reversed(newest.values()) if s.event_id not in present),
        key=lambda s: s.delivered_at,
    )
    report.missing = [s.event_id for s in missing]
    counted = counter(box, "recovered_deliveries")
    for summary in missing:
        if dry_run:
            continue
        try:
            if mode == "redeliver":
                await deliveries.redeliver(summary.delivery_id)
                await _record(box, source_name, summary, "redelivery_requested", None)
                report.redelivery_requested.append(summary.event_id)
                counted.labels(source_name, "redelivery_requested").inc()
                continue
            status = await _ingest(box, source, deliveries, summary, account=account, tenant=tenant)
        except (RecoveryError, RejectedDelivery) as exc:
            report.failed[summary.event_id] = f"{type(exc).__name__}: {exc}"
            log.error(
                "recovery_failed",
                source=source_name,
                event_id=summary.event_id,
                delivery_id=summary.delivery_id,
                error=report.failed[summary.event_id],
            )
            continue
        if status in ("accepted", "ignored"):
            report.ingested.append(summary.event_id)
            counted.labels(source_name, "ingested").inc()
        else:
            report.duplicates.append(summary.event_id)
    log.info(
        "recovery",
        source=source_name,
        mode=mode,
        dry_run=dry_run,
        listed=report.listed,
        present=report.present,
        missing=len(report.missing),
        ingested=len(report.ingested),
        redelivery_requested=len(report.redelivery_requested),
        failed=len(report.failed),
    )


async def _present(box: Runtime, source: str, event_ids: list[str]) -> set[str]:
    return await box.store.history.inbox_find_events(source, event_ids)


async def _ingest(
    box: Runtime,
    source: Source,
    deliveries: DeliveryLog,
    summary: DeliverySummary,
    *,
    account: str | None,
    tenant: str | None,
) -> str:
    """Fetch the original request and insert it like the receiver would."""
    req = await deliveries.request(summary.delivery_id)
    headers = {k: v for k, v in req.headers.items() if k not in _DROP_HEADERS}
    # GitHub sends compact JSON in key order: this often reproduces the signed bytes.
    body = json.dumps(req.payload, separators=(",", ":"), ensure_ascii=False).encode()
    now = box.clock.now()
    signature = "matched"
    try:
        verified = source.verify(headers, body, now, check_time=False)
    except RejectedDelivery:
        signature = "not reproducible"
        verified = _api_verified(source, headers, req.payload, body, account, tenant)
    if verified.event_id != summary.event_id:
        raise RecoveryError(
            f"delivery {summary.delivery_id} names event {verified.event_id!r}, "
            f"listed as {summary.event_id!r}"
        )
    delivery = NewDelivery(
        source=verified.source,
        account=account or verified.account,
        event_id=verified.event_id,
        event_type=verified.event_type,
        tenant=tenant or verified.tenant,
        fingerprint=verified.fingerprint,
        payload=body,
        headers=json.dumps(headers),
        version=verified.version,
        received_at=now,
        ignored=source.ignores(verified.event_type),
        subject=verified.subject,
        traceparent=tracing.traceparent(),  # the recovery's span (None untraced)
    )
    via = f"{deliveries.name}:delivery/{summary.delivery_id} (signature {signature})"
    store = box.store
    async with store.transaction() as conn:
        [outcome] = await store.inbox.insert(conn, [delivery])
        if outcome.status in ("accepted", "ignored"):
            await store.history.inbox_mark_recovered(conn, outcome.inbox_id, via)
            await store.history.recovery_record(
                RecoveryRecord(
                    source=source.name,
                    event_id=summary.event_id,
                    delivery_id=summary.delivery_id,
                    action="ingested",
                    inbox_id=outcome.inbox_id,
                    recovered_at=now,
                ),
                conn=conn,
            )
    log.info(
        "delivery_recovered",
        source=source.name,
        event_key=list(delivery.key),
        event_type=delivery.event_type,
        inbox_id=outcome.inbox_id,
        status=outcome.status,
        via=via,
    )
    return outcome.status


def _api_verified(
    source: Source,
    headers: dict[str, str],
    payload: Any,
    body: bytes,
    account: str | None,
    tenant: str | None,
) -> Verified:
    """Identity of a delivery whose signature cannot be checked again: the provider's
    API vouches for it. Mirrors :meth:`Source.verify`, where the secret that matched
    may name the account: here only a secret shared by every configured secret can."""
    ident = source.identify(headers, payload)
    accounts = {(s.account, s.tenant) for s in source.secrets}
    shared_account, shared_tenant = accounts.pop() if len(accounts) == 1 else (None, None)
    chosen = account or shared_account or ident.account or source.account or "default"
    version = ident.version
    if source.version_path is not None:
        version = extract(source.version_path, headers, payload)
    return Verified(
        source=source.name,
        account=chosen,
        event_id=ident.event_id,
        event_type=ident.event_type or "",
        tenant=tenant or shared_tenant or source.tenants.get(chosen) or source.tenant,
        fingerprint=source.fingerprint(body, headers, payload),
        payload=payload,
        version=version,
        subject=source.subject_of(headers, payload),
    )


async def _record(
    box: Runtime, source: str, summary: DeliverySummary, action: str, inbox_id: int | None
) -> None:
    await box.store.history.recovery_record(
        RecoveryRecord(
            source=source,
            event_id=summary.event_id,
            delivery_id=summary.delivery_id,
            action=action,
            inbox_id=inbox_id,
            recovered_at=box.clock.now(),
        )
    )


_logs: weakref.WeakKeyDictionary[Runtime, dict[str, Callable[[], DeliveryLog]]] = (
    weakref.WeakKeyDictionary()
)


def register(box: Runtime, source: str, factory: Callable[[], DeliveryLog]) -> None:
    """Declare how ``relaybox recover --source`` reaches ``source``'s delivery log
    (a factory: the client is made inside the command's event loop)::

        recovery.register(box, "github", lambda: GitHubDeliveries(
            token=os.environ["GITHUB_TOKEN"], repo="octo-org/app", hook_id=123))
    """
    _logs.setdefault(box, {})[source] = factory


def log_for(box: Runtime, source: str) -> Callable[[], DeliveryLog] | None:
    return _logs.get(box, {}).get(source)
