"""Which age applies to which row (tenant, then source, then the global age inbound;
tenant, then the global age outbound; the admin API's over the file's), and the purge
passes the policies make: one per distinct tenant age whatever the number of tenants,
one per source, and a plain or a filtering pass for the rest."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from relaybox.config import Settings
from relaybox.retention.policy import TENANTS_PER_STATEMENT, RetentionPolicies, plan

DAY = 86400.0


def settings(**retention: object) -> Settings:
    return Settings(retention=retention)


def policies(**retention: object) -> RetentionPolicies:
    stored = retention.pop("stored", None)
    return RetentionPolicies.from_settings(settings(**retention).retention, stored)  # type: ignore[arg-type]


def test_inbound_tenant_then_source_then_global() -> None:
    p = policies(
        payload_max_age=30 * DAY,
        sources={"stripe": {"payload_max_age": 7 * DAY}},
        tenants={"acme": {"payload_max_age": 90 * DAY}, "beta": {"outbox_payload_max_age": DAY}},
    )
    assert p.inbound_age("acme", "stripe") == 90 * DAY  # the tenant wins over its source
    assert p.inbound_age("beta", "stripe") == 7 * DAY  # beta sets no inbound age
    assert p.inbound_age(None, "stripe") == 7 * DAY
    assert p.inbound_age(None, "github") == 30 * DAY
    assert p.inbound_age("other", None) == 30 * DAY
    assert p.outbound_age("beta") == DAY
    assert p.outbound_age("acme") == 30 * DAY
    assert p.outbound_age(None) == 30 * DAY
    assert p.age_of("quarantine", "acme", "x") == 90 * DAY
    assert p.age_of("messages", "beta", None) == DAY
    assert p.ages("inbox") == {30 * DAY, 7 * DAY, 90 * DAY}
    assert p.ages("outbox") == {30 * DAY, DAY}
    assert p.scoped


def test_the_admin_apis_ages_win_over_the_files_age_by_age() -> None:
    p = policies(
        tenants={"acme": {"payload_max_age": 90 * DAY, "outbox_payload_max_age": 60 * DAY}},
        stored={"acme": (2 * DAY, None), "new": (None, 3 * DAY)},
    )
    assert p.inbound_age("acme", "s") == 2 * DAY
    assert p.outbound_age("acme") == 60 * DAY  # the file's, the API set none
    assert p.outbound_age("new") == 3 * DAY and p.inbound_age("new", "s") == 30 * DAY


def test_no_scopes_no_change() -> None:
    p = policies()
    assert not p.scoped
    passes = plan(p, 1000 * DAY)
    assert [(s.table, s.kind, s.cutoff) for s in passes] == [
        ("inbox", "all", 970 * DAY),
        ("quarantine", "all", 970 * DAY),
        ("outbox", "all", 970 * DAY),
        ("messages", "all", 970 * DAY),
    ]


def test_passes_grow_with_distinct_ages_not_tenants() -> None:
    ages = (7 * DAY, 30 * DAY, 90 * DAY)
    stored = {f"t{n:04}": (ages[n % 3], ages[n % 3]) for n in range(2500)}
    p = policies(stored=stored)
    now = 1000 * DAY
    passes = plan(p, now)
    inbox = [s for s in passes if s.table == "inbox"]
    tenant_passes = [s for s in inbox if s.kind == "tenants"]
    # 834/833/833 tenants per age: one chunk each (TENANTS_PER_STATEMENT = 1000).
    assert TENANTS_PER_STATEMENT == 1000
    assert [(s.cutoff, len(s.tenants)) for s in tenant_passes] == [
        (now - 7 * DAY, 834),
        (now - 30 * DAY, 833),
        (now - 90 * DAY, 833),
    ]
    assert sum(len(s.tenants) for s in tenant_passes) == 2500
    # Some tenants keep theirs longer than the global 30 days: the last pass filters.
    assert (inbox[-1].kind, inbox[-1].cutoff, inbox[-1].tenants) == ("scan", now - 30 * DAY, ())
    assert len(passes) == 4 * 4


def test_tenant_groups_are_chunked() -> None:
    p = policies(stored={f"t{n:05}": (DAY, None) for n in range(2001)})
    passes = [s for s in plan(p, 10 * DAY) if s.table == "inbox" and s.kind == "tenants"]
    assert [len(s.tenants) for s in passes] == [1000, 1000, 1]
    assert passes[0].tenants[0] == "t00000" and passes[-1].tenants == ("t02000",)


def test_shorter_scopes_leave_the_plain_pass_and_sources_scan() -> None:
    p = policies(
        sources={"stripe": {"payload_max_age": 7 * DAY}},
        tenants={"acme": {"outbox_payload_max_age": 2 * DAY}},
    )
    passes = plan(p, 100 * DAY)
    inbox = [(s.kind, s.source, s.cutoff) for s in passes if s.table == "inbox"]
    assert inbox == [("scan", "stripe", 93 * DAY), ("all", None, 70 * DAY)]
    outbox = [(s.kind, s.tenants, s.cutoff) for s in passes if s.table == "outbox"]
    assert outbox == [("tenants", ("acme",), 98 * DAY), ("all", (), 70 * DAY)]


@pytest.mark.parametrize(
    "retention",
    [
        {"tenants": {"a": {"payload_max_age": 59}}},
        {"tenants": {"a": {"outbox_payload_max_age": 3651 * DAY}}},
        {"tenants": {"a": {"payload_max_age": 3600, "other": 1}}},
        {"sources": {"s": {}}},
        {"sources": {"s": {"payload_max_age": 30, "x": 1}}},
        {"tenants": {"x" * 129: {"payload_max_age": 3600}}},
        {"tenants": {"a\x00b": {"payload_max_age": 3600}}},
        {"max_tenant_policies": 0},
        {"max_tenant_policies": 1_000_001},
    ],
)
def test_scoped_settings_are_bounded(retention: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        settings(**retention)


def test_scoped_settings_from_toml(tmp_path: object) -> None:
    from pathlib import Path

    from relaybox.config import load_settings

    path = Path(str(tmp_path)) / "relaybox.toml"
    path.write_text(
        "[retention]\npayload_max_age = 2592000.0\n"
        "[retention.sources.stripe]\npayload_max_age = 604800.0\n"
        '[retention.tenants."acme-eu"]\npayload_max_age = 86400.0\n'
        "outbox_payload_max_age = 7776000.0\n"
    )
    s = load_settings(path, env={})
    assert s.retention.sources["stripe"].payload_max_age == 604800.0
    acme = s.retention.tenants["acme-eu"]
    assert (acme.payload_max_age, acme.outbox_payload_max_age) == (86400.0, 7776000.0)


def test_scan_marks_hold_while_the_ages_are_the_same() -> None:
    from relaybox.retention.policy import ScanMarks

    p = policies(tenants={"acme": {"payload_max_age": 90 * DAY}})
    marks = ScanMarks()
    assert marks.start("inbox", None, p.digest()) is None
    marks.done("inbox", None, p.digest(), 123.0)
    assert marks.start("inbox", None, p.digest()) == 123.0
    assert marks.start("inbox", "stripe", p.digest()) is None  # another pass
    assert marks.start("outbox", None, p.digest()) is None
    same = policies(tenants={"acme": {"payload_max_age": 90 * DAY}})
    assert same.digest() == p.digest()
    for other in (
        policies(tenants={"acme": {"payload_max_age": 91 * DAY}}),
        policies(tenants={"acme": {"payload_max_age": 90 * DAY}}, payload_max_age=DAY),
        policies(stored={"acme": (None, DAY)}),
    ):
        assert marks.start("inbox", None, other.digest()) is None
