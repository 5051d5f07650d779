"""Providers that are data only: a :class:`Preset` row each (its
:class:`~relaybox.sources.scheme.Scheme` and its names), published by :func:`publish` as
a :class:`~relaybox.sources.scheme.SchemeSource` class and the
``relaybox.sources.<provider>`` factory. The rows are in
:mod:`relaybox.sources.providers` and :mod:`relaybox.sources.timestamped` (HMAC) and
:mod:`relaybox.sources.unsigned` (HTTP Basic, a token).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from relaybox.errors import ConfigurationError
from relaybox.sources.scheme import Scheme, SchemeSource, UrlSchemeSource, factory

__all__ = ["Preset", "publish", "publish_all"]


@dataclass(frozen=True)
class Preset:
    """A provider that is data only: its :class:`Scheme`, published by :func:`publish`
    as the class ``name`` (``doc`` its docstring) and the factory ``provider``
    (``factory_doc`` its docstring). ``url``: the source takes a
    ``url`` option, the public URL the provider signs (a :class:`UrlSchemeSource`),
    with the request's query appended (``"with query"``) or exactly as configured
    (``"exact"``)."""

    provider: str
    name: str
    scheme: Scheme
    doc: str
    factory_doc: str
    url: str | None = None


def publish(preset: Preset, module: str) -> tuple[type[SchemeSource], Callable[..., SchemeSource]]:
    """The class and the factory of ``preset``, defined in ``module``."""
    base: type[SchemeSource] = SchemeSource
    namespace: dict[str, Any] = {
        "__doc__": preset.doc,
        "__module__": module,
        "__qualname__": preset.name,
        "provider": preset.provider,
        "scheme": preset.scheme,
    }
    if preset.url is not None:
        if preset.url not in ("with query", "exact"):
            raise ConfigurationError(f"{preset.provider}: unknown url {preset.url!r}")
        base = UrlSchemeSource
        namespace["append_query"] = preset.url == "with query"
    cls = type(preset.name, (base,), namespace)
    return cls, factory(cls, preset.factory_doc)


def publish_all(
    presets: Iterable[Preset], module: str
) -> dict[str, tuple[type[SchemeSource], Callable[..., SchemeSource]]]:
    """Each preset's class and factory (:func:`publish`), by provider name."""
    return {preset.provider: publish(preset, module) for preset in presets}
