"""Django served for real on a free port: its ASGI application under uvicorn, in a
thread with its own event loop (pytest-django's ``live_server`` is the WSGI one)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def asgi_server() -> Iterator[str]:
    from django.core.asgi import get_asgi_application

    config = uvicorn.Config(
        get_asgi_application(), host="127.0.0.1", port=0, log_level="error", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def post(url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> Any:
    import httpx

    return httpx.request(method, url, content=body, headers=headers, timeout=60)
