"""The e-mail channel: SMTP through the standard library, in a worker thread.

In the credits example the confirmation e-mail of a credit grant is recorded in the outbox in the
grant's own transaction (``ctx.outbox.add("email", key, {...})``) and sent here after
COMMIT, never before. SMTP has no idempotency key, so every attempt of a row carries
the same ``Message-ID`` (derived from the outbox key): a resend after an uncertain
outcome is recognisably the same message. The default policy is ``resend``: a rare
duplicate confirmation is better than a lost one (a channel for high-impact mail can
pass ``uncertain="review"``).

The SMTP server is the operator's own configuration, not a tenant's, so the SSRF
guard does not apply.
"""

from __future__ import annotations

import asyncio
import hashlib
import smtplib
import ssl
from collections.abc import Callable, Mapping
from email.message import EmailMessage
from typing import Any, Unpack

from relaybox.outbound.channels.base import Channel, ChannelPolicy, Result
from relaybox.store.outbox_rows import Delivery

__all__ = ["EmailChannel", "render_message"]

Renderer = Callable[[Any], EmailMessage]


def render_message(payload: Any) -> EmailMessage:
    """The default rendering: ``{"to", "subject", "text"}`` plus optional ``"html"``,
    ``"from"``, ``"reply_to"``. Raises ``ValueError`` for anything else."""
    if not isinstance(payload, Mapping):
        raise ValueError("an e-mail payload is a JSON object")
    missing = [k for k in ("to", "subject", "text") if not payload.get(k)]
    if missing:
        raise ValueError(f"e-mail payload lacks {', '.join(missing)}")
    message = EmailMessage()
    to = payload["to"]
    message["To"] = ", ".join(to) if isinstance(to, list) else str(to)
    message["Subject"] = str(payload["subject"])
    if payload.get("from"):
        message["From"] = str(payload["from"])
    if payload.get("reply_to"):
        message["Reply-To"] = str(payload["reply_to"])
    message.set_content(str(payload["text"]))
    if payload.get("html"):
        message.add_alternative(str(payload["html"]), subtype="html")
    return message


class EmailChannel(Channel):
    """SMTP delivery. ``render`` turns the outbox payload into a message (default
    :func:`render_message`); ``sender`` fills ``From`` when the payload has none."""

    kind = "email"
    max_in_flight = 2

    def __init__(
        self,
        *,
        host: str,
        sender: str,
        port: int = 25,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = False,
        use_ssl: bool = False,
        timeout: float = 15.0,
        render: Renderer = render_message,
        **policy: Unpack[ChannelPolicy],
    ) -> None:
        super().__init__(**policy)
        self.host, self.port, self.sender = host, port, sender
        self.username, self._password = username, password
        self.starttls, self.use_ssl = starttls, use_ssl
        self.timeout = timeout
        self.render = render

    def __repr__(self) -> str:  # never print the password
        return f"EmailChannel(host={self.host!r}, port={self.port}, sender={self.sender!r})"

    async def deliver(self, delivery: Delivery) -> Result:
        try:
            message = self.render(delivery.payload)
        except (KeyError, TypeError, ValueError) as exc:
            return Result("failed", error=f"cannot render the e-mail: {exc}")
        if "From" not in message:
            message["From"] = self.sender
        digest = hashlib.sha256(delivery.key.encode()).hexdigest()[:40]
        message["Message-ID"] = f"<{digest}@relaybox>"
        timeout = min(self.timeout, delivery.deadline)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._send, message, timeout), timeout)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            permanent = all(code >= 500 for code in codes)
            return Result("failed" if permanent else "retry", error=f"recipients refused {codes}")
        except smtplib.SMTPResponseException as exc:
            raw = exc.smtp_error
            text = (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))[:300]
            return Result(
                "failed" if exc.smtp_code >= 500 else "retry",
                status_code=exc.smtp_code,
                error=f"SMTP {exc.smtp_code} {text}",
            )
        except TimeoutError:
            return Result("retry", error=f"SMTP timed out after {timeout:g} s", timed_out=True)
        except (smtplib.SMTPException, OSError) as exc:
            return Result("retry", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        return Result("sent", status_code=250)

    def _send(self, message: EmailMessage, timeout: float) -> None:
        context = ssl.create_default_context()
        smtp: smtplib.SMTP
        if self.use_ssl:
            smtp = smtplib.SMTP_SSL(self.host, self.port, timeout=timeout, context=context)
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=timeout)
        with smtp:
            if self.starttls:
                smtp.starttls(context=context)
            if self.username is not None and self._password is not None:
                smtp.login(self.username, self._password)
            smtp.send_message(message)
