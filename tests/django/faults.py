"""The box of a ``manage.py relaybox worker`` process that a fault test starts: the
test settings' relaybox options, the ``RELAYBOX_*`` environment over them (the fast
worker of tests/support/procs.py), and tests/support/faultapp.py's fault (``FAULT``:
SIGKILL in ``before_commit`` or ``after_commit``, once per ``FAULT_MARKER``; or
``poison``: the ``invoice.paid`` handler SIGKILLs its process for ``in_poison`` on
every attempt, and grants the others as the example does)."""

from __future__ import annotations

import os

from django.conf import settings

from relaybox import Context, Relaybox
from relaybox.config import Settings, load_settings
from relaybox.errors import ConfigurationError
from tests.support.faultapp import POISON_INVOICE, _die, _kill_once


def grant_unless_poison(ctx: Context) -> None:
    from examples.django_credits.credits.webhooks import grant_initial_credits

    if ctx.payload["data"]["object"].get("id") == POISON_INVOICE:
        _die()  # a segfault, an OOM kill: the handler never returns
    grant_initial_credits(ctx)


def make_box() -> Relaybox:
    box = Relaybox(settings=Settings.model_validate(settings.RELAYBOX_OPTIONS))
    box.configure(load_settings())
    fault = os.environ.get("FAULT", "")
    if fault == "kill_before_commit":
        box.hooks.before_commit.append(_kill_once)
    elif fault == "kill_after_commit":
        box.hooks.after_commit.append(_kill_once)
    elif fault == "poison":
        # Registered before the example's handlers (its webhooks module is imported
        # once this box exists): the first of equally specific registrations wins.
        box.handler("stripe", "invoice.paid")(grant_unless_poison)
    else:
        raise ConfigurationError(f"unknown FAULT {fault!r}")
    return box
