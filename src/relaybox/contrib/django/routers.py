"""``DATABASE_ROUTERS = ["relaybox.contrib.django.routers.RelayboxRouter"]``: in a
project with several databases, the admin's models of relaybox's tables read the
database relaybox runs on (``settings.RELAYBOX_DATABASE``)."""

from __future__ import annotations

from typing import Any


class RelayboxRouter:
    def _alias(self, model: Any) -> str | None:
        if model._meta.app_label != "relaybox":
            return None
        from relaybox.contrib.django.alias import database_alias

        return database_alias()

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)
