"""Integrations of relaybox with web frameworks (``relaybox.contrib.django``)."""
