"""The SSRF guard refuses internal destinations before any connection, and the
client connects only to the addresses the guard checked (no DNS rebinding)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from relaybox.outbound.channels.http import HttpClient
from relaybox.outbound.ssrf import Guard, UnsafeDestination
from tests.support.receivers import HttpReceiver

REFUSED_LITERALS = [
    "https://127.0.0.1/",
    "https://127.255.0.9/",
    "https://10.0.0.5/",
    "https://172.16.3.4/",
    "https://192.168.1.1/",
    "https://169.254.169.254/latest/meta-data/",  # cloud metadata
    "https://100.64.0.1/",  # carrier-grade NAT
    "https://0.0.0.0/",
    "https://224.0.0.1/",
    "https://[::1]/",
    "https://[::]/",
    "https://[fc00::1]/",
    "https://[fd12:3456::1]/",
    "https://[fe80::1]/",
    "https://[fec0::1]/",
    "https://[::ffff:127.0.0.1]/",  # IPv4-mapped
    "https://[::ffff:169.254.169.254]/",
    "https://[::ffff:8.8.8.8]/",  # mapped at all: no legitimate use
    "https://[::127.0.0.1]/",  # IPv4-compatible
    "https://[2002:a00:1::]/",  # 6to4 embedding 10.0.0.1
    "https://[64:ff9b::a9fe:a9fe]/",  # NAT64 embedding 169.254.169.254
    "https://2130706433/",  # decimal 127.0.0.1
    "https://0177.0.0.1/",  # octal
    "https://0x7f.0.0.1/",  # hex
    "https://0x7f000001/",
    "https://127.1/",  # short form
    "https://017700000001/",  # octal, one part
    "https://3232235777/",  # decimal 192.168.1.1
]


@pytest.mark.parametrize("url", REFUSED_LITERALS)
async def test_every_internal_address_form_is_refused(url: str) -> None:
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["93.184.215.14"]

    with pytest.raises(UnsafeDestination):
        await Guard(resolver=resolver).check(url)
    assert calls == []  # refused from the URL alone, before any DNS


@pytest.mark.parametrize(
    ("answer", "refused"),
    [
        (["10.1.2.3"], True),
        (["93.184.215.14", "127.0.0.1"], True),  # any internal address refuses all
        (["2606:2800:220:1::1", "fe80::1"], True),
        (["93.184.215.14"], False),
        (["2606:2800:220:1::1"], False),
    ],
)
async def test_hostnames_are_resolved_and_every_address_checked(
    answer: list[str], refused: bool
) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return answer

    guard = Guard(resolver=resolver)
    if refused:
        with pytest.raises(UnsafeDestination):
            await guard.check("https://hooks.example.com/x")
    else:
        vetted = await guard.check("https://hooks.example.com/x")
        assert vetted.addresses == tuple(answer) and vetted.port == 443


async def test_a_host_rebinding_from_public_to_private_is_refused() -> None:
    """The answer is kept for ``dns_ttl`` seconds (one lookup serves the deliveries
    meanwhile); the next answer is checked again and refused."""
    answers = [["93.184.215.14"], ["169.254.169.254"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers.pop(0)

    guard = Guard(resolver=rebinding)
    now = [1000.0]
    guard.clock = lambda: now[0]
    first = await guard.check("https://rebind.example/x")
    assert first.addresses == ("93.184.215.14",)
    again = await guard.check("https://rebind.example/other")
    assert again.addresses == ("93.184.215.14",) and asked == ["rebind.example"]
    now[0] += guard.dns_ttl
    with pytest.raises(UnsafeDestination):
        await guard.check("https://rebind.example/x")
    assert asked == ["rebind.example", "rebind.example"]


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.com/x",  # https required
        "ftp://hooks.example.com/x",
        "https://user:pw@hooks.example.com/x",
        "/relative",
        "https:///nohost",
    ],
)
def test_static_rules(url: str) -> None:
    with pytest.raises(UnsafeDestination):
        Guard().check_static(url)


def test_plain_http_needs_the_development_flag_and_loopback() -> None:
    dev = Guard(allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
    dev.check_static("http://127.0.0.1:8080/x")
    with pytest.raises(UnsafeDestination):
        Guard(allow_networks=["127.0.0.0/8"]).check_static("http://127.0.0.1:8080/x")
    with pytest.raises(UnsafeDestination):  # the flag alone does not open loopback
        Guard(allow_insecure_loopback=True).check_static("http://127.0.0.1:8080/x")
    with pytest.raises(UnsafeDestination):  # plain http to a non-loopback address: never
        Guard(allow_insecure_loopback=True, allow_networks=["10.0.0.0/8"]).check_static(
            "http://10.0.0.1/x"
        )


async def test_the_allow_list_lets_chosen_networks_through() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["10.20.30.40"]

    guard = Guard(allow_networks=["10.20.0.0/16"], resolver=resolver)
    assert (await guard.check("https://partner.internal/x")).addresses == ("10.20.30.40",)
    with pytest.raises(UnsafeDestination):
        await guard.check("https://10.21.0.1/x")


@pytest.fixture
async def listener() -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP listener on 127.0.0.1 counting connections."""
    accepted: list[int] = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], accepted
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.1", "[::ffff:127.0.0.1]", "localhost"]
)
async def test_the_client_refuses_before_connecting(
    listener: tuple[int, list[int]], host: str
) -> None:
    port, accepted = listener
    client = HttpClient(Guard(allow_insecure_loopback=True), connect_timeout=1, response_bytes=100)
    try:
        result = await client.post(f"http://{host}:{port}/x", b"{}", {}, seconds=1)
    finally:
        await client.close()
    assert result.outcome == "blocked" and "SSRF" in (result.error or "")
    assert accepted == []


async def test_the_client_connects_to_the_checked_address_only() -> None:
    """The name resolves to loopback (allowed) once, then would rebind to the metadata
    address: the connection uses the checked answer and DNS is asked exactly once."""
    answers = [["127.0.0.1"], ["169.254.169.254"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers.pop(0)

    guard = Guard(
        allow_insecure_loopback=True,
        allow_networks=["127.0.0.0/8"],
        resolver=rebinding,
        dns_ttl=0,  # every delivery asks DNS: the second answer is the rebinding one
    )
    client = HttpClient(guard, connect_timeout=1, response_bytes=100)
    async with HttpReceiver() as receiver:
        try:
            first = await client.post(
                f"http://rebind.test:{receiver.port}/hook", b"{}", {}, seconds=2
            )
            second = await client.post(
                f"http://rebind.test:{receiver.port}/hook", b"{}", {}, seconds=2
            )
        finally:
            await client.close()
        assert first.outcome == "sent" and len(receiver.requests) == 1
        assert second.outcome == "blocked" and "SSRF" in (second.error or "")
        assert receiver.requests[0].headers["host"] == f"rebind.test:{receiver.port}"
    assert asked == ["rebind.test", "rebind.test"]


async def test_a_failed_lookup_is_not_kept() -> None:
    answers: list[list[str]] = [[], ["93.184.215.14"]]

    async def flaky(host: str, port: int) -> list[str]:
        return answers.pop(0)

    guard = Guard(resolver=flaky)
    with pytest.raises(OSError, match="did not resolve"):
        await guard.check("https://flaky.example/x")
    vetted = await guard.check("https://flaky.example/x")
    assert vetted.addresses == ("93.184.215.14",) and answers == []


async def test_a_refusal_names_the_setting_that_changes_it() -> None:
    """As the secrets_key error does: the operator reads what to set, not only "no"."""
    with pytest.raises(UnsafeDestination) as http:
        Guard().check_static("http://127.0.0.1:9000/hook")
    assert str(http.value).startswith("https is required: plain http goes to loopback")
    assert "outbound.allow_insecure_loopback" in str(http.value)
    assert "RELAYBOX_OUTBOUND__ALLOW_INSECURE_LOOPBACK" in str(http.value)
    assert "relaybox serve --dev" in str(http.value)

    for url in ("http://127.0.0.1:9000/hook", "https://10.0.0.5/hook"):
        with pytest.raises(UnsafeDestination) as address:
            await Guard(allow_insecure_loopback=True).check(url)
        assert " resolves to a " in str(address.value)
        assert "outbound.allow_networks" in str(address.value), url
        assert "RELAYBOX_OUTBOUND__ALLOW_NETWORKS" in str(address.value), url
    allowed = Guard(allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
    assert (await allowed.check("http://127.0.0.1:9000/hook")).addresses == ("127.0.0.1",)
