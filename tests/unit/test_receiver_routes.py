"""The receiver remembers which source a path names, for paths that name one only:
a client sending endless unknown paths cannot grow what it keeps, and a source
registered, replaced or removed later is seen at once."""

from __future__ import annotations

from typing import Any

from relaybox import Relaybox, Secret, sources
from relaybox.config import Settings
from relaybox.inbound.receiver import _ROUTES_KEPT

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def scope(path: str, root: str = "") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "root_path": root, "headers": []}


def test_paths_naming_no_source_are_not_kept_and_a_later_source_is_seen() -> None:
    # No database is opened: open() decides from the request line and headers.
    box = Relaybox(settings=Settings(database_url="sqlite+aiosqlite:////nonexistent/x.db"))
    std = box.source("std", sources.standard(secrets=[Secret(SECRET)]))
    receiver = box.receiver
    for i in range(3 * _ROUTES_KEPT):
        source, _, early = receiver.open(scope(f"/webhooks/nope-{i}"))
        assert source is None and early is not None and early[0] == 404
    assert receiver._names == {}

    for _ in range(2):  # the second time from what it kept
        source, _, early = receiver.open(scope("/hooks/webhooks/std", root="/hooks"))
        assert source is std and early is None
    assert receiver._names == {("/hooks", "/hooks/webhooks/std"): "std"}

    # Registered after a 404 on its path: found at once.
    assert receiver.open(scope("/late"))[2] is not None
    late = box.source("late", sources.standard(secrets=[Secret(SECRET)]))
    assert receiver.open(scope("/late"))[0] is late

    # Replaced, then removed: the registry decides, not what the receiver kept.
    other = box.source("std", sources.standard(secrets=[Secret(SECRET)]))
    assert receiver.open(scope("/hooks/webhooks/std", root="/hooks"))[0] is other
    del box.sources["std"]
    source, _, early = receiver.open(scope("/hooks/webhooks/std", root="/hooks"))
    assert source is None and early is not None and early[0] == 404


def test_what_it_keeps_is_bounded() -> None:
    box = Relaybox(settings=Settings(database_url="sqlite+aiosqlite:////nonexistent/x.db"))
    box.source("std", sources.standard(secrets=[Secret(SECRET)]))
    receiver = box.receiver
    for i in range(2 * _ROUTES_KEPT):  # one source under many mount points
        assert receiver.open(scope(f"/m{i}/std", root=f"/m{i}"))[2] is None
    assert len(receiver._names) == _ROUTES_KEPT
