"""Settings: defaults → a TOML file → ``RELAYBOX_*`` environment variables → validation.

Nested settings are reached from the environment with a double underscore:
``RELAYBOX_WORKER__CONCURRENCY=16``. Sources that need no code are declared in the
file under ``[sources.NAME]`` (see ``relaybox.example.toml``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relaybox.errors import ConfigurationError

__all__ = ["Settings", "WorkerSettings", "load_settings"]


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(8, ge=1, description="events processed at once per process")
    batch: int = Field(16, ge=1, le=1000, description="rows claimed per transaction")
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


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str = "sqlite:///relaybox.db"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    log_json: bool = True
    accept_timeout: float = Field(10.0, gt=0)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith("RELAYBOX_") or key.startswith("RELAYBOX_TEST_"):
            continue
        path = key[len("RELAYBOX_") :].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Read settings; raise :class:`ConfigurationError` with every problem named."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigurationError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"config file {p} is not valid TOML: {exc}") from None
    data = _merge(data, _env_layer(env))
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None
