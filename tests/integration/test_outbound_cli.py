"""The operator's commands for the sending side, in-process with click's CliRunner,
on SQLite and PostgreSQL. (``relaybox dispatch`` runs as a real process in
test_outbound_crash.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from relaybox.cli import main

APP = "tests.support.outbound_app:box"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Any:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(
            main, [*args, "--app", APP, "--database-url", database_url], prog_name="relaybox"
        )
        assert result.exit_code == code, (result.output, result.exception)
        return result.stdout if code == 0 else result.output  # a refusal says why on stderr

    return invoke


def test_operator_commands(run: Any, tmp_path: Path) -> None:
    key = json.loads(run("api-keys", "create", "--tenant", "t1", "--name", "ci"))
    assert key["key"].startswith("rbk_") and key["tenant"] == "t1"
    assert [k["id"] for k in json.loads(run("api-keys", "list", "--json"))["items"]] == [key["id"]]

    schema = tmp_path / "pet.json"
    schema.write_text(json.dumps({"type": "object", "required": ["petId"]}))
    run("event-types", "define", "pet.adopted", "--schema", str(schema))
    assert json.loads(run("event-types", "list", "--json"))["items"][0]["name"] == "pet.adopted"

    created = json.loads(
        run(
            "endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x",
            "--type", "pet.*,order.*", "--max-in-flight", "2",
        )
    )  # fmt: skip
    endpoint_id = created["id"]
    assert created["secret"].startswith("whsec_") and created["max_in_flight"] == 2
    listed = json.loads(run("endpoints", "list", "--json"))["items"]
    assert [e["id"] for e in listed] == [endpoint_id]

    published = json.loads(
        run("messages", "publish", "--tenant", "t1", "--type", "pet.adopted", "--data",
            '{"petId": "p1"}', "--idempotency-key", "adopt-p1")
    )  # fmt: skip
    assert published["endpoints"] == [endpoint_id] and published["created"]
    run("messages", "publish", "--tenant", "t1", "--type", "pet.adopted", "--data", "{}", code=2)
    [pending] = json.loads(run("messages", "undelivered", "--json"))["items"]
    assert (pending["message_id"], pending["status"]) == (published["id"], "pending")

    # The operator's disable, enable and recover: --reason required, --actor recorded
    # in the disabled reason (as the admin API's and the dashboard's).
    run("endpoints", "disable", endpoint_id, code=2)  # no --reason
    said = run("endpoints", "disable", endpoint_id, "--reason", "host moved", "--actor", "ana")
    assert f"endpoint {endpoint_id} disabled" in said
    shown = json.loads(run("endpoints", "show", endpoint_id))
    assert shown["disabled_reason"] == "manual by ana: host moved"
    assert "already disabled" in run("endpoints", "disable", endpoint_id, "--reason", "r", code=1)
    [dead] = json.loads(run("messages", "undelivered", "--json"))["items"]
    assert (dead["status"], dead["dead_reason"]) == ("dead", "endpoint_disabled")
    assert "enable it first" in run(
        "endpoints", "recover", endpoint_id, "--since", "2000-01-01T00:00:00Z",
        "--reason", "r", code=1,
    )  # fmt: skip
    assert "enabled (was disabled: manual by ana: host moved)" in run(
        "endpoints", "enable", endpoint_id, "--reason", "host back"
    )
    assert "1 dead deliver(ies)" in run(
        "endpoints", "recover", endpoint_id, "--since", "2000-01-01T00:00:00Z", "--reason", "r"
    )

    rotated = json.loads(run("endpoints", "rotate-secret", endpoint_id, "--grace", "60"))
    shown = json.loads(run("endpoints", "show", endpoint_id))
    assert [s["secret"] for s in shown["secrets"]] == [rotated["secret"], created["secret"]]
    assert json.loads(run("endpoints", "update", endpoint_id, "--timeout", "2"))["timeout"] == 2
    run("endpoints", "update", endpoint_id, "--timeout", "7", code=2)  # over max_timeout

    detail = json.loads(run("messages", "show", published["id"]))
    assert [d["endpoint_id"] for d in detail["deliveries"]] == [endpoint_id]
    assert "1 deliveries queued again" not in run("messages", "redeliver", published["id"], code=1)

    assert "deleted" in run("endpoints", "delete", endpoint_id)
    run("endpoints", "show", endpoint_id, code=1)
    run("endpoints", "create", "--tenant", "t1", "--url", "https://10.0.0.1/x", code=2)
    run("endpoints", "recover", "ep_nope", "--since", "yesterday", "--reason", "r", code=2)
