"""The connections of one HTTP server (:mod:`relaybox.server`): how many are open, in
all and per client address (:func:`address_key`), and which one makes room when all
are open (:class:`Room`): one that lingers after a refusal, else the one that has
waited longest on its client."""

from __future__ import annotations

import ipaddress
import weakref
from typing import Any, Protocol

__all__ = ["Evictable", "Room", "address_key", "room_of"]


class Evictable(Protocol):
    """A connection the room may close to make room for another."""

    def _evict(self) -> None: ...


class Room:
    """What the connections of one server share: which of them wait on their client,
    in the order they began waiting (the first is the one to close when the server
    needs room), which linger after a refusal (closed first), and how many are open
    per client address.

    A connection waits on its client from its opening, and again from the end of each
    answer, until its request has fully arrived (head and body); the server's turn,
    from then until the answer is written, is never cut for room. Keeping the order
    costs a dict removal and insertion per request; choosing whom to close, one
    lookup.
    """

    __slots__ = ("closing", "lingering", "per_address", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[Evictable, None] = {}
        self.lingering: dict[Evictable, None] = {}
        self.per_address: dict[str, int] = {}
        self.closing = 0  # closed to make room, their connection_lost still to come

    def make_room(self) -> bool:
        """Close the connection that lingers longest after a refusal, or else the one
        that has waited longest on its client; ``False`` when none does."""
        for pool in (self.lingering, self.waiting):
            if pool:
                next(iter(pool))._evict()
                return True
        return False


_rooms: weakref.WeakKeyDictionary[Any, Room] = weakref.WeakKeyDictionary()


def room_of(server_state: Any) -> Room:
    """The room of the server whose state (uvicorn's ``ServerState``) this is."""
    room = _rooms.get(server_state)
    if room is None:
        room = _rooms[server_state] = Room()
    return room


def address_key(client: tuple[str, int] | None) -> str | None:
    """The address a client's connections are counted under: its IPv4 address, or the
    /64 network of an IPv6 one (one host or site usually has a whole /64, so counting
    single IPv6 addresses would cap nothing)."""
    if client is None:
        return None
    host = client[0]
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
