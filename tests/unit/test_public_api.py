"""The public names: ``relaybox.__all__`` is complete, and a module's ``__all__``
lists only what that module defines (a package's ``__init__`` gathers its modules'
names; a plain module re-exports nothing)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import relaybox

OPTIONAL = ("relaybox.contrib",)  # need their extra installed


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(relaybox.__path__, "relaybox."):
        if info.name.startswith(OPTIONAL) or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def test_the_top_level_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(relaybox).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public - set(relaybox.__all__) == set()
    assert sorted(relaybox.__all__) == sorted(set(relaybox.__all__))
    for name in relaybox.__all__:
        assert hasattr(relaybox, name), name


@pytest.mark.parametrize("name", _modules())
def test_a_module_exports_only_what_it_defines(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return
    assert len(exported) == len(set(exported)), f"{name}.__all__ repeats a name"
    is_package = hasattr(module, "__path__")
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ names {attr!r}, which it lacks"
        value = getattr(module, attr)
        if is_package or not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        home = value.__module__
        assert home == name, f"{name}.__all__ re-exports {attr} from {home}"
