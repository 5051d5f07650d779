"""Settings of the Django credits example (development values: see README.md)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-credits-example-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "relaybox.contrib.django",
    "credits",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "django_credits.urls"
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
WSGI_APPLICATION = "django_credits.wsgi.application"
ASGI_APPLICATION = "django_credits.asgi.application"
STATIC_URL = "static/"
USE_TZ = True

# SQLite (db.sqlite3 here, or DATABASE_URL=sqlite:////path/to/file.db), or
# DATABASE_URL=postgresql://user:password@host:port/name for PostgreSQL.
_url = os.environ.get("DATABASE_URL", "")
if _url.startswith("postgresql://"):
    from urllib.parse import unquote, urlsplit

    _parts = urlsplit(_url)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _parts.path.lstrip("/"),
            "USER": unquote(_parts.username or ""),
            "PASSWORD": unquote(_parts.password or ""),
            "HOST": _parts.hostname or "",
            "PORT": str(_parts.port or ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _url.removeprefix("sqlite:///") or BASE_DIR / "db.sqlite3",
            # One writer at a time: wait for it rather than fail at once.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }

# relaybox: the Stripe endpoint's signing secret, and which verified account is
# which workspace (the tenant comes from configuration, never from the payload).
RELAYBOX = {
    "sources": {
        "stripe": {
            "provider": "stripe",
            "secrets": [
                {
                    "value": os.environ.get("CREDITS_STRIPE_SECRET", "whsec_credits_dev_secret"),
                    "account": "acct_credits_dev",
                    "tenant": "ws_dev",
                }
            ],
        }
    },
    "outbound": {"secrets_key": os.environ.get("RELAYBOX_SECRETS_KEY", "")},
}
