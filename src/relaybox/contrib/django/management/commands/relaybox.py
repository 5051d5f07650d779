"""``manage.py relaybox <command> …``: relaybox's command line (``worker``,
``dispatch``, ``serve``, ``dead``, ``doctor``…) on the project's box, with Django's
settings loaded: handlers use the ORM, and relaybox uses Django's database."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Run a relaybox command (worker, dispatch, serve, dead, doctor…) on this project"

    def run_from_argv(self, argv: list[str]) -> None:
        from relaybox.cli import main

        # Every command's --app defaults to the box of settings.RELAYBOX.
        os.environ.setdefault("RELAYBOX_APP", "relaybox.contrib.django:box")
        main.main(args=argv[2:], prog_name=f"{os.path.basename(argv[0])} relaybox")

    def handle(self, *args: Any, **options: Any) -> None:  # call_command: use the argv path
        self.run_from_argv(["manage.py", "relaybox", *args])
