"""examples/fastapi_shop/README.md, walked as a reader walks it: its three shell blocks,
run as they are written, each in a shell of its own (no variable carried from one to
the next), on PostgreSQL. Only the ports (free ones instead of 8000 and 9000) and the
database URL (a fresh database for the README's ``postgresql://shop@localhost/shop``)
are replaced. The Stripe delivery grants the credits the README shows, and the
completed order's webhook reaches the customer's endpoint on loopback, signed with a
secret sealed by the key the first shell made and the others read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import free_port
from tests.support.shells import ROOT, Shells, listening, shell_blocks, wait_for

README = ROOT / "examples" / "fastapi_shop" / "README.md"
DEFAULT_URL = "postgresql://shop@localhost/shop"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_the_readme_runs_verbatim_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    blocks = shell_blocks(README)
    assert len(blocks) == 3, blocks
    ports = {"8000": str(free_port()), "9000": str(free_port())}
    shells = Shells(tmp_path, {DEFAULT_URL: pg_url, **ports})
    try:
        shells.start("shop", blocks[0])
        wait_for(lambda: listening(int(ports["8000"])), 90, "the shop listens", shells.logs)
        assert (tmp_path / ".shop.key").stat().st_size > 20  # made once, by the first shell
        receiver_log = shells.start("receiver", blocks[1])
        wait_for(lambda: listening(int(ports["9000"])), 30, "the receiver listens", shells.logs)
        shells.run_lines(blocks[2])  # the third shell, one command at a time
        wait_for(
            lambda: "type=order.completed" in receiver_log.read_text(),
            30,
            "the receiver gets order.completed",
            shells.logs,
        )
        assert "POST /hook webhook-id=msg_" in receiver_log.read_text()
    finally:
        shells.stop()
