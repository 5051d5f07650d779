"""A local fake of GitHub's webhook deliveries API (aiohttp.web on 127.0.0.1, port 0).

It plays both sides of a repository hook (and the App hook): it *delivers* events
to a receiver URL the way GitHub does (``X-Hub-Signature-256`` over the exact bytes,
``X-GitHub-Delivery`` guid, no retry when the receiver is down) and records each
attempt; and it serves the REST API that lists those attempts, in GitHub's shape:

- ``GET /repos/{owner}/{repo}/hooks/{hook_id}/deliveries`` (and
  ``/app/hook/deliveries``): newest first, ``per_page`` (≤ 100, default 30), cursor
  pagination through ``Link: <…&cursor=…>; rel="next"``; items ``id, guid,
  delivered_at, redelivery, duration, status, status_code, event, action,
  installation_id, repository_id``;
- ``GET …/deliveries/{id}``: the same plus ``request.headers``/``request.payload``
  and ``response``;
- ``POST …/deliveries/{id}/attempts``: 202, and the delivery is sent again with its
  guid (recorded as ``redelivery: true``) to the hook's URL as configured *now*
  (:attr:`FakeGitHub.hook_url`), as GitHub does.

Every API call needs ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["FakeGitHub"]


class FakeGitHub:
    def __init__(
        self,
        *,
        secret: str,
        token: str = "ghp_fake_token",
        owner: str = "octo-org",
        repo: str = "hello-world",
        hook_id: int = 42,
    ) -> None:
        self.secret = secret
        self.token = token
        self.owner, self.repo, self.hook_id = owner, repo, hook_id
        self.attempts: list[dict[str, Any]] = []  # oldest first, with "_body"/"_target"
        self.api_calls: list[str] = []
        self._ids = itertools.count(1000)
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self.url = ""
        self.hook_url = ""  # where the hook delivers; a test points it at a closed port

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> FakeGitHub:
        app = web.Application()
        for base in (
            f"/repos/{self.owner}/{self.repo}/hooks/{self.hook_id}/deliveries",
            "/app/hook/deliveries",
        ):
            app.router.add_get(base, self._list)
            app.router.add_get(base + "/{id}", self._get)
            app.router.add_post(base + "/{id}/attempts", self._redeliver)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # -- the delivering side ----------------------------------------------------------

    async def deliver(
        self,
        event: str,
        payload: dict[str, Any],
        target: str | None = None,
        *,
        guid: str | None = None,
        compact: bool = True,
        when: float | None = None,
    ) -> dict[str, Any]:
        """POST ``payload`` to ``target`` (default: :attr:`hook_url`) as GitHub would,
        once (GitHub never retries).
        ``compact=False`` sends JSON with spaces, so a re-serialisation of the API's
        payload no longer reproduces the signed bytes."""
        separators = (",", ":") if compact else (", ", ": ")
        body = json.dumps(payload, separators=separators).encode()
        return await self._attempt(
            event, payload, body, target or self.hook_url, guid or str(uuid.uuid4()), False, when
        )

    async def _attempt(
        self,
        event: str,
        payload: dict[str, Any],
        body: bytes,
        target: str,
        guid: str,
        redelivery: bool,
        when: float | None,
    ) -> dict[str, Any]:
        assert self._http is not None
        signature = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
        headers = {
            "Accept": "*/*",
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/fake",
            "X-GitHub-Delivery": guid,
            "X-GitHub-Event": event,
            "X-GitHub-Hook-ID": str(self.hook_id),
            "X-GitHub-Hook-Installation-Target-ID": "1296269",
            "X-GitHub-Hook-Installation-Target-Type": "repository",
            "X-Hub-Signature": "sha1=" + hmac.new(self.secret.encode(), body, "sha1").hexdigest(),
            "X-Hub-Signature-256": "sha256=" + signature,
        }
        started = time.monotonic()
        try:
            async with self._http.post(target, data=body, headers=headers) as response:
                code, status, answer = response.status, "OK", await response.text()
                if code >= 300:
                    status = "Invalid HTTP Response: " + str(code)
        except aiohttp.ClientConnectionError:
            code, status, answer = 502, "failed to connect", ""
        action = payload.get("action")
        record = {
            "id": next(self._ids),
            "guid": guid,
            "delivered_at": datetime.fromtimestamp(when or time.time(), tz=UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "redelivery": redelivery,
            "duration": round(time.monotonic() - started, 3),
            "status": status,
            "status_code": code,
            "event": event,
            "action": action if isinstance(action, str) else None,
            "installation_id": None,
            "repository_id": 1296269,
            "throttled_at": None,
            "_request": {"headers": headers, "payload": payload},
            "_response": {"headers": {}, "payload": answer},
            "_body": body,
            "_target": target,
        }
        self.attempts.append(record)
        return record

    # -- the API ----------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> None:
        self.api_calls.append(f"{request.method} {request.path_qs}")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            raise web.HTTPUnauthorized(
                text=json.dumps({"message": "Bad credentials"}), content_type="application/json"
            )

    @staticmethod
    def _public(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if not k.startswith("_")}

    def _find(self, request: web.Request) -> dict[str, Any]:
        wanted = request.match_info["id"]
        for record in self.attempts:
            if str(record["id"]) == wanted:
                return record
        raise web.HTTPNotFound(
            text=json.dumps({"message": "Not Found"}), content_type="application/json"
        )

    async def _list(self, request: web.Request) -> web.Response:
        self._authorized(request)
        per_page = min(int(request.query.get("per_page", "30")), 100)
        newest_first = sorted(self.attempts, key=lambda r: r["id"], reverse=True)
        cursor = request.query.get("cursor")
        if cursor is not None:
            below = int(cursor.removeprefix("v1_"))
            newest_first = [r for r in newest_first if r["id"] < below]
        page = newest_first[:per_page]
        headers = {}
        if len(newest_first) > per_page:
            nxt = request.url.with_query(per_page=str(per_page), cursor=f"v1_{page[-1]['id']}")
            headers["Link"] = f'<{nxt}>; rel="next"'
        return web.json_response([self._public(r) for r in page], headers=headers)

    async def _get(self, request: web.Request) -> web.Response:
        self._authorized(request)
        record = self._find(request)
        detail = self._public(record)
        detail["url"] = record["_target"]
        detail["request"] = record["_request"]
        detail["response"] = record["_response"]
        return web.json_response(detail)

    async def _redeliver(self, request: web.Request) -> web.Response:
        self._authorized(request)
        record = self._find(request)
        await self._attempt(
            record["event"],
            record["_request"]["payload"],
            record["_body"],
            self.hook_url or record["_target"],
            record["guid"],
            True,
            None,
        )
        return web.json_response({}, status=202)
