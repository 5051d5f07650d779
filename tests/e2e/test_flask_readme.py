"""examples/flask_shop/README.md, walked as a reader walks it: its four shell blocks,
run as they are written, each in a shell of its own (no variable carried from one to
the next), on PostgreSQL. Only the ports (free ones instead of 5000, 8000 and 9000)
and the database URL (a fresh PostgreSQL database for the README's
``sqlite:///flask_shop.db``) are replaced. The Stripe delivery grants the credits the
README shows, and the completed order's webhook reaches the receiver on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.support.shells import ROOT, Shells, get, listening, shell_blocks, wait_for

README = ROOT / "examples" / "flask_shop" / "README.md"
DEFAULT_URL = "sqlite:///flask_shop.db"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_the_readme_runs_verbatim_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    blocks = shell_blocks(README)
    assert len(blocks) == 4, blocks
    ports = {"5000": str(free_port()), "8000": str(free_port()), "9000": str(free_port())}
    shells = Shells(tmp_path, {DEFAULT_URL: pg_url, **ports})
    try:
        shells.start("shop", blocks[0])
        wait_for(lambda: listening(int(ports["5000"])), 60, "the shop listens", shells.logs)
        serve_log = shells.start("serve", blocks[1])
        wait_for(
            lambda: (
                "ok" in get(f"http://127.0.0.1:{ports['8000']}/healthz").lower()
                or listening(int(ports["8000"]))
            ),
            60,
            "relaybox serve listens",
            shells.logs,
        )
        banner = serve_log.read_text()
        assert "Development mode (--dev): allowed plain http to loopback" in banner, banner
        assert "relaybox_t_" in banner  # the shell's database, not sqlite:///flask_shop.db
        receiver_log = shells.start("receiver", blocks[2])
        wait_for(lambda: listening(int(ports["9000"])), 30, "the receiver listens", shells.logs)
        shells.run_lines(blocks[3])  # the fourth shell, one command at a time
        wait_for(
            lambda: "type=order.completed" in receiver_log.read_text(),
            30,
            "the receiver gets order.completed",
            shells.logs,
        )
        assert "POST /hook webhook-id=msg_" in receiver_log.read_text()
    finally:
        shells.stop()
