"""A stand-in for a customer's webhook endpoint, for the examples: it answers every
POST with 204 and prints one line per delivery (the path, its ``webhook-id`` and event
type), so you can watch relaybox deliver. A real endpoint verifies the signature with
the secret ``relaybox endpoints create`` printed (docs/sending.md shows how)::

    python -m examples.receiver --port 9000
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["main"]

_MAX_BODY = 1 << 20


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = min(int(self.headers.get("content-length") or 0), _MAX_BODY)
        body = self.rfile.read(length)
        try:
            kind = json.loads(body).get("type")
        except (ValueError, AttributeError):
            kind = None
        webhook_id = self.headers.get("webhook-id")
        print(f"POST {self.path} webhook-id={webhook_id} type={kind}", flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # one line per delivery
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="print the webhooks POSTed to this port")
    parser.add_argument("--port", type=int, default=9000)
    port = parser.parse_args(argv).port
    server = ThreadingHTTPServer(("127.0.0.1", port), _Hook)
    print(f"receiving webhooks on http://127.0.0.1:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
