"""``relaybox doctor``: check configuration, the key of endpoint signing secrets,
database reachability, migrations, registered channels, clock skew, long transactions
and dead rows (warnings); name each
problem and exit with the code of the worst (see :mod:`relaybox.cli.exits`)."""

from __future__ import annotations

import asyncio
import json
import sys

import click

from relaybox.app import Relaybox
from relaybox.cli.common import Target, app_options, missing_sqlite_file, safe_url
from relaybox.cli.exits import (
    EXIT_CLOCK,
    EXIT_DATABASE,
    EXIT_FAILED,
    EXIT_SCHEMA,
    EXIT_SECRETS,
    EXIT_USAGE,
)
from relaybox.cli.ops import _console, _json_option
from relaybox.errors import TABLES_MISSING, ConfigurationError

__all__ = ["COMMANDS"]


class _Checks:
    """Check results in order, and the exit code the worst of them means."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []
        self.exit_code = 0

    def add(self, name: str, status: str, detail: str, *, exit_code: int = EXIT_FAILED) -> None:
        self.rows.append({"check": name, "status": status, "detail": detail})
        if status == "fail" and self.exit_code == 0:
            self.exit_code = exit_code


MIN_DEAD_ROWS = 10_000
"""Dead rows a table must have before its dead-row ratio is worth a warning."""


async def _doctor_health(box: Relaybox, checks: _Checks, limits: tuple[float, float]) -> None:
    """Long transactions and dead rows on PostgreSQL; free pages and the write-ahead
    log on SQLite (:meth:`~relaybox.store.operator.OperatorStore.database_health`)."""
    max_age, max_ratio = limits
    health = await box.store.operator.database_health()
    if health.pages is not None:  # SQLite
        free = (health.free_pages or 0) / health.pages if health.pages else 0.0
        wal = health.wal_bytes or 0
        detail = (
            f"{health.free_pages} of {health.pages} pages free ({free:.0%}), write-ahead "
            f"log {wal / 1048576:.1f} MiB; SQLite shows no other connection's transactions"
        )
        if wal > 64 * 1048576:
            checks.add(
                "database health",
                "warn",
                detail + ": a long read (another process's open transaction) keeps "
                "checkpoints from emptying the log",
            )
        elif free > max_ratio and (health.free_pages or 0) > MIN_DEAD_ROWS:
            checks.add(
                "database health",
                "warn",
                detail + ": run VACUUM at a quiet time to give the space back",
            )
        else:
            checks.add("database health", "ok", detail)
        return
    long = [t for t in health.transactions if t["relaybox"] and t["age"] > max_age]
    if long:
        named = "; ".join(
            f"pid {t['pid']} ({t['application_name'] or 'no application_name'}, "
            f"{t['state']}) open {t['age']:.0f} s"
            for t in long[:5]
        )
        checks.add(
            "transactions",
            "warn",
            f"{len(long)} transaction(s) holding relaybox's tables open longer than "
            f"{max_age:g} s: {named}: its row locks stall the rows it holds, and vacuum "
            "cannot remove dead rows meanwhile (pg_terminate_backend(pid) ends one)",
        )
    else:
        oldest = health.oldest(relaybox=True)
        checks.add(
            "transactions",
            "ok",
            f"none holding relaybox's tables longer than {max_age:g} s"
            + (f" (oldest {oldest:.1f} s)" if oldest is not None else ""),
        )
    bloated = []
    worst = 0.0
    for t in health.tables:
        total = t["live"] + t["dead"]
        ratio = t["dead"] / total if total else 0.0
        worst = max(worst, ratio)
        if ratio > max_ratio and t["dead"] >= MIN_DEAD_ROWS:
            bloated.append(f"{t['table']} {t['dead']} dead ({ratio:.0%})")
    if bloated:
        checks.add(
            "dead rows",
            "warn",
            f"dead rows over {max_ratio:.0%} of {', '.join(bloated)}: autovacuum is behind "
            "or a long transaction keeps it from cleaning up (check 'transactions'); "
            "VACUUM the table, then tune autovacuum for it",
        )
    else:
        checks.add(
            "dead rows",
            "ok",
            f"no relaybox table over {max_ratio:.0%} dead rows (highest {worst:.0%})",
        )


async def _doctor_database(
    box: Relaybox, checks: _Checks, max_skew: float, limits: tuple[float, float] = (60.0, 0.2)
) -> None:
    from relaybox.store.backend import load_migrations

    url = safe_url(box)
    try:
        store = box.store
        probe = await store.operator.doctor_probe()
    except ConfigurationError as exc:  # e.g. an unsupported URL scheme
        checks.add("database", "fail", str(exc), exit_code=EXIT_USAGE)
        return
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        if "relaybox_migrations" in text:  # reachable, never migrated
            checks.add("database", "ok", f"reachable: {url}")
            checks.add("migrations", "fail", TABLES_MISSING, exit_code=EXIT_SCHEMA)
            return
        checks.add(
            "database",
            "fail",
            f"database unreachable ({url}): {type(exc).__name__}: {text[:300]}",
            exit_code=EXIT_DATABASE,
        )
        return
    checks.add("database", "ok", f"reachable: {url} ({store.backend})")
    known = {v: f"{v:04d}_{n}" for v, n, _ in load_migrations(store.backend)}
    missing = [known[v] for v in sorted(set(known) - probe.applied)]
    unknown = sorted(probe.applied - set(known))
    if missing:
        checks.add(
            "migrations",
            "fail",
            f"not applied: {', '.join(missing)}: run `relaybox migrate`",
            exit_code=EXIT_SCHEMA,
        )
    elif unknown:
        checks.add(
            "migrations",
            "warn",
            f"the database has migrations this relaybox does not know ({unknown}): "
            "is an older version running against a newer schema?",
        )
    else:
        checks.add("migrations", "ok", f"all {len(known)} applied")
    if not missing:
        await _doctor_secrets(box, checks)
        await _doctor_channels(box, checks)
        await _doctor_silence(box, checks, probe.db_now)
        await _doctor_health(box, checks, limits)
    # Rounded to the millisecond shown, without a negative zero ("-0.000 s").
    skew = round(probe.db_now - (probe.before + probe.after) / 2, 3) + 0.0
    detail = f"database clock {skew:+.3f} s from this machine's"
    if abs(skew) > max_skew:
        where = (
            "the worker and the dispatcher on this host take no work until it is back"
            if store.db.clock_from_database
            else "backoff, leases and retention read this clock"
        )
        checks.add(
            "clock",
            "fail",
            detail + f" (over clock_max_skew, {max_skew:g} s): {where}; sync NTP on both machines",
            exit_code=EXIT_CLOCK,
        )
    else:
        checks.add("clock", "ok", detail)


async def _doctor_channels(box: Relaybox, checks: _Checks) -> None:
    """Pending outbox rows whose channel this app never registers: no dispatcher
    delivers them."""
    from relaybox.ops import inbound as ops

    stuck = {
        name: n
        for name, n in (await ops.unregistered_channels(box)).items()
        if not name.startswith("ep_")
    }
    if stuck:
        named = ", ".join(f"{name} ({n} pending)" for name, n in sorted(stuck.items()))
        checks.add(
            "channels",
            "fail",
            f"outbox rows for channels this app does not register: {named}; register them "
            "with box.outbound.channel(name, ...) or they are never delivered",
        )


async def _doctor_silence(box: Relaybox, checks: _Checks, now: float) -> None:
    """Sources and endpoints the last silence check found silent (relaybox.silence),
    and watched source names this app does not have."""
    from relaybox.ops.inbound import age_text

    settings = box.settings.silence
    summary = await box.store.silence.summary(limit=5)
    unknown = sorted(set(settings.sources) - set(box.sources))
    found = [
        f"source {s.name} (nothing for {age_text(now - s.last_seen)})"
        for s in summary.silent_sources
        if s.last_seen is not None
    ]
    if summary.silent_endpoints:
        longest = summary.endpoints[0].last_seen if summary.endpoints else None
        found.append(
            f"{summary.silent_endpoints} endpoint(s) taking nothing while deliveries wait"
            + (
                f" (longest {age_text(now - longest)}: {summary.endpoints[0].name})"
                if longest
                else ""
            )
        )
    if found:
        checks.add(
            "silence",
            "warn",
            "silent: " + "; ".join(found) + ": see docs/operating.md, Alerts and runbooks",
        )
    if unknown:
        checks.add(
            "silence",
            "warn",
            f"[silence.sources] names source(s) this app does not have: {', '.join(unknown)}",
        )
    if not found and not unknown and (settings.sources or settings.endpoints is not None):
        what = f"{len(settings.sources)} source(s)"
        if settings.endpoints is not None:
            what += " and the endpoints"
        checks.add("silence", "ok", f"{what} watched, none silent")


def _doctor_secrets_key(box: Relaybox, checks: _Checks) -> None:
    """Where the key that seals endpoint signing secrets comes from, and whether it is
    protected: a key on PostgreSQL, a readable key file only its owner can read."""
    from relaybox.outbound.registry import outbound
    from relaybox.outbound.vault import MISSING_HINT, KeyFileError

    vault = outbound(box).vault
    if vault.configured:
        checks.add("secrets_key", "ok", "outbound.secrets_key is set")
        return
    key_file = vault.key_file
    if key_file is None:
        if vault.sealing:  # an in-memory database: a key as short-lived as its data
            checks.add("secrets_key", "ok", "in-memory database: a key per process")
            return
        checks.add(
            "secrets_key",
            "fail",
            "outbound.secrets_key is not set: relaybox keeps no key of its own for a"
            " database that is not a SQLite file, so endpoints cannot be created, secrets"
            f" cannot be rotated or sealed; {MISSING_HINT}",
            exit_code=EXIT_SECRETS,
        )
        return
    try:
        vault.check()
    except KeyFileError as exc:
        checks.add("secrets_key", "fail", str(exc), exit_code=EXIT_USAGE)
        return
    mode = key_file.mode()
    if mode is None:
        checks.add(
            "secrets_key",
            "ok",
            f"key file {key_file.path}: made when the first endpoint secret is stored",
        )
    elif mode & 0o077:
        checks.add(
            "secrets_key",
            "fail",
            f"key file {key_file.path} is open to other users (mode {mode:04o}): whoever"
            f" reads it and the database can sign webhooks; run `chmod 600 {key_file.path}`",
            exit_code=EXIT_SECRETS,
        )
    else:
        checks.add(
            "secrets_key",
            "ok",
            f"key file {key_file.path} (mode {mode:04o}): back it up, every sealed secret needs it",
        )


async def _doctor_secrets(box: Relaybox, checks: _Checks) -> None:
    """Endpoint signing secrets against the keys relaybox has."""
    from relaybox.outbound.endpoints import secrets_at_rest
    from relaybox.outbound.registry import outbound
    from relaybox.outbound.vault import KeyFileError

    try:
        n = await secrets_at_rest(box)
    except KeyFileError:
        return  # reported by the secrets_key check
    if not any(n.values()):
        return
    vault = outbound(box).vault
    if n["locked"]:
        lost = vault.key_file is not None and vault.key_file.mode() is None
        checks.add(
            "secrets",
            "fail",
            f"{n['locked']} endpoint secret(s) sealed with a key {vault.source} does"
            " not hold: deliveries to their endpoints are held until it does"
            + (": the key file is missing, restore it from your backup" if lost else ""),
        )
    elif n["plaintext"] and not vault.sealing:
        checks.add(
            "secrets",
            "warn",
            f"{n['plaintext']} endpoint secret(s) stored in plaintext: whoever reads the"
            " database can sign webhooks; set outbound.secrets_key, then run"
            " `relaybox migrate`",
        )
    elif n["plaintext"] or n["older"]:
        checks.add(
            "secrets",
            "warn",
            f"{n['plaintext']} in plaintext and {n['older']} under an older key:"
            " run `relaybox migrate` (seals the plaintext ones) or"
            " `relaybox endpoints seal-secrets` (seals both)",
        )
    else:
        checks.add("secrets", "ok", f"{n['current']} endpoint secret(s) sealed")


@click.command()
@app_options
@click.option(
    "--max-skew",
    type=float,
    default=None,
    help="seconds of clock skew allowed  [default: the clock_max_skew setting, 5]",
)
@click.option(
    "--max-transaction-age",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="PostgreSQL: seconds a transaction holding relaybox's tables may be open before "
    "it is named",
)
@click.option(
    "--max-dead-ratio",
    type=click.FloatRange(0, 1),
    default=0.2,
    show_default=True,
    help="dead rows (PostgreSQL) or free pages (SQLite) over all of a table or file "
    "before it is named (when there are 10,000 or more)",
)
@_json_option
def doctor(
    target: Target,
    max_skew: float | None,
    max_transaction_age: float,
    max_dead_ratio: float,
    as_json: bool,
) -> None:
    """Check configuration, the key of endpoint secrets, database reachability,
    migrations, clock skew, long transactions and dead rows (warnings); name each
    problem and exit non-zero (2 configuration, 3 database unreachable, 4 tables
    missing or migrations pending, 5 endpoint secrets not protected at rest: no
    outbound.secrets_key on PostgreSQL or a key file open to other users, 6 this
    machine's clock past clock_max_skew from the database's; 1 other)."""
    checks = _Checks()
    box: Relaybox | None = None
    try:
        box = target.load()
    except click.ClickException as exc:
        checks.add("configuration", "fail", exc.format_message(), exit_code=EXIT_USAGE)
    if box is not None:
        s = box.settings
        checks.add(
            "configuration",
            "ok",
            f"{len(box.sources)} source(s), retention {s.retention.payload_max_age / 86400:g} d"
            + ("" if s.retention.enabled else " (scheduled purge disabled)"),
        )
        if s.admin_token is None:
            checks.add("admin", "warn", "admin_token is not set: /admin refuses every request")
        else:
            checks.add("admin", "ok", "admin_token is set")

        async def run() -> None:
            assert box is not None
            try:
                skew = box.settings.clock_max_skew if max_skew is None else max_skew
                limits = (max_transaction_age, max_dead_ratio)
                await asyncio.wait_for(_doctor_database(box, checks, skew, limits), 30)
            except TimeoutError:
                checks.add(
                    "database",
                    "fail",
                    f"no answer within 30 s ({safe_url(box)})",
                    exit_code=EXIT_DATABASE,
                )
            finally:
                try:
                    await box.close()
                except Exception:  # closing a store that never connected
                    pass

        missing = missing_sqlite_file(box)
        try:
            if missing is not None:  # opening it would create an empty database
                checks.add(
                    "database",
                    "warn",
                    f"no database at {missing} ({safe_url(box)}): `relaybox migrate` creates"
                    " it, or name yours with --database-url",
                )
                checks.add("migrations", "fail", TABLES_MISSING, exit_code=EXIT_SCHEMA)
            else:
                asyncio.run(run())
        except (OSError, ConfigurationError) as exc:  # the store could not even be opened
            checks.add(
                "database",
                "fail",
                f"database unreachable ({safe_url(box)}): {type(exc).__name__}: {exc}",
                exit_code=EXIT_DATABASE,
            )
        # After the database: with both wrong, the exit code names the database.
        _doctor_secrets_key(box, checks)
    if as_json:
        click.echo(json.dumps({"ok": checks.exit_code == 0, "checks": checks.rows}))
    else:
        from rich.table import Table

        t = Table("check", "status", "detail", title="relaybox doctor")
        colors = {"ok": "green", "warn": "yellow", "fail": "red"}
        for row in checks.rows:
            t.add_row(row["check"], f"[{colors[row['status']]}]{row['status']}[/]", row["detail"])
        _console().print(t)
        for row in checks.rows:
            if row["status"] == "fail":
                click.echo(f"problem: {row['check']}: {row['detail']}", err=True)
    sys.exit(checks.exit_code)


COMMANDS = [doctor]
