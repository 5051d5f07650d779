"""A process that converts (``convert``) or maintains (``drop``) the time partitions of
the database at ``URL`` and SIGKILLs itself at one step (``TABLE_OR_PARTITION:STEP``,
a prefix of the partition's name will do): tests/store/test_partition_faults.py runs
it, then checks that the next run finishes what it left.

    python -m tests.support.partition_kill URL convert relaybox_inbox_attempts:switch
    python -m tests.support.partition_kill URL drop relaybox_inbox_p:drop
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from relaybox.store import open_store

DAY = 86400.0


async def main(url: str, mode: str, where: str) -> None:
    name, step = where.split(":")

    def hook(table: str, at: str) -> None:
        if table.startswith(name) and at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    store = open_store(url)
    try:
        if mode == "convert":
            await store.partitions_convert("day", before_switch=hook)
        else:
            now = 4e9  # every row's age long past

            def age(table: str, tenant: str | None, source: str | None) -> float:
                return 30 * DAY

            await store.partitions_maintain(
                "day", drop=(now, age, lambda table: 30 * DAY), before_drop=hook
            )
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    sys.exit(3)  # the kill never came
