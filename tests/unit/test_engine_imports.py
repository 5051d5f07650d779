"""The engines do not import the facade (``relaybox.app``), not even for annotations.

pyproject.toml's import-linter contract "the engines do not import the facade" names
the engines and checks the imports that run; the configuration leaves imports under
``TYPE_CHECKING`` out for every contract, so an annotation-only import of
``Relaybox`` would pass it. This test reads every import statement of the engines'
source, wherever it stands (module level, ``if TYPE_CHECKING:``, inside a function).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PYPROJECT = ROOT / "pyproject.toml"
CONTRACT = "the engines do not import the facade"
FACADE = "relaybox.app"


def _engines() -> list[str]:
    """The contract's source modules: pyproject.toml names the engines once."""
    config = tomllib.loads(PYPROJECT.read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"] == CONTRACT:
            assert contract["forbidden_modules"] == [FACADE]
            modules: list[str] = contract["source_modules"]
            return modules
    raise AssertionError(f"pyproject.toml has no import-linter contract {CONTRACT!r}")


def _files(module: str) -> list[tuple[str, Path]]:
    """``(dotted name, path)`` of ``module`` and, for a package, of all its modules."""
    path = SRC.joinpath(*module.split("."))
    if path.is_dir():
        found = []
        for file in sorted(path.rglob("*.py")):
            parts = file.relative_to(SRC).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append((".".join(parts), file))
        return found
    file = path.with_suffix(".py")
    assert file.is_file(), f"{module} is neither a package nor a module under {SRC}"
    return [(module, file)]


def _is_package(file: Path) -> bool:
    return file.name == "__init__.py"


def facade_imports(source: str, module: str, *, package: bool = False) -> list[int]:
    """The lines of ``source`` (the code of ``module``) that import the facade:
    ``relaybox.app`` or a name in it, ``app`` from ``relaybox``, or ``Relaybox`` as
    the package re-exports it; relative imports resolved against ``module``."""
    here = module.split(".") if package else module.split(".")[:-1]
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(_facade(alias.name) for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            names = {alias.name for alias in node.names}
            if _facade(target) or (target == "relaybox" and names & {"app", "Relaybox"}):
                lines.append(node.lineno)
    return sorted(lines)


def _facade(name: str) -> bool:
    return name == FACADE or name.startswith(FACADE + ".")


def test_the_engines_do_not_import_the_facade() -> None:
    engines = _engines()
    checked = 0
    offenders = []
    for engine in engines:
        for module, file in _files(engine):
            checked += 1
            for line in facade_imports(file.read_text(), module, package=_is_package(file)):
                offenders.append(f"{file.relative_to(SRC)}:{line}")
    assert checked > len(engines)  # the packages' modules were found, not just names
    assert not offenders, (
        "these engine modules import the facade (relaybox.app); take a Runtime "
        "(relaybox.runtime) or explicit arguments instead: " + ", ".join(offenders)
    )


@pytest.mark.parametrize(
    ("source", "module", "found"),
    [
        ("from relaybox.app import Relaybox\n", "relaybox.inbound.recovery", [1]),
        (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from relaybox.app import Relaybox\n",
            "relaybox.worker.loop",
            [3],
        ),
        ("def f():\n    import relaybox.app\n", "relaybox.inbound.replay", [2]),
        ("from relaybox import Relaybox, errors\n", "relaybox.inbound.accept", [1]),
        ("from relaybox import app\n", "relaybox.inbound.accept", [1]),
        ("from ..app import Relaybox\n", "relaybox.worker.loop", [1]),
        ("from .. import app\n", "relaybox.sync.publish", [1]),
        ("from ..app import Relaybox\n", "relaybox.inbound.receiver", [1]),
        ("from relaybox.runtime import Runtime\n", "relaybox.inbound.recovery", []),
        ("from relaybox import errors, tracing\n", "relaybox.inbound.recovery", []),
        ("from .app import x\n", "relaybox.outbound.dispatcher", []),  # outbound.app
        ("# relaybox.app.Relaybox\nx = 'from relaybox.app import Relaybox'\n", "relaybox.x", []),
    ],
)
def test_facade_imports_are_found_wherever_they_stand(
    source: str, module: str, found: list[int]
) -> None:
    assert facade_imports(source, module) == found


def test_relative_imports_of_a_package_resolve_from_the_package() -> None:
    assert facade_imports("from ..app import Relaybox\n", "relaybox.worker", package=True) == [1]
    assert facade_imports("from .app import Relaybox\n", "relaybox.worker", package=True) == []
