"""Django settings of tests/django: the credits example's app on two databases,
SQLite (``default``, a file: relaybox's worker opens it too) and PostgreSQL
(``postgres``, on the suite's server). A test picks one with the ``alias`` fixture:
relaybox (``RELAYBOX_DATABASE``) and the example's models (:class:`Router`) follow."""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from sqlalchemy.engine import make_url

_pg = make_url(os.environ["RELAYBOX_TEST_DATABASE_URL"])
_tmp = tempfile.mkdtemp(prefix="relaybox-django-")

SECRET_KEY = "relaybox-django-tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
STATIC_URL = "static/"
ROOT_URLCONF = "tests.django.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "relaybox.contrib.django",
    "examples.django_credits.credits",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES: dict[str, Any] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_tmp, "app.db"),
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        "TEST": {"NAME": os.path.join(_tmp, "test.db")},
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _pg.database or "postgres",
        "USER": _pg.username or "",
        "PASSWORD": _pg.password or "",
        # The embedded server's URL names its socket directory in the query.
        "HOST": _pg.host or str(_pg.query.get("host", "")),
        "PORT": str(_pg.port or _pg.query.get("port", "")),
        # Unique per run: engineers share the server.
        "TEST": {"NAME": f"relaybox_django_{uuid.uuid4().hex[:10]}"},
    },
}
DATABASE_ROUTERS = [
    "relaybox.contrib.django.routers.RelayboxRouter",
    "tests.django.settings.Router",
]

STRIPE_SECRET = "whsec_django_tests"
ACCOUNT = "acct_django"
WORKSPACE = "ws_django"
RELAYBOX_OPTIONS: dict[str, Any] = {
    "sources": {
        "stripe": {
            "provider": "stripe",
            "secrets": [{"value": STRIPE_SECRET, "account": ACCOUNT, "tenant": WORKSPACE}],
        }
    },
    "outbound": {
        "secrets_key": os.environ.get("RELAYBOX_TEST_SECRETS_KEY", ""),
        "allow_insecure_loopback": True,
        "allow_networks": ["127.0.0.0/8"],
        "jitter": 0.0,
    },
    "worker": {"backoff_base": 0.2, "backoff_jitter": 0.0, "poll_interval": 0.1},
    "log_level": "warning",
}
# A worker process started by a test (tests/django/test_faults.py) is told the test
# database and the fault to inject through its environment.
RELAYBOX: Any = "tests.django.faults.make_box" if os.environ.get("FAULT") else RELAYBOX_OPTIONS
RELAYBOX_DATABASE = os.environ.get("DJANGO_TEST_ALIAS", "default")
if os.environ.get("DJANGO_TEST_DB_NAME"):
    DATABASES[RELAYBOX_DATABASE]["NAME"] = os.environ["DJANGO_TEST_DB_NAME"]


class Router:
    """The example's models live on the database the test chose (RELAYBOX_DATABASE)."""

    def _alias(self, model: Any) -> str | None:
        from django.conf import settings

        return settings.RELAYBOX_DATABASE if model._meta.app_label == "credits" else None

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model)
