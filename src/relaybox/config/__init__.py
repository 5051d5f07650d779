"""Settings: defaults → a TOML file → ``RELAYBOX_*`` environment variables → validation.

Nested settings are reached from the environment with a double underscore:
``RELAYBOX_WORKER__CONCURRENCY=16``, ``RELAYBOX_RETENTION__PAYLOAD_MAX_AGE=604800``.
Sources that need no code are declared in the file under ``[sources.NAME]`` (see
``relaybox.example.toml``). Every problem is reported at once, named by its path, so an
operator fixes a broken configuration in one go instead of one error per restart.
"""

from __future__ import annotations

from relaybox.config.loading import load_settings, merge_settings
from relaybox.config.settings import (
    BACKGROUND_ROLES,
    KEYS_AGE_MIN,
    MAX_RETENTION_NAME,
    MAX_RETENTION_SCOPES,
    RETENTION_AGE_MAX,
    RETENTION_AGE_MIN,
    AdminSettings,
    BodySettings,
    RetentionSettings,
    ServerSettings,
    Settings,
    SourceRetention,
    TenantRetention,
    WorkerSettings,
)
from relaybox.config.silence import SilenceSettings

__all__ = [
    "BACKGROUND_ROLES",
    "KEYS_AGE_MIN",
    "MAX_RETENTION_NAME",
    "MAX_RETENTION_SCOPES",
    "RETENTION_AGE_MAX",
    "RETENTION_AGE_MIN",
    "AdminSettings",
    "BodySettings",
    "RetentionSettings",
    "ServerSettings",
    "Settings",
    "SilenceSettings",
    "SourceRetention",
    "TenantRetention",
    "WorkerSettings",
    "load_settings",
    "merge_settings",
]
