"""The box of a ``manage.py relaybox worker`` process that a fault test starts: the
test settings' relaybox options, the ``RELAYBOX_*`` environment over them (the fast
worker of tests/support/procs.py), and tests/support/faultapp.py's fault (``FAULT``:
SIGKILL in ``before_commit`` or ``after_commit``, once per ``FAULT_MARKER``)."""

from __future__ import annotations

import os

from django.conf import settings

from relaybox import Relaybox
from relaybox.config import Settings, load_settings
from relaybox.errors import ConfigurationError
from tests.support.faultapp import _kill_once


def make_box() -> Relaybox:
    box = Relaybox(settings=Settings.model_validate(settings.RELAYBOX_OPTIONS))
    box.configure(load_settings())
    fault = os.environ.get("FAULT", "")
    if fault == "kill_before_commit":
        box.hooks.before_commit.append(_kill_once)
    elif fault == "kill_after_commit":
        box.hooks.after_commit.append(_kill_once)
    else:
        raise ConfigurationError(f"unknown FAULT {fault!r}")
    return box
