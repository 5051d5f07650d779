"""Settings: defaults → a TOML file → ``RELAYBOX_*`` environment variables → validation.

Nested settings are reached from the environment with a double underscore:
``RELAYBOX_WORKER__CONCURRENCY=16``, ``RELAYBOX_RETENTION__PAYLOAD_MAX_AGE=604800``.
Sources that need no code are declared in the file under ``[sources.NAME]`` (see
``relaybox.example.toml``). Every problem is reported at once, named by its path, so an
operator fixes a broken configuration in one go instead of one error per restart.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from relaybox.errors import ConfigurationError
from relaybox.outbound.settings import OutboundSettings

__all__ = ["AdminSettings", "RetentionSettings", "Settings", "WorkerSettings", "load_settings"]


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(4, ge=1, description="transactions at once per process (PostgreSQL)")
    batch: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="rows claimed at once (default: 128 on PostgreSQL, 32 on SQLite)",
    )
    group: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="events per transaction (default: 16 on PostgreSQL, the whole batch on SQLite)",
    )
    savepoints: bool = Field(
        False,
        description=(
            "PostgreSQL groups: a savepoint per event from the start, so that no handler"
            " runs twice for one attempt; by default only after a handler failed"
        ),
    )
    poll_interval: float = Field(1.0, gt=0, description="seconds between polls when idle")
    claim_hold: float = Field(
        30.0, gt=0, description="seconds a claimed row is held back if its worker dies"
    )
    backoff_base: float = Field(1.0, gt=0)
    backoff_factor: float = Field(2.0, ge=1)
    backoff_cap: float = Field(600.0, gt=0)
    backoff_jitter: float = Field(0.2, ge=0, lt=1)
    max_attempts: int = Field(10, ge=1)
    max_age: float = Field(3 * 24 * 3600.0, gt=0, description="time budget in seconds")


class AdminSettings(BaseModel):
    """The operator surface (``/admin``). Without a token every admin route answers
    401: an admin API that is open by default is the one that ends up on the internet."""

    model_config = ConfigDict(extra="forbid")

    session_ttl: float = Field(
        8 * 3600.0, gt=0, description="seconds a dashboard login stays valid"
    )
    secure_cookie: bool = Field(
        False, description="mark the session cookie Secure (serve /admin over HTTPS)"
    )
    login_max_body: int = Field(
        4096, ge=256, le=1024 * 1024, description="largest login form, bytes (413 above)"
    )
    form_max_body: int = Field(
        16 * 1024, ge=1024, le=1024 * 1024, description="largest dashboard form, bytes"
    )
    api_max_body: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024, description="largest admin API body, bytes"
    )
    login_failures_per_address: int = Field(
        5,
        ge=1,
        description="wrong logins from one client address within login_window before "
        "its logins answer 429",
    )
    login_failures_total: int = Field(
        100,
        ge=1,
        description="wrong logins from all addresses within login_window before every "
        "login answers 429 (a guess spread over many addresses)",
    )
    login_window: float = Field(
        60.0, gt=0, le=24 * 3600, description="seconds the login failure counts cover"
    )
    frame_ancestors: str = Field(
        "'none'",
        max_length=1000,
        pattern=r"^[^;,\r\n]+$",
        description="CSP frame-ancestors of every admin answer: 'none' (with "
        "X-Frame-Options: DENY) forbids framing; a source list allows it to those origins",
    )


class RetentionSettings(BaseModel):
    """What the maintenance job keeps. Keys and outcomes are kept for good: a purged
    event is still a duplicate when its provider resends it, and business keys are
    never purged, because "did this operation already happen?" has no expiry. On the
    sending side, deliveries keep their status, attempts and errors; a purged delivery
    can no longer be redelivered or recovered."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="run the scheduled purge in the maintenance role")
    payload_max_age: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="seconds after an event finished (done, ignored, discarded) before its "
        "payload and headers are dropped",
    )
    outbox_payload_max_age: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="seconds after a delivery finished (sent, dead) before its payload and "
        "its attempts' response bytes are dropped, and its message's body once every "
        "delivery of it is purged",
    )
    interval: float = Field(3600.0, gt=0, description="seconds between maintenance runs")
    batch: int = Field(1000, ge=1, le=100_000, description="rows purged per transaction")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str = "sqlite:///relaybox.db"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    log_json: bool = True
    accept_timeout: float = Field(10.0, gt=0)
    accept_committers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="commits in flight for accepts (default: 3 PostgreSQL, 1 SQLite)",
    )
    gc_freeze: bool = Field(
        True,
        description="at start, move the objects alive then out of the cyclic garbage "
        "collector's reach (gc.freeze): its full passes over the startup heap stalled "
        "requests 30-50 ms",
    )
    admin_token: SecretStr | None = Field(
        None, description="bearer token of the admin API and the dashboard login"
    )
    admin: AdminSettings = Field(default_factory=AdminSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    outbound: OutboundSettings = Field(default_factory=OutboundSettings)
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("admin_token")
    @classmethod
    def _token_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty variable (RELAYBOX_ADMIN_TOKEN=) means "unset", not "the empty token".
        if value is None or value.get_secret_value() == "":
            return None
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (use a random string)")
        return value


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Shorter names first, so a scalar that clashes with a nested setting
    # (RELAYBOX_WORKER and RELAYBOX_WORKER__CONCURRENCY) is found in any order.
    names = sorted(
        (k for k in env if k.startswith("RELAYBOX_") and not k.startswith("RELAYBOX_TEST_")),
        key=lambda k: (k.count("__"), k),
    )
    for key in names:
        path = key[len("RELAYBOX_") :].lower().split("__")
        node = out
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                prefix = "RELAYBOX_" + "__".join(path[: depth + 1]).upper()
                raise ConfigurationError(
                    f"environment variable {key} needs {prefix} to be a table, but {prefix}"
                    " is set to a plain value: unset one of them"
                )
            node = child
        node[path[-1]] = env[key]
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read settings; raise :class:`ConfigurationError` with every problem named."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigurationError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"config file {p} is not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigurationError(f"config file {p} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigurationError(f"config file {p} cannot be read: {exc.strerror}") from None
    data = _merge(data, _env_layer(env))
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
