"""Every Python snippet of README.md and the docs (docs/**/*.md) runs, in order, one
namespace per document (Sybil parses them). Setup a snippet needs but a reader does not, and checks
of what it did, are in invisible blocks beside it::

    <!-- invisible-code-block: python
    box = Relaybox(...)
    -->

Top-level ``await`` and ``async with`` run in one event loop per document, as they
would in the reader's async function. A block that cannot run on its own and honestly
should not (none today) is marked ``<!-- skip: next -->`` with the reason beside it.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


class AsyncPythonEvaluator:
    """Sybil's Python evaluator, with top-level ``await`` run in the document's loop."""

    def __call__(self, example: Example) -> None:
        source = "\n" * (example.line + example.parsed.line_offset - 1) + example.parsed
        code = compile(source, str(example.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, example.namespace)
        if inspect.iscoroutine(result):
            example.namespace["__loop__"].run_until_complete(result)
        example.namespace.pop("__builtins__", None)


def _setup(namespace: dict[str, Any]) -> None:
    namespace["__loop__"] = asyncio.new_event_loop()


def _teardown(namespace: dict[str, Any]) -> None:
    loop: asyncio.AbstractEventLoop = namespace["__loop__"]
    for value in list(namespace.values()):
        close = getattr(value, "close", None)
        if type(value).__name__ == "Relaybox" and close is not None:
            loop.run_until_complete(close())
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


SYBIL = Sybil(parsers=[CodeBlockParser("python", AsyncPythonEvaluator()), SkipParser()])


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    """Snippets write their SQLite files in a folder of their own."""
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


def _python_blocks(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip() == "```python")


@pytest.mark.parametrize("path", DOCUMENTS, ids=[p.relative_to(ROOT).as_posix() for p in DOCUMENTS])
def test_every_python_snippet_runs(
    path: Path, in_tmp: Path, request: pytest.FixtureRequest
) -> None:
    document = SYBIL.parse(path)
    _setup(document.namespace)
    examples = list(document)
    visible = _python_blocks(path)
    ran = 0
    # docs/django.md uses Django's database: pytest-django blocks it unless asked.
    blocker = request.getfixturevalue("django_db_blocker") if path.name == "django.md" else None
    try:
        with blocker.unblock() if blocker is not None else contextlib.nullcontext():
            for example in examples:
                example.evaluate()
                ran += 1
    finally:
        _teardown(document.namespace)
    assert ran >= visible, f"{path.name}: {visible} python blocks, {ran} ran"


def test_the_site_builds_with_every_link_and_reference_resolved(tmp_path: Path) -> None:
    """``mkdocs build --strict`` (mkdocs.yml): a link to a page or heading that does not
    exist, a page left out of the navigation, or an API reference (mkdocstrings) to a
    name that is gone is a warning, and strict makes it fail the build."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "Publish an outbound event inside the caller" in api  # Relaybox.publish's docstring
    assert "Record that the operation named by" in api  # Context.once's
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "relaybox endpoints replay-missing" in cli  # every command's --help


def test_the_readme_opens_with_its_two_commands() -> None:
    """The README's first block is the two commands a newcomer runs, before anything
    else: run relaybox (the demo) and run the tests."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = text.index("```")
    assert text[:first].strip() == "# relaybox"
    block = text[first : text.index("```", first + 3) + 3].splitlines()
    assert block[0] == "```sh" and block[-1] == "```"
    assert [line.split()[0] for line in block[1:-1]] == ["./scripts/serve", "./scripts/test"]
