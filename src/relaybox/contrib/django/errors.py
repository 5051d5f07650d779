"""The contrib app's one exception: Django's ``ImproperlyConfigured`` (what a Django
project expects from a settings mistake) that is also a relaybox
``ConfigurationError``."""

from __future__ import annotations

from django.core import exceptions

from relaybox.errors import ConfigurationError

__all__ = ["ImproperlyConfigured"]


class ImproperlyConfigured(ConfigurationError, exceptions.ImproperlyConfigured):
    """relaybox in this Django project cannot work as configured (settings, a
    database relaybox does not run on). ``publish()`` outside ``atomic()`` raises
    :class:`relaybox.errors.NotInTransaction` instead: a call's mistake, not the
    settings'."""
