"""The registry the admin app is built from: each area of relaybox (inbox, dead
letters, quarantine, the outbound side) is a :class:`Section` with its JSON
operations, its dashboard pages, a navigation entry and an optional overview panel.

An area plugs in with :func:`register_section`; ``build_admin`` mounts every
registered section, and the OpenAPI document lists every operation. A section that
reads tables a later migration creates names them in ``requires_tables``: until they
exist its routes answer 404 ``not_migrated`` and its navigation entry is hidden, so
the admin app never breaks on a database that is one migration behind.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.routing import BaseRoute

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "Call",
    "Operation",
    "OverviewPanel",
    "Section",
    "register_section",
    "sections",
]


@dataclass(frozen=True)
class Call:
    """One parsed API request: path parameters (integers, or strings for ``{name:str}``),
    the validated query and body models (``None`` when the operation has none), and
    who is asking."""

    box: Runtime
    path: dict[str, Any]
    query: Any
    body: Any
    actor: str


@dataclass(frozen=True)
class Operation:
    """One JSON operation under ``/admin/api/v1``. The same declaration validates the
    request, serialises the answer and writes the OpenAPI entry, so the document
    cannot drift from the code."""

    method: str
    path: str
    operation_id: str
    summary: str
    handler: Callable[[Call], Awaitable[BaseModel]]
    response: type[BaseModel]
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    description: str = ""

    @property
    def path_params(self) -> list[tuple[str, str]]:
        """(name, kind) of each path parameter: ``{id}`` is an integer row id,
        ``{id:str}`` a text id (outbound ids such as ``ep_…``)."""
        return [(n, k or "int") for n, k in re.findall(r"{(\w+)(?::(\w+))?}", self.path)]

    @property
    def openapi_path(self) -> str:
        return re.sub(r"{(\w+):\w+}", r"{\1}", self.path)


@dataclass(frozen=True)
class OverviewPanel:
    """A block on the overview page: a title and rows of (label, value, link)."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    metric: str = ""


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    order: int
    nav_path: str | None = None
    operations: tuple[Operation, ...] = ()
    pages: tuple[BaseRoute, ...] = ()
    requires_tables: tuple[str, ...] = ()
    overview: Callable[[Runtime], Awaitable[OverviewPanel | None]] | None = None
    tag_description: str = field(default="")


_SECTIONS: dict[str, Section] = {}


def register_section(section: Section) -> Section:
    """Add (or replace, by name) a section; the next ``build_admin`` serves it."""
    _SECTIONS[section.name] = section
    return section


def sections() -> list[Section]:
    return sorted(_SECTIONS.values(), key=lambda s: (s.order, s.name))
