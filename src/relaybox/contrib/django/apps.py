from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class RelayboxConfig(AppConfig):
    """``INSTALLED_APPS += ["relaybox.contrib.django"]``: relaybox's tables by
    ``manage.py migrate``, its admin pages, ``manage.py relaybox …``, and the
    ``webhooks`` module of every installed app imported at start (where handlers
    registered on ``relaybox.contrib.django.box`` live)."""

    name = "relaybox.contrib.django"
    label = "relaybox"
    verbose_name = "relaybox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        autodiscover_modules("webhooks")
