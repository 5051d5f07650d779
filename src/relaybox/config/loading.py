"""Reading the settings: defaults, then a TOML file, then ``RELAYBOX_*`` environment
variables, then validation, every problem reported at once and named by its path.
"""

from __future__ import annotations

import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from relaybox.config.settings import Settings
from relaybox.errors import ConfigurationError

__all__ = ["CLI_VARIABLES", "load_settings", "merge_settings"]


CLI_VARIABLES = frozenset({"RELAYBOX_APP", "RELAYBOX_DEV"})
"""Environment variables of the ``relaybox`` command (``--app``, development mode), not
settings: the settings leave them alone."""


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Shorter names first, so a scalar that clashes with a nested setting
    # (RELAYBOX_WORKER and RELAYBOX_WORKER__CONCURRENCY) is found in any order.
    names = sorted(
        (
            k
            for k in env
            if k.startswith("RELAYBOX_")
            and not k.startswith("RELAYBOX_TEST_")
            and k not in CLI_VARIABLES
        ),
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


def _list_field(annotation: Any) -> bool:
    """Whether a field holds a list (``list[str]``, ``list[float] | None``, ...)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_list_field(a) for a in typing.get_args(annotation) if a is not type(None))
    return origin in (list, tuple, set, frozenset)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _dict_model_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``dict[str, Model]`` field, else ``None``."""
    if typing.get_origin(annotation) is dict:
        args = typing.get_args(annotation)
        return _model_of(args[1]) if len(args) == 2 else None
    return None


def _env_lists(model: type[BaseModel], layer: dict[str, Any], prefix: str) -> None:
    """Lists from the environment, in place: a JSON array (``["127.0.0.0/8"]``) or
    comma-separated values (``127.0.0.0/8,::1/128``). An environment variable is a
    string; a list setting would otherwise refuse every value."""
    for name, value in layer.items():
        field = model.model_fields.get(name)
        if field is None:
            continue  # reported by validation, named by its path
        var = f"{prefix}{name.upper()}"
        nested = _model_of(field.annotation)
        entries = _dict_model_of(field.annotation)
        if nested is not None and isinstance(value, dict):
            _env_lists(nested, value, var + "__")
        elif entries is not None and isinstance(value, dict):
            # A table of named models ([outbound.brokers.<name>]): each entry is one.
            for key, entry in value.items():
                if isinstance(entry, dict):
                    _env_lists(entries, entry, f"{var}__{key.upper()}__")
        elif isinstance(value, str) and _list_field(field.annotation):
            text = value.strip()
            if text.startswith("["):
                try:
                    parsed = json.loads(text)
                except ValueError as exc:
                    raise ConfigurationError(f"{var} is not a JSON array: {exc}") from None
                if not isinstance(parsed, list):
                    raise ConfigurationError(f"{var} is not a JSON array")
                layer[name] = parsed
            else:
                layer[name] = [v.strip() for v in text.split(",") if v.strip()]


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    given: Mapping[str, Any] | None = None,
) -> Settings:
    """Read settings: ``given`` (settings as a dict, e.g. Django's ``RELAYBOX``), then
    the TOML file at ``path``, then ``RELAYBOX_*`` variables of ``env``, each over the
    one before; raise :class:`ConfigurationError` with every problem named."""
    env = os.environ if env is None else env
    data: dict[str, Any] = dict(given or {})
    if path is not None:
        p = Path(path)
        try:
            data = _merge(data, tomllib.loads(p.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ConfigurationError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"config file {p} is not valid TOML: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigurationError(f"config file {p} is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigurationError(f"config file {p} cannot be read: {exc.strerror}") from None
    env_data = _env_layer(env)
    _env_lists(Settings, env_data, "RELAYBOX_")
    data = _merge(data, env_data)
    return _validated(data)


def _validated(data: dict[str, Any]) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid settings: {validation_problems(exc)}") from None


def validation_problems(exc: ValidationError) -> str:
    """Every problem of ``exc``, each named by its path: ``worker.batch: ...; port: ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )


def _explicit(model: BaseModel) -> dict[str, Any]:
    """The fields set explicitly on ``model`` (nested models: theirs), as values."""
    out: dict[str, Any] = {}
    for name in model.model_fields_set:
        value = getattr(model, name)
        out[name] = _explicit(value) if isinstance(value, BaseModel) else value
    return out


def merge_settings(base: Settings, over: Settings) -> Settings:
    """``base`` with what ``over`` sets explicitly on top (defaults of ``over`` do
    not reset what ``base`` was given in code)."""
    data = _merge(_explicit(base), _explicit(over))
    return _validated(data)
