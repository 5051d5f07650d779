"""docs/operating.md's "Alerts and runbooks": the Prometheus rules parse, every alert
has the fields a rules file needs, each expression is plausible PromQL naming only
metrics (and labels) relaybox exports, each runbook link leads to a heading of the
page; ``promtool check rules`` passes where the tool is installed. The silence
section's TOML is a valid configuration."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from relaybox import Relaybox
from relaybox.config import Settings, load_settings
from relaybox.config.silence import SilenceSettings
from relaybox.silence import SilenceWatch
from tests.conftest import create_pg_database, drop_pg_database
from tests.integration.test_silence import arrive

ROOT = Path(__file__).resolve().parents[2]
OPERATING = ROOT / "docs" / "operating.md"

PENDING: set[str] = set()
"""Metrics the runbook names that another change adds: the test fails once one is
exported, so that this set is emptied then."""

ALERTS = {
    "RelayboxOldestPendingAge",
    "RelayboxDeadLettersGrowing",
    "RelayboxEndpointsFailing",
    "RelayboxSourceSilent",
    "RelayboxEndpointSilent",
    "RelayboxClockSkew",
    "RelayboxLongTransaction",
    "RelayboxTableBloat",
}
"""The alarms the runbook must cover (more may follow)."""

FUNCTIONS = {
    "abs", "absent", "avg_over_time", "ceil", "changes", "clamp_min", "clamp_max", "delta",
    "deriv", "floor", "histogram_quantile", "idelta", "increase", "irate", "max_over_time",
    "min_over_time", "rate", "resets", "round", "sum_over_time", "time", "timestamp", "vector",
}  # fmt: skip
KEYWORDS = {
    "sum", "min", "max", "avg", "count", "group", "stddev", "topk", "bottomk", "quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset",
}  # fmt: skip


def section(title: str) -> str:
    text = OPERATING.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.DOTALL)


def anchors() -> set[str]:
    found = set()
    for line in OPERATING.read_text().splitlines():
        m = re.match(r"#{2,4} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            found.add(slug)
    return found


async def exported(tmp_path: Path) -> dict[str, set[str]]:
    """Every metric name a scrape of relaybox shows on SQLite or on PostgreSQL (some
    series are one backend's: PostgreSQL's long transactions, SQLite's free pages),
    samples, histogram parts and _total included, with the labels its samples carry."""
    names = await scraped(f"sqlite:///{tmp_path / 'm.db'}")
    url = await create_pg_database()
    try:
        for name, labels in (await scraped(url)).items():
            names.setdefault(name, set()).update(labels)
    finally:
        await drop_pg_database(url)
    return names


async def scraped(database_url: str) -> dict[str, set[str]]:
    silence = SilenceSettings(sources={"github": {"expect_every": "1h"}})  # type: ignore[dict-item]
    settings = Settings(database_url=database_url, silence=silence)
    box = Relaybox(settings=settings)
    try:
        await box.store.migrate()
        # Rows, so that the database's gauges show their labels: a pending event, and
        # one quarantined (its id again with other content); a watched source.
        await arrive(box, "github", 1.0, "e1")
        await arrive(box, "github", 2.0, "e1", body=b"other")
        await SilenceWatch(box).run_once()
        box.metrics.observe_accept(200, 0.01)
        box.metrics.observe_delivery("webhook", 200, 0.1)
        box.metrics.processed.labels("github", "done").inc()
        box.metrics.observe_divergence("github")
        box.metrics.observe_purge("inbox", 1)
        text = (await box.metrics.scrape(box)).decode()
    finally:
        await box.close()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        names.setdefault(family.name, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
            names[family.name].update(sample.labels)
    for line in text.splitlines():  # counters: the family is shown as NAME_total
        m = re.match(r"# TYPE (\S+) counter", line)
        if m:
            names.setdefault(m.group(1) + "_total", set()).update(names.get(m.group(1), set()))
    return names


def metrics_of(expr: str) -> list[tuple[str, str]]:
    """(metric, its matcher text) for each metric name an expression selects."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings out of the way
    code = re.sub(r"\[[^\]]*\]", "", code)  # and ranges
    found = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?", code):
        name, matchers = m.group(1), m.group(2) or ""
        before = code[: m.start()].rstrip()
        if before.endswith(("by (", "without (", "on (", "ignoring (")) or before.endswith(","):
            continue  # a grouping label, not a metric
        if name in FUNCTIONS or name in KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        found.append((name, matchers))
    return found


def plausible(expr: str) -> list[str]:
    problems = []
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in pairs.values():
            if not stack or stack.pop() != ch:
                problems.append(f"unbalanced {ch!r}")
    if stack:
        problems.append("unclosed brackets")
    for duration in re.findall(r"\[([^\]]*)\]", expr):
        if not re.fullmatch(r"\d+[smhdwy]", duration):
            problems.append(f"range [{duration}] is not a duration")
    for call in re.findall(r"([a-z_]+)\s*\(", expr):
        if call not in FUNCTIONS and call not in KEYWORDS:
            problems.append(f"{call}() is not a PromQL function")
    if not re.search(r"(>|<|==|!=)\s*-?\d", expr):
        problems.append("no comparison with a threshold: it would always fire")
    return problems


async def test_the_alert_rules_are_ready_to_paste(tmp_path: Path) -> None:
    [rules_text] = blocks(section("Alerts and runbooks"), "yaml")
    rules = yaml.safe_load(rules_text)
    [group] = rules["groups"]
    names = await exported(tmp_path)
    assert not PENDING & set(names), "exported now: remove it from PENDING"
    heads = anchors()
    seen = set()
    for rule in group["rules"]:
        alert = rule["alert"]
        seen.add(alert)
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, alert
        assert rule["labels"]["severity"] in ("page", "ticket"), alert
        assert "for" not in rule or re.fullmatch(r"\d+[smh]", rule["for"]), alert
        expr = rule["expr"]
        assert plausible(expr) == [], (alert, plausible(expr))
        selected = metrics_of(expr)
        assert selected, alert
        for metric, matchers in selected:
            assert metric.startswith("relaybox_"), (alert, metric)
            assert metric in names or metric in PENDING, (alert, f"{metric} is not exported")
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
                assert label in names.get(metric, set()), (alert, metric, label)
        for label in re.findall(r"(?:by|without)\s*\(([^)]*)\)", expr):
            for name in (x.strip() for x in label.split(",")):
                assert any(name in names.get(m, set()) for m, _ in selected), (alert, name)
        link = rule["annotations"]["runbook"]
        assert link.startswith("docs/operating.md#"), alert
        assert link.split("#", 1)[1] in heads, (alert, link)
        assert rule["annotations"]["summary"], alert
    assert seen >= ALERTS
    if shutil.which("promtool"):
        path = tmp_path / "relaybox.rules.yml"
        path.write_text(rules_text)
        checked = await asyncio.to_thread(
            subprocess.run,
            ["promtool", "check", "rules", str(path)],
            capture_output=True,
            text=True,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_checker_refuses_what_it_should() -> None:
    assert plausible("sum(rate(x[5m])) > 0") == []
    assert "unbalanced ')'" in plausible("sum(x)) > 0")
    assert "range [5 minutes] is not a duration" in plausible("rate(x[5 minutes]) > 0")
    assert "no comparison with a threshold: it would always fire" in plausible("sum(x)")
    assert "summ() is not a PromQL function" in plausible("summ(x) > 1")
    assert metrics_of('sum by (source) (rate(relaybox_a{queue="inbox"}[5m])) > 1') == [
        ("relaybox_a", '{queue=""}')
    ]


def test_the_silence_configuration_shown_is_valid() -> None:
    [shown] = blocks(section("Silence detection"), "toml")
    data: dict[str, Any] = tomllib.loads(shown)
    settings = load_settings(env={}, given=data)
    assert settings.silence.sources["github"].every == 30 * 60
    assert settings.silence.sources["stripe"].learned
    assert settings.silence.endpoints is not None and settings.silence.endpoints.every == 6 * 3600
