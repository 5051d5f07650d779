"""What every ``relaybox`` command shares: its ``--app``/``--config``/``--database-url``
options (one :class:`Target` argument) and ``--json``, the box they name (with
development mode), and running one operation on that box's database with the exit
codes of :mod:`relaybox.cli.exits`.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import os
import re
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from relaybox.app import Relaybox
from relaybox.cli.exits import EXIT_DATABASE, EXIT_USAGE, exit_code_for
from relaybox.cli.grammar import actor_option, reason_option
from relaybox.config import load_settings
from relaybox.errors import ConfigurationError, StoreUnavailable

__all__ = [
    "DEV_ENV",
    "ConfigError",
    "Target",
    "action_options",
    "app_options",
    "apply_dev",
    "build_box",
    "json_option",
    "load_box",
    "missing_sqlite_file",
    "relaybox_command",
    "run_async",
    "run_db",
    "run_role",
    "safe_url",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


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
            raise ConfigError(str(exc)) from None
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
    box = build_box(app, config, database_url)
    if dev if dev is not None else dev_requested():
        relaxed = apply_dev(box)
        if relaxed:
            click.echo(f"development mode ({DEV_ENV}): allowed " + "; ".join(relaxed), err=True)
    return box


def build_box(app: str | None, config: str | None, database_url: str | None) -> Relaybox:
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
        raise ConfigError(str(exc)) from exc


def _import_box(app: str) -> Relaybox:
    """``module:attr`` (``attr`` defaults to ``box``): a Relaybox, or a function without
    arguments that returns one. Every mistake is one line (exit 2), not a traceback."""
    module_name, _, attr = app.partition(":")
    attr = attr or "box"
    if not module_name or not all(p.isidentifier() for p in [*module_name.split("."), attr]):
        raise ConfigError(f"--app {app}: expected module:attribute, e.g. myapp:box")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"--app {app}: no module named {exc.name!r} (run from your project's "
                "directory, or install it)"
            ) from None
        raise ConfigError(f"--app {app}: importing {module_name} failed: {exc}") from None
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"--app {app}: importing {module_name} failed: {type(exc).__name__}: {exc}"
        ) from None
    try:
        obj: Any = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--app {app}: module {module_name} has no attribute {attr!r}") from None
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
            raise ConfigError(
                f"--app {app}: {attr}() returned {type(built).__name__}, not a Relaybox"
            )
    raise ConfigError(
        f"--app {app} is a {type(obj).__name__}, not a Relaybox: name the Relaybox "
        "object (e.g. myapp:box), not the web application that mounts it"
    )


class ConfigError(click.ClickException):
    """Invalid settings: reported like any click error, with the usage exit code."""

    exit_code = EXIT_USAGE


def json_option(fn: F) -> F:
    """``--json``: one JSON document on stdout (logs go to stderr)."""
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


@dataclass(frozen=True)
class Target:
    """The box a command names with ``--app``, ``--config`` and ``--database-url``
    (:func:`app_options`)."""

    app: str | None
    config: str | None
    database_url: str | None

    def load(self, *, dev: bool | None = None) -> Relaybox:
        """The box (:func:`load_box`)."""
        return load_box(self.app, self.config, self.database_url, dev=dev)

    def load_logging(self) -> Relaybox:
        """The box (a configuration error exits 2, usage or configuration, not 1: a
        script can tell "fix your settings" from "it failed"), with logging configured
        from its settings (to stderr, so ``--json`` output on stdout stays parseable)."""
        box = self.load()
        from relaybox.log import configure_logging

        configure_logging(box.settings.log_level, json=box.settings.log_json)
        return box


def action_options(what: str) -> Callable[[F], F]:
    """What an operator's action takes after its own arguments: ``--reason`` (recorded
    ``what``), ``--actor`` and ``--json``."""

    def add(fn: F) -> F:
        return reason_option(what)(actor_option(json_option(fn)))

    return add


def app_options(fn: Callable[..., T]) -> Callable[..., T]:
    """``--app``, ``--config`` and ``--database-url``, given to ``fn`` as one
    :class:`Target` argument, ``target``."""

    @functools.wraps(fn)
    def command(
        *args: Any, app: str | None, config: str | None, database_url: str | None, **kwargs: Any
    ) -> T:
        return fn(*args, target=Target(app, config, database_url), **kwargs)

    decorated: Any = command
    decorated = click.option(
        "--database-url", envvar="RELAYBOX_DATABASE_URL", help="overrides the settings"
    )(decorated)
    decorated = click.option(
        "--config", "config", type=click.Path(dir_okay=False), help="TOML settings file"
    )(decorated)
    decorated = click.option(
        "--app", cls=_AppOption, envvar="RELAYBOX_APP", help="module:attribute of your Relaybox"
    )(decorated)
    return command


class _AppOption(click.Option):
    """``--app``, whose help names the default in effect: ``RELAYBOX_APP`` when set
    (``manage.py relaybox`` sets it to the project's box), else the demo."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        default = os.environ.get("RELAYBOX_APP") or "the demo"
        self.help = f"module:attribute of your Relaybox (default: {default})"
        return super().get_help_record(ctx)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a long-lived loop on uvloop when installed (it ships with uvicorn[standard]):
    the worker measured CPU-bound in the plain asyncio loop's socket writes."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


class Role(Protocol):
    """A long-lived role of the box (its worker, its dispatcher)."""

    def run(self) -> Awaitable[Any]: ...

    def stop(self) -> None: ...


async def run_role(box: Relaybox, make: Callable[[], Role]) -> None:
    """Run the role ``make`` builds (in the running loop) until SIGTERM or SIGINT asks
    it to stop, which lets it finish what it holds; then close the box."""
    role = make()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, role.stop)
    try:
        await role.run()
    finally:
        await box.close()


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


def run_db(box: Relaybox, coro: Coroutine[Any, Any, T], *, creates: bool = False) -> T:
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
            f"no database at {missing} ({safe_url(box)}): run `relaybox migrate` to create"
            " it, or name yours with --database-url",
            code="not_migrated",
            exit_code=EXIT_DATABASE,
        )
    try:
        return run_async(coro)  # `relaybox dispatch` runs here: uvloop too
    except Exception as exc:
        code = exit_code_for(exc)
        if code == EXIT_USAGE:  # e.g. an unsupported database URL, a bad time
            raise ConfigError(str(exc)) from exc
        if code != EXIT_DATABASE:
            raise
        if isinstance(exc, OSError | ConnectionError | StoreUnavailable):
            raise CliError(
                f"database unreachable ({safe_url(box)}): {exc}",
                code="database_unavailable",
                exit_code=EXIT_DATABASE,
            ) from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if re.search(r"relaybox_\w+", first) and re.search(r"no such table|does not exist", first):
            raise CliError(
                f"database error ({safe_url(box)}): {first}: relaybox's tables are missing,"
                " run `relaybox migrate`",
                code="not_migrated",
                exit_code=EXIT_DATABASE,
            ) from None
        raise CliError(
            f"database error ({safe_url(box)}): {first}",
            code="database_error",
            exit_code=EXIT_DATABASE,
        ) from None


def relaybox_command() -> str:
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


def safe_url(box: Relaybox) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(box.settings.database_url).render_as_string(hide_password=True)
    except Exception:
        return "<unparsable url>"
