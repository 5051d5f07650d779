"""The SSRF guard: a tenant's URL must not reach relaybox's own network.

A tenant chooses where relaybox sends requests, so an endpoint URL is an attacker's
probe into the network relaybox runs in (cloud metadata at 169.254.169.254, an admin
port on localhost, a database on 10.0.0.5). Before every connection the guard:

1. requires ``https`` (plain ``http`` only to loopback with the development flag);
2. refuses IPv4 written in any non-canonical form (``2130706433``, ``0177.0.0.1``,
   ``0x7f.1``, ``127.1``): resolvers read them as addresses, and no legitimate URL
   needs them;
3. resolves the host and refuses it if *any* address is not globally routable:
   loopback, private, link-local (metadata), CGNAT 100.64/10, multicast, reserved,
   ``::1``, ``fc00::/7``, ``fe80::/10``, site-local, IPv4-mapped and -compatible IPv6,
   and 6to4 / NAT64 addresses that embed such an IPv4 address;
4. returns the checked addresses. The HTTP client then connects to exactly those
   (see :class:`relaybox.outbound.channels.http.VettedResolver`): a second DNS answer
   (DNS rebinding) is never asked for.

A host's DNS answer is kept ``dns_ttl`` seconds (30 by default; ``getaddrinfo`` gives
no TTL) and checked again at every use: deliveries to one endpoint do not each wait
for a lookup in a thread, and a name that starts resolving to a forbidden address is
refused once its kept answer expires.

``allow_networks`` (CIDR) lets chosen addresses through, e.g. a partner on a private
link, or ``127.0.0.0/8`` in tests. The resolver is injectable for tests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import yarl

from relaybox.errors import RelayboxError

__all__ = [
    "ALLOW_NETWORKS_HINT",
    "INSECURE_LOOPBACK_HINT",
    "Guard",
    "IPAddress",
    "Resolver",
    "UnsafeDestination",
    "Vetted",
    "forbidden_reason",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port) -> addresses``; raises ``OSError`` when the name does not resolve."""

INSECURE_LOOPBACK_HINT = (
    ": plain http goes to loopback addresses only, in development (set"
    " outbound.allow_insecure_loopback = true, RELAYBOX_OUTBOUND__ALLOW_INSECURE_LOOPBACK=1,"
    " or run `relaybox serve --dev`)"
)
"""What a refused ``http://`` URL's message adds: the setting that allows it."""
ALLOW_NETWORKS_HINT = (
    ": to deliver there, add its network to outbound.allow_networks"
    """ (RELAYBOX_OUTBOUND__ALLOW_NETWORKS='["127.0.0.0/8"]' for loopback;"""
    " `relaybox serve --dev` allows loopback)"
)
"""What a refused address's message adds: the setting that lets it through."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_LITERAL_CACHE = 4096
_DNS_CACHE = 4096
_NUMERIC_PART = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)


class UnsafeDestination(RelayboxError):
    """A URL that relaybox refuses to connect to; the message names the reason and
    never the resolved internal address beyond what the URL already showed."""


@dataclass(frozen=True, slots=True)
class Vetted:
    """A destination that passed the guard: connect to ``addresses`` only."""

    url: str
    host: str
    port: int
    addresses: tuple[str, ...]
    parsed: yarl.URL | None = None
    """``url`` parsed (the HTTP client takes it as it is: no second parse per request)."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _looks_numeric_ipv4(host: str) -> bool:
    parts = host.split(".")
    return 1 <= len(parts) <= 4 and all(_NUMERIC_PART.fullmatch(p) for p in parts)


def _ip_literal(host: str) -> IPAddress | None:
    """The address a host names literally; raises for non-canonical IPv4 forms."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _looks_numeric_ipv4(host.rstrip(".")):
        raise UnsafeDestination(f"host {host!r} is an IPv4 address in a non-canonical form")
    return None


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be reached, or ``None`` when it is globally routable."""
    if isinstance(ip, ipaddress.IPv6Address):
        # ::1 and :: lie in ::/96 too: name them for what they are.
        if ip.is_loopback:
            return "a loopback address"
        if ip.is_unspecified:
            return "the unspecified address"
        if ip.ipv4_mapped is not None:
            return "an IPv4-mapped IPv6 address"
        if ip in _V4_COMPATIBLE:
            return "an IPv4-compatible IPv6 address"
        if ip.is_site_local:
            return "a site-local address"
        embedded = ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and forbidden_reason(embedded):
            return "an IPv6 address embedding a non-global IPv4 address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (cloud metadata lives here)"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT:
        return "a carrier-grade NAT address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return "a private or reserved address"
    return None


class Guard:
    """Checks URLs and resolves hosts; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        allow_networks: Iterable[str] = (),
        allow_insecure_loopback: bool = False,
        resolver: Resolver | None = None,
        dns_ttl: float = 30.0,
    ) -> None:
        self.resolver: Resolver = system_resolver
        self.dns_ttl = dns_ttl
        self.clock: Callable[[], float] = time.monotonic
        self.configure(
            allow_networks=allow_networks,
            allow_insecure_loopback=allow_insecure_loopback,
            resolver=resolver,
        )

    def configure(
        self,
        *,
        allow_networks: Iterable[str],
        allow_insecure_loopback: bool,
        resolver: Resolver | None = None,
    ) -> None:
        """Change the rules in place (clients holding this guard see the change)."""
        self.allow_networks = tuple(ipaddress.ip_network(n, strict=False) for n in allow_networks)
        self.allow_insecure_loopback = allow_insecure_loopback
        if resolver is not None:
            self.resolver = resolver
        # URLs naming an address literally, already vetted under these rules: their
        # answer depends on the URL and the rules only (no DNS), so the check before
        # each delivery is a lookup. New rules, a new cache.
        self._literal: dict[str, Vetted] = {}
        # (host, port) -> (when the answer expires, the resolver's answer).
        self._answers: dict[tuple[str, int], tuple[float, list[str]]] = {}
        # URLs naming a host, vetted under these rules with a kept answer: url ->
        # (when that answer expires, the verdict). The verdict depends on the URL, the
        # rules and the answer only, so until the answer expires it is a lookup.
        self._named: dict[str, tuple[float, Vetted]] = {}

    def allowed(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.allow_networks)

    def _check_address(self, ip: IPAddress, host: str) -> None:
        if self.allowed(ip):
            return
        reason = forbidden_reason(ip)
        if reason:
            raise UnsafeDestination(f"{host} resolves to {reason}{ALLOW_NETWORKS_HINT}")

    def check_static(self, url: str) -> tuple[yarl.URL, IPAddress | None]:
        """The checks that need no DNS: scheme, credentials, host, literal addresses.
        Used when an endpoint is created, and again before every delivery."""
        try:
            parsed = yarl.URL(url)
        except (ValueError, TypeError):
            raise UnsafeDestination("not a valid URL") from None
        scheme, host = parsed.scheme.lower(), parsed.raw_host
        if scheme not in ("https", "http") or not host or not parsed.is_absolute():
            raise UnsafeDestination("an endpoint URL must be an absolute https:// URL")
        if parsed.user is not None or parsed.password is not None:
            raise UnsafeDestination("credentials in the URL are not allowed; use a secret")
        if scheme == "http" and not self.allow_insecure_loopback:
            raise UnsafeDestination(f"https is required{INSECURE_LOOPBACK_HINT}")
        literal = _ip_literal(host)
        if literal is not None:
            self._check_address(literal, host)
            if scheme == "http" and not literal.is_loopback:
                raise UnsafeDestination("plain http is allowed to loopback addresses only")
        return parsed, literal

    async def check(self, url: str) -> Vetted:
        """Everything, including DNS; returns the addresses to connect to."""
        vetted = self._literal.get(url)
        if vetted is not None:
            return vetted
        named = self._named.get(url)
        if named is not None and named[0] > self.clock():
            return named[1]
        parsed, literal = self.check_static(url)
        host = str(parsed.raw_host)
        port = parsed.explicit_port or (443 if parsed.scheme == "https" else 80)
        if literal is not None:
            if len(self._literal) >= _LITERAL_CACHE:
                self._literal.clear()
            vetted = self._literal[url] = Vetted(url, host, port, (str(literal),), parsed)
            return vetted
        expires, found = await self._resolve(host, port)
        addresses: list[str] = []
        for text in found:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
            self._check_address(ip, host)
            if parsed.scheme == "http" and not ip.is_loopback:
                raise UnsafeDestination("plain http is allowed to loopback addresses only")
            addresses.append(str(ip))
        vetted = Vetted(url, host, port, tuple(addresses), parsed)
        if expires is not None:
            if len(self._named) >= _LITERAL_CACHE:
                self._named.clear()
            self._named[url] = (expires, vetted)
        return vetted

    async def _resolve(self, host: str, port: int) -> tuple[float | None, list[str]]:
        """The resolver's answer, kept ``dns_ttl`` seconds (failures are not kept),
        and when it expires (``None``: not kept)."""
        now = self.clock()
        kept = self._answers.get((host, port))
        if kept is not None and kept[0] > now:
            return kept
        found = await self.resolver(host, port)
        if not found:
            raise OSError(f"{host} did not resolve")
        if self.dns_ttl <= 0:
            return None, found
        if len(self._answers) >= _DNS_CACHE:
            self._answers.clear()
        kept = self._answers[(host, port)] = (now + self.dns_ttl, found)
        return kept
