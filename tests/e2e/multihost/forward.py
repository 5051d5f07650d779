"""``python -m tests.e2e.multihost.forward LISTEN_PORT TARGET_HOST TARGET_PORT``, run in
a host's namespace: that host's ``127.0.0.1:LISTEN_PORT`` reaches a receiver on the
test's namespace, so endpoints may use plain ``http://127.0.0.1`` (the SSRF guard lets
plain http through to loopback only) and every host delivers to the same receiver."""

from __future__ import annotations

import asyncio
import sys

from tests.support.proxy import TcpProxy


async def main(listen_port: int, host: str, port: int) -> None:
    proxy = TcpProxy(host=host, port=port, listen="127.0.0.1")
    proxy.port = listen_port
    await proxy.start()
    print(f"forwarding 127.0.0.1:{listen_port} -> {host}:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
