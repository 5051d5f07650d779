"""The one table printer (relaybox.cli.table): ids and times whole at 80 columns, free
text folded, least useful columns dropped when the whole ones do not fit."""

from __future__ import annotations

import pytest

from relaybox.cli.table import print_pairs, print_table

EVENT_ID = "evt_1NqXtest" + "x" * 17  # as long as a Stripe event id
ROW = (123456, "stripe", "invoice.payment_failed", EVENT_ID, "tenant-a", "dead (exhausted)", 5,
       "2026-01-01 00:00:00Z", "handler raised: " + "long error text " * 6)  # fmt: skip
COLUMNS = ("id", "source", "type", "event id", "tenant", "status", "att.", "received",
           "last error")  # fmt: skip
WHOLE = ("id", "event id", "received", "att.")


def lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_ids_and_times_stay_whole_at_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(
        COLUMNS,
        [ROW],
        title="inbox",
        whole=WHOLE,
        drop=("tenant", "type", "source", "att."),
        width=80,
    )
    out = lines(capsys)
    assert all(len(line) <= 80 for line in out)
    text = "\n".join(out)
    assert EVENT_ID in text and "2026-01-01 00:00:00Z" in text and "123456" in text
    assert "…" not in text
    # Free text folds onto more lines instead of being cut.
    assert "".join(line.replace("│", "").strip() for line in out).count("long") >= 1


def test_least_useful_columns_go_first_when_too_narrow(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(COLUMNS, [ROW], whole=WHOLE, drop=("tenant", "type", "source"), width=80)
    narrow = "\n".join(lines(capsys))
    assert "tenant" not in narrow and EVENT_ID in narrow
    print_table(COLUMNS, [ROW], whole=WHOLE, drop=("tenant", "type", "source"), width=240)
    wide = "\n".join(lines(capsys))
    assert "tenant" in wide and "invoice.payment_failed" in wide


def test_none_shows_as_dash_and_pairs_fold(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(("id", "sent_at"), [(1, None)], whole=("id", "sent_at"), width=80)
    assert any("-" in line and "1" in line for line in lines(capsys))
    print_pairs("replay", [("matched", 3), ("reason", "r " * 60)], width=40)
    out = lines(capsys)
    assert all(len(line) <= 40 for line in out) and "matched" in "\n".join(out)
    assert "…" not in "\n".join(out)
