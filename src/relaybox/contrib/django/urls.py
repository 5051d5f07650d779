"""``path("webhooks/", include("relaybox.contrib.django.urls"))``: ``POST
/webhooks/<source>`` for every source of the box."""

from django.urls import path
from relaybox.contrib.django.views import receive

app_name = "relaybox"

urlpatterns = [path("<str:source>", receive, name="receive")]
