"""Settings: defaults → TOML file → RELAYBOX_* environment → validation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from relaybox import ConfigurationError, Relaybox, Secret
from relaybox.config import Settings, WorkerSettings, load_settings
from relaybox.sources import GitHubSource, HmacSource, StripeSource

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests that read os.environ (Relaybox(config=...)) see no stray RELAYBOX_* setting."""
    import os

    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str, name: str = "relaybox.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings(env={})
    assert s == Settings()
    assert s.database_url == "sqlite:///relaybox.db"
    assert (s.host, s.port) == ("127.0.0.1", 8000)
    assert (s.log_level, s.log_json, s.accept_timeout) == ("info", True, 10.0)
    assert s.worker == WorkerSettings()
    assert s.worker.concurrency >= 1
    assert (s.worker.batch, s.worker.group) == (None, None)  # by backend: the worker's
    assert s.worker.max_attempts == 10
    assert s.worker.max_age == 3 * 24 * 3600
    assert s.sources == {}


def test_toml_file_layer(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
database_url = "postgresql://app@db/app"
port = 9001
log_json = false

[worker]
concurrency = 4
batch = 32
backoff_cap = 60
""",
    )
    s = load_settings(path, env={})
    assert s.database_url == "postgresql://app@db/app"
    assert s.port == 9001
    assert s.log_json is False
    assert (s.worker.concurrency, s.worker.batch, s.worker.backoff_cap) == (4, 32, 60.0)
    assert s.worker.max_attempts == 10  # untouched keys keep their defaults
    assert s.host == "127.0.0.1"
    assert load_settings(str(path), env={}) == s  # str or Path


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
database_url = "sqlite:///from-file.db"
port = 9001
[worker]
concurrency = 4
batch = 32
""",
    )
    env = {
        "RELAYBOX_DATABASE_URL": "postgresql://env@db/env",
        "RELAYBOX_PORT": "9100",
        "RELAYBOX_LOG_JSON": "false",
        "RELAYBOX_ACCEPT_TIMEOUT": "2.5",
        "RELAYBOX_WORKER__CONCURRENCY": "16",
        "RELAYBOX_TEST_DATABASE_URL": "postgresql://ignored@x/y",  # the test suite's own
        "UNRELATED": "1",
    }
    s = load_settings(path, env=env)
    assert s.database_url == "postgresql://env@db/env"
    assert s.port == 9100
    assert s.log_json is False
    assert s.accept_timeout == 2.5
    assert s.worker.concurrency == 16
    assert s.worker.batch == 32  # the rest of [worker] still comes from the file


def test_nested_environment_without_file() -> None:
    s = load_settings(env={"RELAYBOX_WORKER__CONCURRENCY": "3", "RELAYBOX_WORKER__BATCH": "5"})
    assert (s.worker.concurrency, s.worker.batch) == (3, 5)


def test_os_environ_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYBOX_WORKER__CONCURRENCY", "12")
    monkeypatch.setenv("RELAYBOX_PORT", "8123")
    s = load_settings()
    assert (s.worker.concurrency, s.port) == (12, 8123)


@pytest.mark.parametrize(
    ("toml", "env", "field"),
    [
        ("port = 70000", {}, "port"),
        ('log_level = "loud"', {}, "log_level"),
        ("accept_timeout = 0", {}, "accept_timeout"),
        ("[worker]\nconcurrency = 0", {}, "worker.concurrency"),
        ("[worker]\nbatch = 5000", {}, "worker.batch"),
        ("[worker]\nbackoff_jitter = 1.5", {}, "worker.backoff_jitter"),
        ("", {"RELAYBOX_WORKER__CONCURRENCY": "many"}, "worker.concurrency"),
        ("", {"RELAYBOX_PORT": "http"}, "port"),
        ("", {"RELAYBOX_LOG_JSON": "perhaps"}, "log_json"),
        ('worker = "fast"', {}, "worker"),
        ('[sources]\ngh = "github"', {}, "sources.gh"),
    ],
)
def test_validation_errors_name_the_field(
    tmp_path: Path, toml: str, env: dict[str, str], field: str
) -> None:
    path = write(tmp_path, toml)
    with pytest.raises(ConfigurationError) as info:
        load_settings(path, env=env)
    message = str(info.value)
    assert f"{field}:" in message, message
    assert message.startswith("invalid settings")


def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, 'port = -1\nlog_level = "x"\n[worker]\nbatch = 0')
    with pytest.raises(ConfigurationError) as info:
        load_settings(path, env={})
    for field in ("port:", "log_level:", "worker.batch:"):
        assert field in str(info.value)


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ('databse_url = "sqlite:///x.db"', "databse_url"),
        ("[worker]\nconcurency = 4", "worker.concurency"),
        ("[database]\nurl = 'x'", "database"),
    ],
)
def test_unknown_keys_are_refused(tmp_path: Path, toml: str, field: str) -> None:
    path = write(tmp_path, toml)
    with pytest.raises(ConfigurationError) as info:
        load_settings(path, env={})
    assert f"{field}:" in str(info.value)
    assert "xtra" in str(info.value) or "not permitted" in str(info.value)


def test_unknown_environment_setting_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"worker\.concurency"):
        load_settings(env={"RELAYBOX_WORKER__CONCURENCY": "4"})


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        load_settings(missing, env={})
    assert str(missing) in str(info.value)


def test_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigurationError, match="not valid TOML") as info:
        load_settings(path, env={})
    assert str(path) in str(info.value)


def test_unreadable_config_paths(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=str(tmp_path)):
        load_settings(tmp_path, env={})  # a directory
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00port = 1")
    with pytest.raises(ConfigurationError, match=r"binary\.toml"):
        load_settings(binary, env={})


def test_environment_scalar_and_table_clash_is_a_configuration_error() -> None:
    env = {"RELAYBOX_WORKER": "fast", "RELAYBOX_WORKER__CONCURRENCY": "4"}
    with pytest.raises(ConfigurationError, match="RELAYBOX_WORKER"):
        load_settings(env=env)
    reverse = {"RELAYBOX_WORKER__CONCURRENCY": "4", "RELAYBOX_WORKER": "fast"}
    with pytest.raises(ConfigurationError, match="RELAYBOX_WORKER"):
        load_settings(env=reverse)


def _differences(shown: object, default: object, path: str = "") -> list[str]:
    if isinstance(shown, dict) and isinstance(default, dict):
        return [
            d
            for key in sorted(set(shown) | set(default))
            for d in _differences(shown.get(key), default.get(key), f"{path}{key}.")
        ]
    return [] if shown == default else [f"{path[:-1]}: file {shown!r}, code {default!r}"]


def test_example_file_is_valid_and_shows_the_defaults() -> None:
    """relaybox.example.toml says every key is "shown with its default"."""
    example = ROOT / "relaybox.example.toml"
    if not example.exists():
        pytest.skip("no relaybox.example.toml in this checkout")
    shown = load_settings(example, env={})
    differences = _differences(shown.model_dump(), Settings().model_dump())
    assert not differences, "relaybox.example.toml disagrees with config.py: " + "; ".join(
        differences
    )


# -- sources declared in the file ------------------------------------------------------


SOURCES_TOML = """
database_url = "sqlite:///{db}"

[sources.gh]
provider = "github"
secrets = ["It's a Secret to Everybody"]

[sources.pay]
provider = "stripe"
secrets = [{{ value = "whsec_config_test", account = "acct_9", tenant = "workspace_9" }}]
ignore_types = ["customer.*"]
tolerance = 60

[sources.orders]
provider = "hmac"
secrets = ["s3cret"]
header = "X-Signature"
id_path = "data.id"
type_path = "event"
"""


async def test_sources_in_the_file_are_registered(tmp_path: Path) -> None:
    path = write(tmp_path, SOURCES_TOML.format(db=tmp_path / "box.db"))
    box = Relaybox(config=path)
    try:
        assert list(box.sources) == ["gh", "pay", "orders"]
        gh, pay, orders = box.sources["gh"], box.sources["pay"], box.sources["orders"]
        assert isinstance(gh, GitHubSource) and gh.name == "gh"
        assert isinstance(pay, StripeSource) and pay.name == "pay"
        assert isinstance(orders, HmacSource) and orders.name == "orders"
        assert list(pay.secrets) == [
            Secret("whsec_config_test", account="acct_9", tenant="workspace_9")
        ]
        assert pay.ignores("customer.created") and not pay.ignores("invoice.paid")
        assert pay.tolerance == 60

        # The configured secret verifies what the provider signs with it.
        now = time.time()
        body = pay.example("invoice.paid", "evt_cfg_1", now)
        headers = pay.sign(body, event_id="evt_cfg_1", event_type="invoice.paid", now=now)
        verified = pay.verify({k.lower(): v for k, v in headers.items()}, body, now)
        assert (verified.source, verified.account, verified.tenant) == (
            "pay",
            "acct_9",
            "workspace_9",
        )
        assert verified.event_id == "evt_cfg_1"
    finally:
        await box.close()


async def test_source_secret_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secrets can stay out of the file: RELAYBOX_SOURCES__NAME__SECRETS."""
    path = write(tmp_path, '[sources.gh]\nprovider = "github"\n')
    monkeypatch.setenv("RELAYBOX_SOURCES__GH__SECRETS", "from-env")
    monkeypatch.setenv("RELAYBOX_SOURCES__GH__TOLERANCE", "120")
    box = Relaybox(config=path)
    try:
        assert list(box.sources["gh"].secrets) == [Secret("from-env")]
        assert box.sources["gh"].tolerance == 120
    finally:
        await box.close()


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ('provider = "pigeon"\nsecrets = ["x"]', "pigeon"),
        ('provider = "github"', "secrets"),
        ('provider = "github"\nsecrets = ["x"]\ncolour = "blue"', "colour"),
        ('provider = "stripe"\nsecrets = ["x"]\ntolerance = "soon"', "tolerance"),
    ],
)
def test_bad_source_tables_are_configuration_errors(
    tmp_path: Path, table: str, needle: str
) -> None:
    path = write(tmp_path, f"[sources.bad]\n{table}\n")
    with pytest.raises(ConfigurationError, match=needle) as info:
        Relaybox(config=path)
    assert '"x"' not in str(info.value) and "'x'" not in str(info.value)  # no secret shown


def test_database_url_argument_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'database_url = "sqlite:///file.db"\nport = 9002\n')
    box = Relaybox("sqlite:///arg.db", config=path)
    assert box.settings.database_url == "sqlite:///arg.db"
    assert box.settings.port == 9002


def test_gc_freeze_is_on_by_default_and_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    # The count is not a call counter: frozen objects that other threads (an earlier
    # test's leftovers) free while this runs lower it. Count the calls, and check once
    # that a real freeze moves objects.
    calls: list[None] = []
    real_freeze = gc.freeze

    def counting_freeze() -> None:
        calls.append(None)
        real_freeze()

    monkeypatch.setattr(gc, "freeze", counting_freeze)
    gc.unfreeze()
    try:
        Relaybox(settings=Settings(gc_freeze=False)).freeze_startup_heap()
        assert calls == []
        box = Relaybox(settings=Settings())
        box.freeze_startup_heap()
        assert len(calls) == 1
        assert gc.get_freeze_count() > 0
        box.freeze_startup_heap()  # once per box
        assert len(calls) == 1
    finally:
        gc.unfreeze()


def test_dispatch_widens_the_young_gc_pass_unless_turned_off() -> None:
    import gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, before[1], before[2])
        Relaybox(settings=Settings(dispatch_gc_threshold=0)).widen_young_gc()
        assert gc.get_threshold() == (700, before[1], before[2])
        Relaybox(settings=Settings()).widen_young_gc()  # the default: 10,000
        assert gc.get_threshold() == (10_000, before[1], before[2])
        Relaybox(settings=Settings(dispatch_gc_threshold=2_500)).widen_young_gc()
        assert gc.get_threshold() == (2_500, before[1], before[2])
    finally:
        gc.set_threshold(*before)
