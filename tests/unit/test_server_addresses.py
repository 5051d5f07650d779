"""Which address ``relaybox serve`` counts a client's connections under
(``server.max_connections_per_address``)."""

from __future__ import annotations

from relaybox.connections import address_key


def test_ipv4_addresses_are_counted_one_by_one() -> None:
    assert address_key(("203.0.113.7", 50000)) == "203.0.113.7"
    assert address_key(("203.0.113.8", 50000)) != address_key(("203.0.113.7", 1))


def test_ipv6_addresses_are_counted_per_64() -> None:
    """One host or site usually holds a whole /64: counting single addresses would let
    it open a cap's worth from each of its 2**64."""
    one = address_key(("2001:db8:1:2::1", 1))
    assert one == "2001:db8:1:2::/64"
    assert address_key(("2001:db8:1:2:ffff:ffff:ffff:ffff", 2)) == one
    assert address_key(("2001:db8:1:3::1", 1)) != one
    assert address_key(("fe80::1%eth0", 1)) == "fe80::/64"


def test_an_ipv4_mapped_address_is_its_ipv4_address() -> None:
    assert address_key(("::ffff:203.0.113.7", 1)) == "203.0.113.7"


def test_no_peer_address_is_not_counted() -> None:
    assert address_key(None) is None
